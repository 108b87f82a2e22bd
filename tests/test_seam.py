"""The seam between the core and what is built on it.

Every module outside ``paddle_amp_scaler/core`` reaches the core through public names
and Paddle's contract names (``PADDLE_CONTRACT``) only, never an underscore name the core
defines (a face may override ``SUBCLASS_HOOKS``), and imports only the core modules listed
for it, read here from the modules' source; and both scalers share one constructor
signature, each shown with its own defaults.
"""

import ast
import inspect
import pathlib

import pytest

import paddle_amp_scaler
from paddle_amp_scaler import AmpScaler, GradScaler
from paddle_amp_scaler.core import scaler as core_scaler

PACKAGE = pathlib.Path(paddle_amp_scaler.__file__).parent
DOCS = PACKAGE.parent / "docs"


def outside_the_core():
    return sorted(
        path for path in PACKAGE.rglob("*.py") if "core" not in path.relative_to(PACKAGE).parts
    )


def underscore_names_the_core_defines():
    """Every underscore name a core module defines: its functions, classes, constants and
    their members, and the attributes its methods set (dunders left out)."""
    names = set()
    for path in (PACKAGE / "core").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


# Paddle's names: its trainers and wrappers use them, and so may a face.
ALLOWED = set(core_scaler.PADDLE_CONTRACT)


def reaches_past_the_seam(source):
    """(line, name) of every use of an underscore name the core defines that the seam does
    not allow, by name: ``anything._loss_scale`` counts, whoever ``anything`` is, and so
    does an import of one. A face's own definition of a subclass hook is no use of it."""
    private = underscore_names_the_core_defines() - ALLOWED
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in private:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name in private]
    return found


@pytest.mark.parametrize("path", outside_the_core(), ids=lambda path: str(path.name))
def test_modules_outside_the_core_use_only_the_seam(path):
    assert reaches_past_the_seam(path.read_text()) == []


# The core modules that code outside the core may import, and why; docs/architecture.md
# lists the same ("What a face may use"). The rest of the core is the scaler's own.
CORE_MODULES_FOR_FACES = {
    "scaler": "AmpScaler and GradScaler",
    "kernels": "scale and unscale out of place, a dtype's name: what faces share",
    "optimizers": "an optimizer's parameters, and the TypeError for what is no optimizer",
    "validation": "the shared argument checks, one message each, and FLOAT16_MAX",
    "state_dict": "parse_state_dict: a saved dict checked before anything loads",
    "rules": "IntervalRule and Memory: MindSpore's managers run the rule on the host",
    "monitoring": "ScalerStats and LossScaleStuckError",
    "reports": "the reports' entries and the readings (UnderflowReading, Measured for inspect)",
}


