"""How the core is written, read from its source: each rule's step once, no state at
module level, rules that share by a small base, one verdict type, a core of few rooms,
and no test instrument shipped to users."""

import ast
import dataclasses
import inspect
import pathlib

import pytest

import paddle_amp_scaler
import paddle_amp_scaler.testing
from paddle_amp_scaler.core import headroom, interval, loss_scale, optimizers

PACKAGE = pathlib.Path(paddle_amp_scaler.__file__).parent
CORE = PACKAGE / "core"
CORE_MODULES = sorted(path for path in CORE.glob("*.py") if path.name != "__init__.py")


def test_the_core_has_at_most_twelve_modules():
    assert len(CORE_MODULES) <= 12, [path.name for path in CORE_MODULES]


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
    assert issubclass(interval.IntervalRule, interval.Rule)
    assert issubclass(headroom.HeadroomRule, interval.Rule)
    assert not issubclass(headroom.HeadroomRule, interval.IntervalRule)


def test_the_headroom_rule_is_written_once_with_its_tuning_as_documented_fields():
    rule = headroom.HeadroomRule
    assert not hasattr(rule, "adjust"), "a second, pure form of the headroom rule"
    shared = {field.name for field in dataclasses.fields(interval.Rule)}
    tuning = [field.name for field in dataclasses.fields(rule) if field.name not in shared]
    assert tuning, "the tuning values are fields of the rule"
    documented = inspect.getdoc(rule)
    for name in tuning:
        assert f"{name}:" in documented, f"{name} is not documented in HeadroomRule's Args"
    # No tuning value left as a module constant for others to import.
    defined = [
        ast.unparse(target)
        for node in ast.parse(pathlib.Path(headroom.__file__).read_text()).body
        if isinstance(node, ast.Assign)
        for target in node.targets
    ]
    assert [name for name in defined if name.isupper()] == ["NEVER"], defined


def classes_named(name):
    return [
        (path.name, node.lineno)
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == name
    ]


def test_one_verdict_type_carries_found_inf_from_the_unscale_to_the_update():
    assert [module for module, _ in classes_named("Verdict")] == ["optimizers.py"]
    advance = inspect.signature(loss_scale.LossScale.advance)
    assert list(advance.parameters) == ["self", "verdict", "iteration"]
    assert advance.parameters["verdict"].annotation in ("Verdict", optimizers.Verdict)


def test_the_package_ships_no_test_instrument():
    # The counters patch paddle.Tensor and read stack frames: the tests' own.
    assert not hasattr(paddle_amp_scaler.testing, "HostReadCounter")
    assert not hasattr(paddle_amp_scaler.testing, "OperationCounter")
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text()
        assert "unittest" not in source and "_getframe" not in source, path.name


def lines_in(folder):
    return sum(len(path.read_text().splitlines()) for path in folder.rglob("*.py"))


def test_the_package_and_its_core_stay_within_their_sizes():
    # Issue 39's figures: a feature pays for its lines by removing others.
    assert lines_in(PACKAGE) <= 6000
    assert lines_in(CORE) <= 2800
