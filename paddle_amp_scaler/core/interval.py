"""What every loss-scaling rule is (``Rule``; ``Memory``, what it remembers), and Paddle's
rule, ``IntervalRule``: its pure ``adjust`` on host numbers, the specification, and its
device form ``adjust_``, in the same names and comparisons, which the tests hold to it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar, cast

import numpy as np
import paddle
from paddle import Tensor

from . import kernels, validation
from .validation import FLOAT32_MAX, INT32_MAX


@dataclasses.dataclass(frozen=True)
class Memory:
    """What a rule remembers between iterations: the scale and its two streak counters.

    On the host the scale is a ``numpy.float32``, rounded as the device rounds it (a
    Python float keeps Python's arithmetic, as MindSpore's managers do). On the device
    each field is a [1] tensor: float32 for those in ``FLOATS``, int32 for the others.
    """

    FLOATS: ClassVar[tuple[str, ...]] = ("scale",)

    scale: Any
    incr_count: Any = 0
    decr_count: Any = 0

    def numbers(self, real: Callable[[Any], Any] = float) -> dict[str, Any]:
        """Each field as a host number: ``real`` of those in ``FLOATS``, an int of the rest."""
        return {
            field.name: (real if field.name in self.FLOATS else int)(getattr(self, field.name))
            for field in dataclasses.fields(self)
        }


@dataclasses.dataclass(frozen=True)
class Rule:
    """What every rule shares: Paddle's four settings, the scale's bounds, and the back-off
    of Paddle's ``update_loss_scaling`` kernel (``adjust_``). A rule says how the scale
    grows and what it remembers beyond the scale and counters (``memory_type``, ``state_key``).

    Args:
        incr_ratio: the factor of a growth.
        decr_ratio: the factor of a back-off.
        incr_every_n_steps: finite iterations in a row before a growth (``IntervalRule``);
            how long a level that overflowed is held off (``HeadroomRule``).
        decr_every_n_nan_or_inf: iterations with inf/nan in a row before a back-off.
        min_scale: the scale never falls below it.
        max_scale: the scale never grows above it; None: no bound but float32's range.
        backoff_divisor: back off by dividing by it rather than multiplying by
            ``decr_ratio``, as MindSpore's ``amp.DynamicLossScaler`` does
            (``scale / 3`` and ``scale * float32(1 / 3)`` differ in the last bit).
        measure_every: measure the scaled gradients in the first three iterations and
            every ``measure_every``-th after; None: never (``IntervalRule``'s default,
            which never uses what is measured: it is for the user to read).
    """

    # The name a scaler is built with (``policy=``) and a state dict carries.
    name: ClassVar[str]
    memory_type: ClassVar[type[Memory]] = Memory
    # The state-dict key of the memory beyond the scale and its counters (None: none).
    state_key: ClassVar[str | None] = None
    # Whether ``adjust_`` takes the measured amax; else what is measured is the user's.
    fits_amax: ClassVar[bool] = False

    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 1000
    decr_every_n_nan_or_inf: int = 1
    min_scale: float = 1.0
    max_scale: float | None = None
    backoff_divisor: float | None = None
    measure_every: int | None = None

    def __post_init__(self) -> None:
        # Made once per place: on a GPU a copy from the host waits for it. Not a field, so
        # a rule made by ``dataclasses.replace`` (as pickling a scaler does) makes its own.
        object.__setattr__(self, "_on_device", {})

    def _kept(self, key: Any, place: Any, make: Callable[[], Any]) -> Any:
        kept, where = self.__dict__["_on_device"], (key, str(place))
        if where not in kept:
            kept[where] = make()
        return kept[where]

    def stand_in(self, place: Any, dtype: Any) -> Tensor:
        """The rule's [1] zero of ``dtype`` on ``place``, for a kernel argument that does not
        matter (``update_loss_scaling``'s ``xs``; with ``stop_update``, scale and counters)."""
        return self._kept(
            ("stand-in", str(dtype)), place, lambda: paddle.to_tensor([0], dtype=dtype, place=place)
        )

    @property
    def incr_count_limit(self) -> int:
        """``incr_count`` stays below it: the period of a rule that grows by the count."""
        return INT32_MAX

    def measures(self, iteration: int) -> bool:
        """Whether the gradients are measured in ``iteration`` (1-based)."""
        every = self.measure_every
        return every is not None and (iteration <= 3 or iteration % every == 0)

    def count(self, incr_count: int, decr_count: int, found: bool) -> tuple[int, int, bool]:
        """The streak counters after an iteration, and whether the rule acts (grows or
        backs off): from the verdicts alone, so a scaler can keep them on the host."""
        if found:
            decr_count += 1
            acts = decr_count == self.decr_every_n_nan_or_inf
            return 0, 0 if acts else decr_count, acts
        incr_count += 1
        acts = incr_count == self.incr_count_limit
        return 0 if acts else incr_count, 0, acts

    def adjust_(
        self, memory: Memory, found: Tensor, amax: Tensor | None = None, iteration: int = 0
    ) -> Tensor:
        """The rule on ``memory``'s device tensors, in place, from a bool [1] verdict and, where
        measured, the amax; returns whether it acted, a bool [1] tensor. Reads nothing.

        Here ``count`` and its move, shared by every rule and the whole of ``IntervalRule``'s:
        Paddle's ``update_loss_scaling`` kernel, one launch, with ``incr_count_limit`` as its
        period. It floors the scale at 1.0, backs off by multiplying, refuses a growth that
        would overflow float32, and resets the verdict's counter exactly when it acts, leaving
        the other at 0: a lower ``min_scale`` or a ``backoff_divisor`` redoes its back-off, and
        a higher floor or a ``max_scale`` clips after it."""
        scale = memory.scale
        before = scale.clone() if self.min_scale < 1.0 or self.backoff_divisor is not None else None
        # The gradients were dealt with before: ``xs`` is a stand-in (the facts in ``kernels``).
        kernels.C_ops.update_loss_scaling_(
            [self.stand_in(scale.place, paddle.float32)],
            found,
            scale,
            memory.incr_count,
            memory.decr_count,
            self.incr_count_limit,
            self.decr_every_n_nan_or_inf,
            self.incr_ratio,
            self.decr_ratio,
            False,
        )
        # Both counters are 0 exactly when it acted.
        acted = paddle.equal(memory.incr_count, memory.decr_count)
        if before is not None:
            # Rare settings: readability over the handful of operations they cost.
            backed_off = paddle.logical_and(found, memory.decr_count == 0)
            if self.backoff_divisor is None:
                lowered = before * self.decr_ratio
            else:
                lowered = before / paddle.full_like(before, self.backoff_divisor)
            lowered = paddle.maximum(lowered, paddle.full_like(before, self.min_scale))
            paddle.assign(paddle.where(backed_off, lowered, scale), output=scale)
        if self.min_scale > 1.0 or self.max_scale is not None:
            kernels.clip_(scale, self.min_scale, self.max_scale or FLOAT32_MAX)
        return acted

    def memory_to_state(self, memory: Memory) -> dict[str, Any]:
        """The memory beyond the scale and its counters, as plain Python values for the
        state dict's ``state_key`` entry."""
        counted = [field.name for field in dataclasses.fields(Memory)]
        return {key: value for key, value in memory.numbers().items() if key not in counted}

    @classmethod
    def memory_from_state(cls, value: Any, name: str) -> dict[str, Any]:
        """``memory_to_state``'s dict, checked (``ValueError`` naming ``name``), as keyword
        arguments of ``memory_type``: floats from 0 to float32's largest, ints (iterations)
        from their default, "never", to int32's largest."""
        memory = cls.memory_type
        extra = dataclasses.fields(memory)[len(dataclasses.fields(Memory)) :]  # past Memory's
        validation.check_keys(value, name, [field.name for field in extra])
        checked: dict[str, Any] = {}
        for field in extra:
            key, where = field.name, f"{name}[{field.name!r}]"
            if key in memory.FLOATS:
                checked[key] = validation.check_number_within(value[key], where, 0, FLOAT32_MAX)
            else:
                lowest = cast(int, field.default)
                checked[key] = validation.check_int_within(value[key], where, lowest, INT32_MAX)
        return checked


@dataclasses.dataclass(frozen=True)
class IntervalRule(Rule):
    """Paddle's rule, and PyTorch's, Keras' and MindSpore's: grow after a run of finite
    iterations, back off after a run of iterations with inf/nan::

        if found:
            incr_count = 0; decr_count += 1
            if decr_count == decr_every_n_nan_or_inf:        # back off
                scale = max(scale * decr_ratio, min_scale); decr_count = 0
        else:
            decr_count = 0; incr_count += 1
            if incr_count == incr_every_n_steps:             # grow
                if scale * incr_ratio is finite:
                    scale = min(scale * incr_ratio, max_scale)
                incr_count = 0

    Blind to the gradients, it grows every period whatever they hold. Its settings are ``Rule``'s.
    """

    name: ClassVar[str] = "interval"

    @property
    def incr_count_limit(self) -> int:
        return self.incr_every_n_steps

    def adjust(
        self, memory: Memory, found: bool, amax: float | None = None, iteration: int = 0
    ) -> tuple[Memory, bool]:
        """The memory after one iteration whose gradients held inf/nan (``found``) or not,
        each product in the scale's own precision, and whether the rule acted (grew or
        backed off, even where a bound or float32's limit held the scale). It ignores
        ``amax`` and ``iteration``. Its device form is ``Rule.adjust_``."""
        incr_count, decr_count, acts = self.count(memory.incr_count, memory.decr_count, found)
        scale, real = memory.scale, type(memory.scale)
        if acts and found:
            if self.backoff_divisor is None:
                scale = _times(scale, self.decr_ratio)
            else:
                scale = scale / real(self.backoff_divisor)
            scale = max(scale, real(self.min_scale))
        elif acts:
            grown = _times(scale, self.incr_ratio)
            if math.isfinite(grown):
                scale = grown if self.max_scale is None else min(grown, real(self.max_scale))
        moved = dataclasses.replace(
            memory, scale=scale, incr_count=incr_count, decr_count=decr_count
        )
        return moved, acts


def _times(value: Any, factor: float) -> Any:
    """``value * factor`` in ``value``'s precision: float32 overflows to inf, as on the device."""
    with np.errstate(over="ignore"):
        return value * type(value)(factor)