def core_modules_imported(source):
    """The core modules a module outside the core imports (``from ..core.x import``,
    ``from ..core import x``, ``from paddle_amp_scaler.core.x import``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        parts = node.module.split(".")
        if "core" not in parts:
            continue
        below = parts[parts.index("core") + 1 :]
        found |= {below[0]} if below else {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("path", outside_the_core(), ids=lambda path: str(path.name))
def test_modules_outside_the_core_import_only_the_listed_core_modules(path):
    assert core_modules_imported(path.read_text()) <= set(CORE_MODULES_FOR_FACES)


def test_the_import_check_finds_a_planted_import():
    planted = "from ..core import kernels, loss_scale\nfrom ..core.headroom import NEVER\n"
    assert core_modules_imported(planted) == {"kernels", "loss_scale", "headroom"}


def test_the_core_modules_faces_may_use_are_documented():
    architecture = (DOCS / "architecture.md").read_text()
    for name in CORE_MODULES_FOR_FACES:
        assert f"`core/{name}.py`" in architecture, name


def test_the_check_finds_a_planted_access():
    planted = "def show(scaler):\n    return scaler._rule.incr_ratio, scaler._scale\n"
    planted += "from ..core.rules import _MeasuredIteration\n"
    assert sorted(reaches_past_the_seam(planted)) == [(2, "_rule"), (3, "_MeasuredIteration")]


def test_the_modules_checked_include_every_face_and_helper():
    names = {path.relative_to(PACKAGE).as_posix() for path in outside_the_core()}
    expected = {"compat/torch.py", "compat/mindspore.py", "compat/keras.py"}
    expected |= {"integrations.py", "install.py"}
    expected |= {f"checkpoint/{name}.py" for name in CHECKPOINT_MODULES}
    expected |= {f"cli/{name}.py" for name in ("__init__", "doctor", "inspection", "report")}
    assert expected <= names


CHECKPOINT_MODULES = ("__init__", "file_format")


def test_every_allowed_name_and_hook_is_a_member_and_documented():
    members = set(dir(GradScaler)) | set(vars(GradScaler()))
    assert members >= ALLOWED | set(core_scaler.SUBCLASS_HOOKS)
    architecture = (DOCS / "architecture.md").read_text()
    for name in ALLOWED | set(core_scaler.SUBCLASS_HOOKS) | set(FACE_INTERFACE):
        assert f"`{name}" in architecture, name
    for name in (*core_scaler.SUBCLASS_HOOKS, *FACE_INTERFACE):
        assert getattr(GradScaler, name).__doc__, f"{name} has no docstring"


# What the faces need of the core beyond Paddle's API: public, each documented.
FACE_INTERFACE = ("step_optimizer", "end_iteration", "set_backoff_divisor")


def test_both_scalers_share_one_constructor_with_their_own_defaults():
    amp, grad = inspect.signature(AmpScaler), inspect.signature(GradScaler)
    assert list(amp.parameters) == list(grad.parameters)
    differ = {
        name: (amp.parameters[name].default, grad.parameters[name].default)
        for name in amp.parameters
        if amp.parameters[name].default != grad.parameters[name].default
    }
    # Paddle's defaults: AmpScaler's, then GradScaler's.
    assert differ == {"init_loss_scaling": (2.0**15, 2.0**16), "incr_every_n_steps": (1000, 2000)}
    for name in amp.parameters:
        assert amp.parameters[name].kind == grad.parameters[name].kind
        assert amp.parameters[name].annotation == grad.parameters[name].annotation
    # GradScaler writes its signature out and forwards every argument: built with a value
    # other than the default for each (but use_dynamic_loss_scaling, which a policy
    # refuses to be fixed with: below), both scalers end up alike.
    arguments = dict(
        enable=True,
        init_loss_scaling=64.0,
        incr_ratio=3.0,
        decr_ratio=0.25,
        incr_every_n_steps=7,
        decr_every_n_nan_or_inf=2,
        use_dynamic_loss_scaling=True,
        policy="headroom",
        min_loss_scaling=2.0,
        max_loss_scaling=2.0**20,
        place="cpu",
        stuck_after=5,
        on_stuck="raise",
        report_overflows=True,
        measure_every=3,
        group=None,  # a group needs a distributed run
        sync_found_inf=False,
    )
    assert set(arguments) == set(amp.parameters)
    built = [kind(**arguments) for kind in (AmpScaler, GradScaler)]
    assert repr(built[0]).replace("AmpScaler", "GradScaler") == repr(built[1])
    saved = [scaler.state_dict() for scaler in built]
    assert saved[0].pop("scale") == saved[1].pop("scale") and saved[0] == saved[1]
    assert "measure_every=3" in repr(built[1])
    assert not GradScaler(use_dynamic_loss_scaling=False).is_use_dynamic_loss_scaling()
    # And it is what GradScaler() does with no arguments.
    scaler = GradScaler()
    assert (scaler.get_loss_scaling(), scaler.get_incr_every_n_steps()) == (2.0**16, 2000)
    assert "init_loss_scaling: 'float' = 65536.0" in str(inspect.signature(GradScaler.__init__))
