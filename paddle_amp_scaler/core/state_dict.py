"""The formats of a scaler's ``state_dict``, read into one validated record.

Two formats: Paddle's (which this package also writes, with a few more keys, so that
Paddle's own ``GradScaler.load_state_dict`` takes it) and PyTorch's. Either is checked
whole before anything is loaded, so that a bad dict changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import paddle

from . import rule, validation
from .statistics import ScalerStats, parse_stats_state


@dataclasses.dataclass(frozen=True)
class SavedScaler:
    """Everything a scaler's ``state_dict`` holds, as plain Python values."""

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
    # Written for the headroom policy only, with its memory (HEADROOM_KEYS); a dict
    # without them keeps the scaler's policy, and its memory starts afresh.
    policy: str | None = None
    headroom: dict[str, Any] | None = None

    def to_paddle_dict(self) -> dict[str, Any]:
        fields = {key: getattr(self, key) for key in PADDLE_KEYS}
        fields["scale"] = np.array([self.scale], dtype=np.float32)
        if self.bounds is not None:
            fields["min_loss_scaling"], fields["max_loss_scaling"] = self.bounds
        if self.stats is not None:
            fields["stats"] = self.stats.to_state()
        if self.policy is not None and self.policy != "interval":
            fields["policy"] = self.policy
            fields["headroom"] = dict(self.headroom or {})
        return fields


# The keys of Paddle's own format, all required.
PADDLE_KEYS = (
    "scale",
    "incr_ratio",
    "decr_ratio",
    "incr_every_n_steps",
    "decr_every_n_nan_or_inf",
    "incr_count",
    "decr_count",
    "use_dynamic_loss_scaling",
)

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
    """Validate a Paddle-format or PyTorch-format state dict; unknown keys are ignored.

    Raises ``ValueError`` naming the (source) key for a missing key or a bad value.
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
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

    def checked(key: str, check: Callable[..., Any], *args: Any) -> Any:
        name = f"state_dict[{source_key.get(key, key)!r}]"
        try:
            return check(values[key], name, *args)
        except (TypeError, ValueError) as error:
            raise ValueError(str(error)) from None

    incr_every_n_steps = checked("incr_every_n_steps", validation.check_period)
    decr_every_n_nan_or_inf = checked("decr_every_n_nan_or_inf", validation.check_period)
    policy = _policy_in(state_dict)
    # The headroom policy counts finite iterations past the period between two looks.
    counted_up_to = _INT32_MAX if policy == "headroom" else incr_every_n_steps
    return SavedScaler(
        scale=checked("scale", _check_scale_value),
        incr_ratio=checked("incr_ratio", validation.check_incr_ratio),
        decr_ratio=checked("decr_ratio", validation.check_decr_ratio),
        incr_every_n_steps=incr_every_n_steps,
        decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
        incr_count=checked(
            "incr_count", validation.check_count, counted_up_to, "incr_every_n_steps"
        ),
        decr_count=checked(
            "decr_count", validation.check_count, decr_every_n_nan_or_inf, "decr_every_n_nan_or_inf"
        ),
        use_dynamic_loss_scaling=checked("use_dynamic_loss_scaling", validation.check_bool),
        bounds=_bounds_in(state_dict),
        stats=(
            parse_stats_state(state_dict["stats"], "state_dict['stats']")
            if "stats" in state_dict
            else None
        ),
        policy=policy,
        headroom=_headroom_in(state_dict),
    )


# The headroom policy's memory in a state dict (rule.LossScaleState's fields).
HEADROOM_KEYS = ("margin", "margin_at", "anchor", "grown_at", "amax")
_INT32_MAX = 2**31 - 1


def _policy_in(state_dict: Mapping[str, Any]) -> str | None:
    if "policy" not in state_dict:
        if "headroom" in state_dict:
            raise ValueError("state_dict has 'headroom' but is missing the key 'policy'")
        return None
    try:
        return validation.check_policy(state_dict["policy"], "state_dict['policy']")
    except TypeError as error:
        raise ValueError(str(error)) from None


def _headroom_in(state_dict: Mapping[str, Any]) -> dict[str, Any] | None:
    if state_dict.get("policy") != "headroom":
        return None
    memory = state_dict.get("headroom")
    name = "state_dict['headroom']"
    if not isinstance(memory, Mapping) or set(memory) != set(HEADROOM_KEYS):
        raise ValueError(f"{name} must be a dict with the keys {sorted(HEADROOM_KEYS)}")
    margin, margin_at, grown_at = memory["margin"], memory["margin_at"], memory["grown_at"]
    for key, value in (("margin", margin), ("margin_at", margin_at), ("grown_at", grown_at)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name}[{key!r}] must be an int, got {value!r}")
    if not rule.MIN_MARGIN <= margin <= rule.MAX_MARGIN:
        raise ValueError(
            f"{name}['margin'] must lie within {rule.MIN_MARGIN} and {rule.MAX_MARGIN}, "
            f"got {margin!r}"
        )
    numbers = {}
    for key in ("anchor", "amax"):
        value = memory[key]
        if (
            isinstance(value, (bool, np.bool_))
            or not isinstance(value, (int, float, np.integer, np.floating))
            or not 0 <= value <= rule.FLOAT32_MAX
        ):
            raise ValueError(f"{name}[{key!r}] must be a finite number >= 0, got {value!r}")
        numbers[key] = float(value)
    return {
        "margin": int(margin),
        "margin_at": int(margin_at),
        "grown_at": int(grown_at),
        **numbers,
    }


def _bounds_in(state_dict: Mapping[str, Any]) -> tuple[float, float | None] | None:
    present = [key for key in _BOUND_KEYS if key in state_dict]
    if not present:
        return None
    if len(present) == 1:
        missing = next(key for key in _BOUND_KEYS if key not in present)
        raise ValueError(f"state_dict has {present[0]!r} but is missing the key {missing!r}")
    names = [f"state_dict[{key!r}]" for key in _BOUND_KEYS]
    try:
        return validation.check_bounds(*(state_dict[key] for key in _BOUND_KEYS), *names)
    except TypeError as error:
        raise ValueError(str(error)) from None


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
