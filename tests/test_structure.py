"""How the package is built, read from its source and from a traced step: who imports
whom, short functions, an optimizer's step written only by its owner, no state at module
level, each rule written once, one verdict type, the path from ``minimize`` to each
kernel, and no test instrument shipped to users."""

import ast
import collections
import dataclasses
import inspect
import pathlib
import sys

import paddle
import pytest

import paddle_amp_scaler
import paddle_amp_scaler.testing
from paddle_amp_scaler import GradScaler
from paddle_amp_scaler.core import loss_scale, rules, step

PACKAGE = pathlib.Path(paddle_amp_scaler.__file__).parent
CORE = PACKAGE / "core"
CORE_MODULES = sorted(path for path in CORE.glob("*.py") if path.name != "__init__.py")
# A function past this many lines does several things; split it where its steps part.
LONGEST_FUNCTION = 60


def package_files():
    return sorted(PACKAGE.rglob("*.py"))


# -- Who imports whom ------------------------------------------------------------------


def core_imports(source):
    """The core modules a core module imports when it runs (``from . import x``,
    ``from .x import y``), leaving out those made for type annotations only."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    return found


def core_import_graph():
    return {path.stem: core_imports(path.read_text()) for path in CORE_MODULES}


def test_the_core_imports_form_layers_with_the_scaler_on_top():
    graph = core_import_graph()
    # The modules everything stands on import no other.
    for base in ("kernels", "pickling", "validation"):
        assert graph[base] == set(), base
    # Nothing in the core imports the conductor; no module imports one that imports it.
    assert not [module for module, imported in graph.items() if "scaler" in imported]

    def reachable(start, seen=()):
        for module in graph[start]:
            if module not in seen:
                seen = reachable(module, (*seen, module))
        return seen

    for module in graph:
        assert module not in reachable(module), f"{module} imports itself through others"


def test_the_core_imports_no_face_and_no_helper():
    for path in CORE_MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                pytest.fail(f"{path.name} imports {node.module} from outside the core")


def test_the_import_check_sees_runtime_imports_only():
    planted = (
        "from . import kernels, optimizers\nfrom .rules import Rule\n"
        "if TYPE_CHECKING:\n    from .scaler import AmpScaler\n"
    )
    assert core_imports(planted) == {"kernels", "optimizers", "rules"}


# -- Short functions -------------------------------------------------------------------


def long_functions(source, longest=LONGEST_FUNCTION):
    """(name, lines) of each function longer than ``longest`` lines, its docstring in."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > longest
    ]


@pytest.mark.parametrize("path", package_files(), ids=lambda path: path.name)
def test_no_function_is_longer_than_sixty_lines(path):
    assert long_functions(path.read_text()) == []


def test_the_length_check_finds_a_long_function():
    planted = "def long():\n" + "    x = 1\n" * 60 + "\ndef short():\n    return 1\n"
    assert long_functions(planted) == [("long", 61)]


# -- An optimizer's step, written by its owner only ------------------------------------

STEP_FIELDS = {"stage", "verdict", "params", "groups", "checked"}


def fields_written_outside(source, owner, fields):
    """(line, field) of each assignment to ``anything.field`` outside the class ``owner``."""
    tree = ast.parse(source)
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == owner:
            inside |= {id(child) for child in ast.walk(node)}
    written = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and part.attr in fields
                    and id(part) not in inside
                ):
                    written.append((part.lineno, part.attr))
    return written


def test_the_step_is_written_by_its_owner_only():
    assert set(vars(step.OptimizerStep)) >= STEP_FIELDS, "the fields the check looks for"
    for path in package_files():
        assert fields_written_outside(path.read_text(), "OptimizerStep", STEP_FIELDS) == [], path


def test_the_ownership_check_finds_a_planted_write():
    planted = (
        "class OptimizerStep:\n    def run(self):\n        self.stage = 2\n"
        "def conduct(step):\n    step.verdict, other = None, 1\n"
    )
    assert fields_written_outside(planted, "OptimizerStep", STEP_FIELDS) == [(5, "verdict")]


