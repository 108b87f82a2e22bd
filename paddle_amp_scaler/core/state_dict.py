"""The formats of a scaler's ``state_dict``: Paddle's (which this package writes, with a
few more keys that Paddle's own ``load_state_dict`` ignores) and PyTorch's, each read into
one record checked whole before anything is loaded, so that a bad dict changes nothing.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import paddle

from . import validation
from .monitoring import ScalerStats, parse_stats_state
from .reports import Measured
from .rules import RULES, IntervalRule, Memory, Rule, rule_named
from .validation import FLOAT32_MAX


@dataclasses.dataclass(frozen=True)
class SavedScaler:
    """Everything a scaler's ``state_dict`` holds, as plain Python values, Paddle's first."""

    scale: float
    incr_ratio: float
    decr_ratio: float
    incr_every_n_steps: int
    decr_every_n_nan_or_inf: int
    incr_count: int
    decr_count: int
    use_dynamic_loss_scaling: bool
    # Not in Paddle's or PyTorch's dicts: None there, and the scaler keeps its own.
    bounds: tuple[float, float | None] | None = None
    stats: ScalerStats | None = None
    # The latest run of iterations whose loss was non-finite (0 where not saved).
    nonfinite_streak: int = 0
    # The rule's name, and its memory beyond the scale and counters (the headroom
    # policy's); without them (Paddle's, PyTorch's) the scaler's rule starts afresh.
    policy: str | None = None
    memory: dict[str, Any] | None = None
    # What the measured iterations found, at the saved scale, where there is anything.
    measured: Measured | None = None

    def rule_over(self, current: Rule) -> Rule:
        """The rule this record describes, for a scaler under ``current``: of the saved
        type where the dict names one (a ``UserWarning`` where that differs: a resume
        continues the run it saved), with the saved settings, and bounds where saved.
        """
        rule_type = type(current) if self.policy is None else RULES[self.policy]
        lower, upper = self.bounds or (current.min_scale, current.max_scale)

        # What the current rule holds beyond the saved settings (measure_every, the
        # tuning), where it is of the same type; else the saved type's defaults.
        kept = dataclasses.asdict(current)
        if rule_type is not type(current):
            kept = {}
            warnings.warn(
                f"the state dict was saved under policy={self.policy!r}; this scaler was "
                f"built with policy={current.name!r} and follows the dict, so that the "
                f"run continues as it was saved. Build the scaler with "
                f"policy={self.policy!r} to load it without this warning",
                UserWarning,
                stacklevel=3,
            )

        settings = ("incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf")
        saved = {key: getattr(self, key) for key in settings}
        return rule_type(**{**kept, **saved, "min_scale": lower, "max_scale": upper})

    def scale_within(self, lower: float, upper: float | None) -> float:
        """The saved scale, clamped into the bounds, with a warning if that changed it."""
        clamped = max(self.scale, lower) if upper is None else min(max(self.scale, lower), upper)
        if clamped != self.scale:
            warnings.warn(
                f"the loaded scale {self.scale!r} lies outside min_loss_scaling={lower!r} and "
                f"max_loss_scaling={upper!r}; it is clamped to {clamped!r}",
                UserWarning,
                stacklevel=4,
            )

        return clamped

    def memory_at(self, rule: Rule, scale: float) -> Memory:
        """The saved memory for ``rule``, at ``scale``; afresh where the dict has none."""
        return rule.memory_type(
            np.float32(scale), self.incr_count, self.decr_count, **(self.memory or {})
        )


def saved_state(
    rule: Rule, memory: Memory, stats: dict[str, int], dynamic: bool, measured: Measured
) -> dict[str, Any]:
    """The state dict of a scaler under ``rule`` with ``memory``, the run's ``stats`` (as
    ``RunStatistics.state`` gives them) and what was ``measured`` (at the scale saved):
    Paddle's keys, then this package's.
    """
    state: dict[str, Any] = {
        "scale": np.array([memory.scale], dtype=np.float32),
        "incr_ratio": rule.incr_ratio,
        "decr_ratio": rule.decr_ratio,
        "incr_every_n_steps": rule.incr_every_n_steps,
        "decr_every_n_nan_or_inf": rule.decr_every_n_nan_or_inf,
        "incr_count": memory.incr_count,
        "decr_count": memory.decr_count,
        "use_dynamic_loss_scaling": dynamic,
        "min_loss_scaling": rule.min_scale,
        "max_loss_scaling": rule.max_scale,
        "stats": stats,
    }

    if any(measured):
        counts = {key: int(getattr(measured, key)) for key in ("subnormal", "nonzero")}
        state["measured"] = {**measured._asdict(), **counts}

    state["policy"] = rule.name
    if rule.state_key is not None:
        state[rule.state_key] = rule.memory_to_state(memory)

    return state


# The keys of Paddle's own format, all required: SavedScaler's first eight fields.
PADDLE_KEYS = tuple(field.name for field in dataclasses.fields(SavedScaler)[:8])

# PyTorch's GradScaler keys, by the Paddle key they mean. PyTorch has no decrease
# period (it backs off on every overflow) and is always dynamic.
_TORCH_TO_PADDLE = {
    "scale": "scale",
    "growth_factor": "incr_ratio",
    "backoff_factor": "decr_ratio",
    "growth_interval": "incr_every_n_steps",
    "_growth_tracker": "incr_count",
}
_TORCH_IMPLIED = {"decr_every_n_nan_or_inf": 1, "decr_count": 0, "use_dynamic_loss_scaling": True}


def parse_state_dict(state_dict: Mapping[str, Any]) -> SavedScaler:
    """Validate a Paddle-format or PyTorch-format state dict, unknown keys ignored:
    ``ValueError`` naming the (source) key for a missing key or a bad value.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    try:
        return _parsed(state_dict)
    except TypeError as error:
        # In a saved dict a value of the wrong kind is a bad value of its key.
        raise ValueError(str(error)) from None


