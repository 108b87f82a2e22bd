"""The module paths of release 0.2, when the package was flat, kept importable.

``paddle_amp_scaler.kernels.unscale_paths()``, ``paddle_amp_scaler.rule.adjust`` and
``paddle_amp_scaler.distributed.rank_zero_only`` were documented there; each old path
now names the module that holds its code (or, where one module became two, a module
that looks a name up in both).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# Old module name: the modules that now hold what it held, first looked up first.
MOVED = {
    "rule": ("core.rule",),
    "scaler": ("core.scaler",),
    "kernels": ("core.unscale_paths", "core.kernels"),
    "state": ("core.accessors", "core.state_dict"),
    "statistics": ("core.statistics", "core.stuck"),
    "distributed": ("core.distributed",),
    "optimizers": ("core.optimizers",),
    "skipping": ("core.skipping",),
    "overflow_report": ("core.overflow_report",),
    "pickling": ("core.pickling",),
    "validation": ("core.validation",),
    "fused_cpu": ("core.fused_cpu",),
    "loss_scale_optimizer": ("compat.keras",),
}


def register(package: types.ModuleType) -> None:
    """Make every old path of ``package`` importable, and an attribute of it."""
    for old, new in MOVED.items():
        modules = [importlib.import_module(f"{package.__name__}.{name}") for name in new]
        name = f"{package.__name__}.{old}"
        module = modules[0] if len(modules) == 1 else _joined(name, modules)
        sys.modules[name] = module
        setattr(package, old, module)


def _joined(name: str, modules: list[types.ModuleType]) -> types.ModuleType:
    joined = types.ModuleType(name, f"Kept for old imports: the names of {_names(modules)}.")

    def lookup(attribute: str) -> Any:
        for module in modules:
            if hasattr(module, attribute):
                return getattr(module, attribute)
        raise AttributeError(f"module {name!r} (now {_names(modules)}) has no {attribute!r}")

    joined.__getattr__ = lookup  # type: ignore[method-assign]
    return joined


def _names(modules: list[types.ModuleType]) -> str:
    return " and ".join(module.__name__ for module in modules)