# -- State, rules, verdicts ------------------------------------------------------------


def mutable_module_state(source):
    """(line, name) of each module-level name that starts as an empty container (where a
    cache or a registry grows), and of each function or class decorated as a cache. A
    table written out in full is a constant, not state."""
    found = []
    tree = ast.parse(source)
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        empty = isinstance(value, (ast.Dict, ast.Set, ast.List)) and not (
            getattr(value, "keys", None) or getattr(value, "elts", None)
        )
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            empty |= value.func.id in ("dict", "set", "list", "defaultdict") and not value.args
        found += [(node.lineno, ast.unparse(target)) for target in targets if empty]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:
                if "cache" in ast.unparse(decorator):
                    found.append((node.lineno, node.name))
    return found


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda path: path.name)
def test_no_core_module_keeps_state_or_caches_at_module_level(path):
    # What a rule needs lives on the rule or its memory; what a scaler needs, on it.
    assert mutable_module_state(path.read_text()) == []


def test_the_check_finds_planted_module_state():
    planted = "import functools\n_made = {}\nseen: set[type] = set()\nKEYS = {'a': 1}\n"
    planted += "@functools.cache\ndef numbers(rule):\n    return rule\n"
    assert [name for _, name in mutable_module_state(planted)] == ["_made", "seen", "numbers"]


def test_the_rules_share_a_small_base_and_neither_inherits_the_other():
    assert issubclass(rules.IntervalRule, rules.Rule)
    assert issubclass(rules.HeadroomRule, rules.Rule)
    assert not issubclass(rules.HeadroomRule, rules.IntervalRule)


def test_the_headroom_rule_is_written_once_with_its_tuning_as_documented_fields():
    rule = rules.HeadroomRule
    assert not hasattr(rule, "adjust"), "a second, pure form of the headroom rule"
    shared = {field.name for field in dataclasses.fields(rules.Rule)}
    tuning = [field.name for field in dataclasses.fields(rule) if field.name not in shared]
    assert tuning, "the tuning values are fields of the rule"
    documented = inspect.getdoc(rule)
    for name in tuning:
        assert f"{name}:" in documented, f"{name} is not documented in HeadroomRule's Args"
    # No tuning value left as a module constant for others to import.
    defined = [
        ast.unparse(target)
        for node in ast.parse(pathlib.Path(rules.__file__).read_text()).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ]
    assert [name for name in defined if name.isupper()] == ["NEVER", "RULES"], defined


def classes_named(name):
    return [
        (path.name, node.lineno)
        for path in package_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == name
    ]


def test_one_verdict_type_carries_found_inf_from_the_unscale_to_the_update():
    assert [module for module, _ in classes_named("Verdict")] == ["step.py"]
    update = inspect.signature(loss_scale.LossScale.update)
    assert list(update.parameters) == ["self", "verdict", "iteration"]
    assert update.parameters["verdict"].annotation in ("Verdict", step.Verdict)


def test_the_counters_place_is_one_named_choice():
    # Where the counters are current is an enum, not a None crossed with a flag.
    assert {place.name for place in loss_scale.Counters} == {"BOTH", "HOST", "DEVICE"}
    scale = loss_scale.LossScale(rules.IntervalRule(), 8.0, "cpu")
    assert scale.counters_at is loss_scale.Counters.BOTH
    scale.set_counters(3, 0)
    assert scale.counters_at is loss_scale.Counters.HOST and scale.counters() == (3, 0)


def test_the_package_ships_no_test_instrument():
    # The counters patch paddle.Tensor and read stack frames: the tests' own.
    assert not hasattr(paddle_amp_scaler.testing, "HostReadCounter")
    assert not hasattr(paddle_amp_scaler.testing, "OperationCounter")
    for path in package_files():
        source = path.read_text()
        assert "unittest" not in source and "_getframe" not in source, path.name


# -- The path of one minimize, traced --------------------------------------------------