def _parsed(state_dict: Mapping[str, Any]) -> SavedScaler:
    # Each of our keys by the key it has in the dict's format: PyTorch's, or Paddle's.
    if "growth_factor" in state_dict:
        source_key = {ours: theirs for theirs, ours in _TORCH_TO_PADDLE.items()}
        values: dict[str, Any] = dict(_TORCH_IMPLIED)
    else:
        source_key = {key: key for key in PADDLE_KEYS}
        values = {}
    for ours, theirs in source_key.items():
        if theirs not in state_dict:
            raise ValueError(f"state_dict is missing the key {theirs!r}")
        values[ours] = state_dict[theirs]

    # Errors name the key as the dict has it.
    def checked(key: str, check: Callable[..., Any], *args: Any) -> Any:
        return check(values[key], f"state_dict[{source_key.get(key, key)!r}]", *args)

    incr_period = checked("incr_every_n_steps", validation.check_period)
    decr_period = checked("decr_every_n_nan_or_inf", validation.check_period)

    # The rule it was saved under, and what that rule remembers beyond the counters.
    policy = None
    if "policy" in state_dict:
        policy = rule_named(state_dict["policy"], "state_dict['policy']").name
    for key in (rule.state_key for rule in RULES.values() if rule.state_key):
        if policy is None and key in state_dict:
            raise ValueError(f"state_dict has {key!r} but is missing the key 'policy'")

    rule = RULES[policy or IntervalRule.name]
    # A rule that does not grow by the counters counts finite iterations past the period.
    incr_limit = rule(incr_every_n_steps=incr_period).incr_count_limit
    memory = None
    if rule.state_key is not None:
        name = f"state_dict[{rule.state_key!r}]"
        memory = rule.memory_from_state(state_dict.get(rule.state_key), name)

    stats, nonfinite_streak = None, 0
    if "stats" in state_dict:
        stats, nonfinite_streak = parse_stats_state(state_dict["stats"])

    return SavedScaler(
        scale=checked("scale", _check_scale_value),
        incr_ratio=checked("incr_ratio", validation.check_incr_ratio),
        decr_ratio=checked("decr_ratio", validation.check_decr_ratio),
        incr_every_n_steps=incr_period,
        decr_every_n_nan_or_inf=decr_period,
        incr_count=checked("incr_count", validation.check_count, incr_limit, "incr_every_n_steps"),
        decr_count=checked(
            "decr_count", validation.check_count, decr_period, "decr_every_n_nan_or_inf"
        ),
        use_dynamic_loss_scaling=checked("use_dynamic_loss_scaling", validation.check_bool),
        bounds=_bounds_in(state_dict),
        stats=stats,
        nonfinite_streak=nonfinite_streak,
        policy=policy,
        memory=memory,
        measured=_measured_in(state_dict),
    )


# What ``measured`` holds: ``Measured``'s fields. A dict saved before the window has the
# first three only, and the window then starts at its last measured iteration.
_COUNTED_KEYS = ("subnormal", "nonzero")


def _measured_in(state_dict: Mapping[str, Any]) -> Measured | None:
    if "measured" not in state_dict:
        return None
    value, name = state_dict["measured"], "state_dict['measured']"
    if not (isinstance(value, Mapping) and set(value) == {"amax", *_COUNTED_KEYS}):
        validation.check_keys(value, name, Measured._fields)

    numbers = {
        key: float(validation.check_int_within(value[key], f"{name}[{key!r}]", 0, 2**63 - 1))
        if key in _COUNTED_KEYS
        else validation.check_number_within(value[key], f"{name}[{key!r}]", 0, FLOAT32_MAX)
        for key in value
    }
    windowless = {"subnormal_window": numbers["subnormal"], "nonzero_window": numbers["nonzero"]}
    return Measured(**{**windowless, **numbers})


def _bounds_in(state_dict: Mapping[str, Any]) -> tuple[float, float | None] | None:
    present = [key for key in _BOUND_KEYS if key in state_dict]
    if not present:
        return None
    if len(present) == 1:
        missing = next(key for key in _BOUND_KEYS if key not in present)
        raise ValueError(f"state_dict has {present[0]!r} but is missing the key {missing!r}")
    names = [f"state_dict[{key!r}]" for key in _BOUND_KEYS]
    return validation.check_bounds(*(state_dict[key] for key in _BOUND_KEYS), *names)


_BOUND_KEYS = ("min_loss_scaling", "max_loss_scaling")


def _check_scale_value(value: Any, name: str) -> float:
    """A scale saved as a float, a 0-d or one-element array, or a Paddle tensor."""
    if isinstance(value, paddle.Tensor):
        value = value.numpy()
    if isinstance(value, (np.ndarray, np.generic)):
        if value.size != 1 or value.dtype.kind not in "fiu":
            raise TypeError(
                f"{name} must hold one number, got an array of dtype "
                f"{value.dtype} and shape {list(value.shape)}"
            )
        value = value.reshape(()).item()
    return validation.check_scale(value, name)
