"""Tensors inside nested lists, tuples and dicts: the argument shape the dialects accept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from paddle import Tensor


def map_tensors(
    function: Callable[[Tensor], Any],
    value: Any,
    other: Callable[[Any], Any] | None = None,
) -> Any:
    """``value`` rebuilt with ``function(t)`` for every Tensor ``t`` in it.

    Lists, tuples (named ones too) and dicts are walked and rebuilt (a list as a list, a
    tuple with its own type, a mapping as a dict); any other leaf goes through ``other``
    (default: kept as it is).
    """
    if isinstance(value, Tensor):
        return function(value)
    if isinstance(value, (list, tuple)):
        items = [map_tensors(function, item, other) for item in value]
        if isinstance(value, list):
            return items
        # A namedtuple takes its fields as arguments, a plain tuple an iterable.
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {key: map_tensors(function, item, other) for key, item in value.items()}
    return value if other is None else other(value)


def tensors_in(value: Any, other: Callable[[Any], Any] | None = None) -> list[Tensor]:
    """Every Tensor in ``value``, in order; other leaves go through ``other``."""
    found: list[Tensor] = []
    map_tensors(found.append, value, other)
    return found


def refuse_leaves(function: str, argument: str) -> Callable[[Any], NoReturn]:
    """An ``other`` for ``map_tensors`` that refuses anything but Tensors."""

    def refuse(leaf: Any) -> NoReturn:
        raise TypeError(
            f"{function}() takes a Tensor or (nested) lists/tuples of Tensors as {argument}, "
            f"found a {type(leaf).__name__} in it"
        )

    return refuse
