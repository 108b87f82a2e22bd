"""Argument checks shared by the constructors, the setters and ``load_state_dict``.

Each returns the value normalised to a plain Python type, or raises ``TypeError``
(wrong kind of value) or ``ValueError`` (out of range) naming the argument.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

# The kernels take the step periods as C int attributes.
_INT32_MAX = 2**31 - 1
# The device keeps the scale in float32.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _real(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def _integer(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    return int(value)


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_scale(value: Any, name: str) -> float:
    """A loss scale: positive and finite in float32, where the device keeps it."""
    scale = _real(value, name)
    if not 0 < scale <= _FLOAT32_MAX:
        raise ValueError(f"{name} must be a positive number that fits in float32, got {value!r}")
    return scale


def check_incr_ratio(value: Any, name: str = "incr_ratio") -> float:
    ratio = _real(value, name)
    if not (ratio > 1.0 and math.isfinite(ratio)):
        raise ValueError(f"{name} must be a finite number > 1.0, got {value!r}")
    return ratio


def check_decr_ratio(value: Any, name: str = "decr_ratio") -> float:
    ratio = _real(value, name)
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"{name} must be a number with 0 < {name} < 1, got {value!r}")
    return ratio


def check_period(value: Any, name: str) -> int:
    """A number of steps between scale changes: an int from 1 to 2**31 - 1."""
    period = _integer(value, name)
    if not 1 <= period <= _INT32_MAX:
        raise ValueError(f"{name} must be an int >= 1 (and < 2**31), got {value!r}")
    return period


def check_count(value: Any, name: str, period: int, period_name: str) -> int:
    """A streak counter; at ``period`` the scale would already have changed and reset it."""
    count = _integer(value, name)
    if not 0 <= count < period:
        raise ValueError(
            f"{name} must be an int with 0 <= {name} < {period_name} ({period}), got {value!r}"
        )
    return count


def check_place(value: Any, name: str = "place") -> Any:
    """Where tensors go: None (Paddle's current device), a device string such as "cpu" or
    "gpu:1", or a Paddle place object. Paddle itself refuses a string it cannot parse."""
    if value is None or isinstance(value, str) or type(value).__name__.endswith("Place"):
        return value
    raise TypeError(
        f'{name} must be None, a device string such as "cpu" or "gpu:0", or a Paddle '
        f"place, got {value!r} ({type(value).__name__})"
    )


def check_bounds(
    min_scale: Any,
    max_scale: Any,
    min_name: str = "min_loss_scaling",
    max_name: str = "max_loss_scaling",
) -> tuple[float, float | None]:
    """``min_loss_scaling`` and ``max_loss_scaling`` (None: float32's largest value)."""
    lower = check_scale(min_scale, min_name)
    upper = None if max_scale is None else check_scale(max_scale, max_name)
    if upper is not None and upper < lower:
        raise ValueError(f"{max_name} ({max_scale!r}) must be >= {min_name} ({min_scale!r})")
    return lower, upper


def check_within(value: float, name: str, bounds: tuple[float, float | None]) -> float:
    """A scale inside ``bounds``, from ``check_bounds``."""
    lower, upper = bounds
    if value < lower or (upper is not None and value > upper):
        raise ValueError(
            f"{name} ({value!r}) must lie within min_loss_scaling ({lower!r}) and "
            f"max_loss_scaling ({upper!r})"
        )
    return value