class Trace:
    """Each call into the package's core while it runs, and the package frames on the
    stack at each call of a kernel of Paddle's that is asked for."""

    def __init__(self, kernels):
        self.kernels = kernels
        self.calls = []  # (caller's module, callee's module, callee's name)
        self.stacks = collections.defaultdict(list)  # kernel -> [package frames]

    @staticmethod
    def module_of(frame):
        path = pathlib.Path(frame.f_code.co_filename)
        return path.stem if path.parent == CORE else None

    def __call__(self, frame, event, argument):
        if event == "call":
            callee, caller = self.module_of(frame), frame.f_back and self.module_of(frame.f_back)
            if callee is not None:
                self.calls.append((caller, callee, frame.f_code.co_name))
        elif event == "c_call" and getattr(argument, "__name__", None) in self.kernels:
            names, walking = [], frame
            while walking is not None:
                if self.module_of(walking) is not None:
                    names.append(f"{self.module_of(walking)}.{walking.f_code.co_name}")
                walking = walking.f_back
            self.stacks[argument.__name__].append(names[::-1])

    def run(self, work):
        sys.setprofile(self)
        try:
            work()
        finally:
            sys.setprofile(None)

    def round_trips(self):
        """Calls from the scaler into each other core module (each comes back to it)."""
        return collections.Counter(
            callee for caller, callee, _ in self.calls if caller == "scaler" and callee != caller
        )


def frames_below(stack, name):
    """The package frames from ``name`` (a ``module.function``) to the kernel, both ends in."""
    return stack[stack.index(name) :]


@pytest.fixture
def traced_minimize():
    """One minimize with AdamW, at an iteration where the rule acts (it grows every
    finite iteration), so that the update kernel runs as well as the unscale."""
    paddle.seed(0)
    model = paddle.nn.Linear(8, 8)
    optimizer = paddle.optimizer.AdamW(parameters=model.parameters())
    scaler = paddle_amp_scaler.AmpScaler(init_loss_scaling=2.0**10, incr_every_n_steps=1)

    def iteration(trace=None):
        scaled = scaler.scale(model(paddle.randn([4, 8])).mean())
        scaled.backward()
        if trace is None:
            scaler.minimize(optimizer, scaled)
        else:
            trace.run(lambda: scaler.minimize(optimizer, scaled))
        optimizer.clear_grad()

    iteration()  # the first iteration makes what later ones reuse
    trace = Trace({"check_finite_and_unscale_", "update_loss_scaling_"})
    iteration(trace)
    return trace


def test_a_traced_minimize_reaches_each_kernel_in_few_frames(traced_minimize):
    (unscale,) = traced_minimize.stacks["check_finite_and_unscale_"]
    (update,) = traced_minimize.stacks["update_loss_scaling_"]
    assert len(frames_below(unscale, "scaler.minimize")) <= 4, unscale
    assert len(frames_below(update, "scaler.end_iteration")) <= 4, update


def test_a_traced_minimize_goes_from_the_scaler_to_each_module_at_most_three_times(
    traced_minimize,
):
    trips = traced_minimize.round_trips()
    assert trips and max(trips.values()) <= 3, traced_minimize.calls


def test_the_trace_sees_a_planted_detour(traced_minimize):
    # The same iteration, with the step's unscale reached through two more frames.
    original = step.OptimizerStep.unscale

    def detour(self, *args):
        return again(self, *args)

    def again(self, *args):
        return original(self, *args)

    detour.__code__ = detour.__code__.replace(co_filename=step.__file__)
    again.__code__ = again.__code__.replace(co_filename=step.__file__)
    step.OptimizerStep.unscale = detour
    try:
        paddle.seed(0)
        model = paddle.nn.Linear(4, 4)
        optimizer = paddle.optimizer.SGD(parameters=model.parameters())
        scaler = GradScaler()
        scaled = scaler.scale(model(paddle.randn([2, 4])).mean())
        scaled.backward()
        trace = Trace({"check_finite_and_unscale_"})
        trace.run(lambda: scaler.minimize(optimizer, scaled))
    finally:
        step.OptimizerStep.unscale = original
    (unscale,) = trace.stacks["check_finite_and_unscale_"]
    assert len(frames_below(unscale, "scaler.minimize")) > 4, unscale
