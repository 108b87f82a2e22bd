"""Argument checks shared by the constructors, the setters and ``load_state_dict``, each
returning the value as a plain Python type or raising ``TypeError`` (wrong kind) or
``ValueError`` (out of range) naming the argument; and, once, the limits of what a scaler
keeps: the scale in float32, its counters and periods in int32 (Paddle's
``update_loss_scaling`` kernel), and gradients in float16, inf above its largest value.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import numpy as np

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
FLOAT32_MAX = float(np.finfo(np.float32).max)
INT32_MAX = int(np.iinfo(np.int32).max)


def _real(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def _integer(value: Any, name: str, integral_float: bool = False) -> int:
    if integral_float and isinstance(value, (float, np.floating)):
        # As the framework being imitated takes it: int(2.0); a NaN is no whole number.
        if not value.is_integer():
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        return int(value)

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        wanted = "an int (or a whole float such as 2.0)" if integral_float else "an int"
        raise TypeError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")

    return int(value)


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_scale(value: Any, name: str) -> float:
    """A loss scale: positive and finite in float32, where the device keeps it."""
    scale = _real(value, name)
    if not 0 < scale <= FLOAT32_MAX:
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


def check_period(value: Any, name: str, *, integral_float: bool = False) -> int:
    """A number of steps between scale changes."""
    return check_int_within(value, name, 1, INT32_MAX, integral_float=integral_float)


def check_rule_settings(
    incr_ratio: Any, decr_ratio: Any, incr_every_n_steps: Any, decr_every_n_nan_or_inf: Any
) -> dict[str, Any]:
    """Paddle's four arguments of a dynamic rule, as a rule's settings. Paddle's scaler
    takes the periods unchecked, so code may give 1000.0.
    """
    periods = dict(
        incr_every_n_steps=incr_every_n_steps, decr_every_n_nan_or_inf=decr_every_n_nan_or_inf
    )
    return {
        "incr_ratio": check_incr_ratio(incr_ratio),
        "decr_ratio": check_decr_ratio(decr_ratio),
        **{name: check_period(value, name, integral_float=True) for name, value in periods.items()},
    }


def check_count(value: Any, name: str, period: int, period_name: str) -> int:
    """A streak counter; at ``period`` the scale would already have changed and reset it."""
    count = _integer(value, name)
    if not 0 <= count < period:
        raise ValueError(
            f"{name} must be an int with 0 <= {name} < {period_name} ({period}), got {value!r}"
        )
    return count


def check_keys(value: Any, name: str, keys: Sequence[str]) -> Mapping[str, Any]:
    """A saved dict with exactly ``keys``."""
    if not isinstance(value, Mapping) or set(value) != set(keys):
        raise ValueError(f"{name} must be a dict with the keys {sorted(keys)}")
    return value


def check_int_within(
    value: Any, name: str, lower: int, upper: int, *, integral_float: bool = False
) -> int:
    """An int from ``lower`` to ``upper``; with ``integral_float``, a whole float such as
    2.0 too (Paddle's and tf-keras' scalers take one), returned as an int.
    """
    whole = _integer(value, name, integral_float)
    if not lower <= whole <= upper:
        raise ValueError(f"{name} must be an int from {lower} to {upper}, got {value!r}")
    return whole


def check_number_within(value: Any, name: str, lower: float, upper: float) -> float:
    number = _real(value, name)
    if not lower <= number <= upper:
        raise ValueError(f"{name} must be a number from {lower!r} to {upper!r}, got {value!r}")
    return number


def check_place(value: Any, name: str = "place") -> Any:
    """Where tensors go: None (Paddle's current device), a device string such as "cpu" or
    "gpu:1", or a Paddle place object. Paddle itself refuses a string it cannot parse.
    """
    if value is None or isinstance(value, str) or type(value).__name__.endswith("Place"):
        return value

    wanted = 'None, a device string such as "cpu" or "gpu:0", or a Paddle place'
    raise TypeError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")


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


class UnknownArgumentError(ValueError, TypeError):
    """A constructor was given keyword arguments it does not take.

    Both a ``ValueError`` (what Keras 3 raises) and a ``TypeError`` (what Python,
    tf-keras and PyTorch raise), so that code written for any of them catches it. The
    message names every unknown argument at once, each with its likely fix.
    """


def check_keywords(
    owner: str,
    given: Iterable[str],
    known: Sequence[str],
    advice: Callable[[str], str | None] = lambda name: None,
) -> None:
    """Raise ``UnknownArgumentError`` for the names in ``given`` that are not ``known``:
    ``advice(name)`` where it has some, else "did you mean" the closest known name.
    """
    unknown = [name for name in given if name not in known]

    fixes = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        meant = f"did you mean {close[0]!r}?" if close else f"it takes {', '.join(known)}"
        fixes.append(f"{name!r} ({advice(name) or meant})")

    if fixes:
        raise UnknownArgumentError(f"{owner} does not take " + "; ".join(fixes))


def keyword_names(function: Callable[..., Any], keyword_only: bool = False) -> list[str]:
    """The arguments of ``function`` that can be given by keyword (``self`` left out),
    or only those that must be.
    """
    kinds = {"KEYWORD_ONLY"} if keyword_only else {"KEYWORD_ONLY", "POSITIONAL_OR_KEYWORD"}
    parameters = inspect.signature(function).parameters.values()
    return [each.name for each in parameters if each.kind.name in kinds and each.name != "self"]


def keyword_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    parameters = inspect.signature(function).parameters.values()
    return {each.name: each.default for each in parameters if each.default is not each.empty}


_Init = TypeVar("_Init", bound=Callable[..., None])


def keywords_checked(init: _Init) -> _Init:
    """Decorate an ``__init__`` so that unknown keywords raise ``UnknownArgumentError``
    (Python's own ``TypeError`` names only the first one and suggests nothing).
    """
    known = keyword_names(init)

    @functools.wraps(init)
    def init_with_known_keywords(self: Any, *args: Any, **kwargs: Any) -> None:
        check_keywords(type(self).__name__, kwargs, known)
        init(self, *args, **kwargs)

    return cast(_Init, init_with_known_keywords)
