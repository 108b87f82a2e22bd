"""Argument checks shared by the constructors, the setters and ``load_state_dict``.

Each returns the value normalised to a plain Python type, or raises ``TypeError``
(wrong kind of value) or ``ValueError`` (out of range) naming the argument.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import numbers
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from .rule import POLICIES

# The kernels take the step periods as C int attributes.
_INT32_MAX = 2**31 - 1
# The device keeps the scale in float32.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


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


def check_period(value: Any, name: str, *, integral_float: bool = False) -> int:
    """A number of steps between scale changes: an int from 1 to 2**31 - 1; with
    ``integral_float``, a whole float such as 2.0 too (Paddle's and tf-keras' scalers
    take one), returned as an int."""
    period = _integer(value, name, integral_float)
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


def check_policy(value: Any, name: str = "policy") -> str:
    """How the dynamic scale moves: one of ``rule.POLICIES``."""
    if not isinstance(value, str) or value not in POLICIES:
        accepted = " or ".join(repr(policy) for policy in POLICIES)
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return value


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
    ``advice(name)`` where it has some, else "did you mean" the closest known name."""
    unknown = [name for name in given if name not in known]
    if not unknown:
        return

    def fix(name: str) -> str:
        advised = advice(name)
        if advised is not None:
            return advised
        close = difflib.get_close_matches(name, known, n=1)
        return f"did you mean {close[0]!r}?" if close else f"it takes {', '.join(known)}"

    raise UnknownArgumentError(
        f"{owner} does not take " + "; ".join(f"{name!r} ({fix(name)})" for name in unknown)
    )


def keyword_names(function: Callable[..., Any], keyword_only: bool = False) -> list[str]:
    """The arguments of ``function`` that can be given by keyword (``self`` left out),
    or only those that must be."""
    kinds = (inspect.Parameter.KEYWORD_ONLY,) + (
        () if keyword_only else (inspect.Parameter.POSITIONAL_OR_KEYWORD,)
    )
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in kinds and name != "self"
    ]


def keyword_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    """The default value of each argument of ``function`` that has one."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


_Init = TypeVar("_Init", bound=Callable[..., None])


def keywords_checked(init: _Init) -> _Init:
    """Decorate an ``__init__`` so that an unknown keyword raises
    ``UnknownArgumentError`` with "did you mean", where Python's own ``TypeError`` names
    only the first one and suggests nothing."""
    known = keyword_names(init)

    @functools.wraps(init)
    def init_with_known_keywords(self: Any, *args: Any, **kwargs: Any) -> None:
        check_keywords(type(self).__name__, kwargs, known)
        init(self, *args, **kwargs)

    return cast(_Init, init_with_known_keywords)


_Class = TypeVar("_Class", bound=type)


def with_defaults(**defaults: Any) -> Callable[[_Class], _Class]:
    """Decorate a subclass so that its constructor is its base's (one made by
    ``keywords_checked``) with other default values for the named arguments: two classes
    share one signature, written once, and ``help()`` and ``inspect.signature`` show each
    class's own defaults."""

    def apply(cls: _Class) -> _Class:
        plain = inspect.unwrap(cls.__init__)  # type: ignore[misc]
        code = plain.__code__
        positional_defaults = plain.__defaults__ or ()
        first_with_default = code.co_argcount - len(positional_defaults)
        with_default = code.co_varnames[first_with_default : code.co_argcount]
        keyword_only = keyword_names(plain, keyword_only=True)
        unknown = sorted(set(defaults) - set(with_default) - set(keyword_only))
        if unknown:
            raise TypeError(f"{plain.__qualname__} has no argument with a default: {unknown}")
        init = types.FunctionType(
            code,
            plain.__globals__,
            plain.__name__,
            tuple(
                defaults.get(name, value) for name, value in zip(with_default, positional_defaults)
            ),
            plain.__closure__,
        )
        init.__kwdefaults__ = {
            **(plain.__kwdefaults__ or {}),
            **{name: value for name, value in defaults.items() if name in keyword_only},
        }
        init.__annotations__ = dict(plain.__annotations__)
        init.__doc__, init.__module__ = plain.__doc__, cls.__module__
        init.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = keywords_checked(init)  # type: ignore[misc]
        return cls

    return apply
