"""The headroom policy as a type: ``HeadroomRule``, and ``HeadroomMemory``, what it
remembers beyond the scale and its counters.

Paddle's rule grows blindly every period and climbs back one growth per period after a
spike. This one measures the gradients' largest magnitude (the amax) and keeps it a
margin below float16's ceiling, so the scale sits as high as the gradients allow, as
soon as they allow it: small gradients flush to zero far less. Like ``IntervalRule`` it
is written twice, pure (``adjust``) and on the device (``adjust_``), with the same names
and the same direction of every comparison.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, cast

import numpy as np
import paddle
from paddle import Tensor

from . import validation
from .interval import IntervalRule, Memory
from .kernels import C_ops
from .limits import FLOAT16_MAX, FLOAT32_MAX, INT32_MAX

# The margin, in bits below FLOAT16_MAX that the amax is kept: where it starts, and the
# bounds it is learned within.
INITIAL_MARGIN, MIN_MARGIN, MAX_MARGIN = 2, 1, 24
# The most growth steps one measurement may take (24 doublings: from 2**16 to float32's
# top in two measurements).
MAX_GROWTH_STEPS = 24
# The first iterations are all measured, and an overflow in them backs off this many
# steps at once: an initial scale far too high is found in a few iterations, not one
# halving per skipped step.
CALIBRATION_ITERATIONS, CALIBRATION_STRIDE = 3, 8
# "Never grew", as an iteration number (an int32 on the device).
NEVER = -(2**30)


@dataclasses.dataclass(frozen=True)
class HeadroomMemory(Memory):
    """``Memory``, and what the headroom rule learns.

    Args:
        margin: bits kept between the amax and float16's ceiling.
        margin_at: the iteration of the margin's last change (0: none yet).
        anchor: the scale after the last measured iteration (0: none yet).
        grown_at: the iteration of the last growth (``NEVER``: none, or already charged).
        amax: the amax of the last finite measured iteration (0: none yet).

    ``incr_count`` counts the finite iterations since the last overflow: the counters
    only ever back off.
    """

    FLOATS: ClassVar[tuple[str, ...]] = ("scale", "anchor", "amax")

    margin: Any = INITIAL_MARGIN
    margin_at: Any = 0
    anchor: Any = 0.0
    grown_at: Any = NEVER
    amax: Any = 0.0


@dataclasses.dataclass(frozen=True)
class HeadroomRule(IntervalRule):
    """Grow as soon as the gradients' amax leaves room below float16's ceiling, keeping a
    margin learned from the overflows that still happen::

        back off as the interval rule does; never grow by the counters
        if measured:
            calibrate: an overflow in the first iterations backs off eight steps at once
            learn:     a back-off soon after a growth means that growth was too greedy:
                       widen the margin by a bit, charged once per growth
            narrow:    a margin that stood a whole period moves a bit closer
            grow:      to the largest scale that keeps the amax within the margin

    Why: gradients shrink as a loss falls, and a run can be short; a blind rule leaves the
    scale far below what they allow for a thousand iterations at a time, and float16
    flushes what falls below its floor. An overflow long after the last growth is a spike,
    not a sign of a thin margin: the scale backs off and climbs back at the next
    measurement. The amax is measured in the first iterations and then one in
    ``measure_every``, where one operation per gradient is cheap next to a step.

    The Paddle arguments keep their meaning but for one: ``incr_every_n_steps`` is how
    long the margin stands before it tries a bit closer, and a growth counts as too
    greedy when a back-off follows within a quarter of it.
    """

    name: ClassVar[str] = "headroom"
    memory_type: ClassVar[type[Memory]] = HeadroomMemory
    state_key: ClassVar[str | None] = "headroom"
    measure_every: ClassVar[int] = 64

    @property
    def grows_every(self) -> int | None:
        return None

    def measures(self, iteration: int) -> bool:
        return iteration <= CALIBRATION_ITERATIONS or iteration % self.measure_every == 0

    def headroom_bits(self, memory: Memory) -> float | None:
        """log2(FLOAT16_MAX / amax) of the last finite measured iteration; None before it."""
        amax = float(cast(HeadroomMemory, memory).amax)
        return math.log2(FLOAT16_MAX / amax) if amax > 0 else None

    # -- the pure form ----------------------------------------------------------------

    def adjust(
        self, memory: Memory, found: bool, amax: float | None = None, iteration: int = 0
    ) -> tuple[Memory, bool]:
        """The memory after ``iteration`` (1-based) and whether the scale moved. ``amax`` is
        the largest magnitude among the scaled gradients checked, before unscaling; None
        where the iteration was not measured (``measures``)."""
        counted, backed_off = super().adjust(memory, found)
        if amax is None:
            return counted, backed_off
        moved = cast(HeadroomMemory, counted)
        if backed_off and iteration <= CALIBRATION_ITERATIONS:
            moved = self._calibrate(moved)
        usable = not found and amax > 0
        moved = self._learn_or_narrow(moved, usable, iteration)
        moved, grew = self._grow_to_fit(moved, usable, amax, iteration)
        return dataclasses.replace(moved, anchor=moved.scale), backed_off or grew

    def _calibrate(self, memory: HeadroomMemory) -> HeadroomMemory:
        lowered = memory.scale * calibration_stride(self.decr_ratio)
        return dataclasses.replace(memory, scale=max(lowered, np.float32(self.min_scale)))

    def _learn_or_narrow(
        self, memory: HeadroomMemory, usable: bool, iteration: int
    ) -> HeadroomMemory:
        learn = (
            memory.scale < memory.anchor
            and memory.grown_at >= iteration - self.incr_every_n_steps // 4
        )
        # Learning and narrowing at once would leave the margin where it was.
        quiet = usable and not learn and memory.margin_at <= iteration - self.incr_every_n_steps
        margin = min(max(memory.margin + int(learn) - int(quiet), MIN_MARGIN), MAX_MARGIN)
        return dataclasses.replace(
            memory,
            margin=margin,
            margin_at=iteration if learn or quiet else memory.margin_at,
            # A growth is charged one bit of margin at most: learning forgets it.
            grown_at=NEVER if learn else memory.grown_at,
        )

    def _grow_to_fit(
        self, memory: HeadroomMemory, usable: bool, amax: float, iteration: int
    ) -> tuple[HeadroomMemory, bool]:
        if not usable:
            return memory, False
        steps = growth_steps(amax, memory.margin, self.incr_ratio)
        factor = growth_factors(self.incr_ratio)[steps]
        with np.errstate(over="ignore"):
            grown = min(memory.scale * factor, np.float32(self._cap))
        grew = bool(grown > memory.scale)
        return (
            dataclasses.replace(
                memory,
                scale=grown if grew else memory.scale,
                grown_at=iteration if grew else memory.grown_at,
                amax=np.float32(amax),
            ),
            grew,
        )

    @property
    def _cap(self) -> float:
        return FLOAT32_MAX if self.max_scale is None else self.max_scale

    # -- the device form ----------------------------------------------------------------

    def adjust_(
        self, memory: Memory, found: Tensor, amax: Tensor | None = None, iteration: int = 0
    ) -> Tensor:
        """``adjust`` on the device tensors of ``memory``, in place: the interval rule's
        back-off in every iteration (its cost, no more); in a measured one, the rest in
        some fifty operations on tensors that never leave the device."""
        backed_off = super().adjust_(memory, found)
        if amax is None:
            return backed_off
        tensors = cast(HeadroomMemory, memory)
        known = _constants(self, tensors.scale.place)
        if iteration <= CALIBRATION_ITERATIONS:
            self._calibrate_(tensors, backed_off, known)
        now = paddle.full_like(tensors.margin_at, iteration)
        usable = paddle.logical_and(paddle.logical_not(found), amax > 0)
        self._learn_or_narrow_(tensors, usable, now, known)
        grew = self._grow_to_fit_(tensors, usable, amax, now, known)
        paddle.assign(tensors.scale, output=tensors.anchor)
        return paddle.logical_or(backed_off, grew)

    def _calibrate_(self, memory: HeadroomMemory, backed_off: Tensor, known: _Constants) -> None:
        scale = memory.scale
        lowered = C_ops.maximum(scale * known.calibration_stride, known.min_scale)
        paddle.assign(C_ops.where(backed_off, lowered, scale), output=scale)

    def _learn_or_narrow_(
        self, memory: HeadroomMemory, usable: Tensor, now: Tensor, known: _Constants
    ) -> None:
        learn = paddle.logical_and(
            memory.scale < memory.anchor,
            memory.grown_at >= now - self.incr_every_n_steps // 4,
        )
        quiet = paddle.logical_and(
            paddle.logical_and(usable, paddle.logical_not(learn)),
            memory.margin_at <= now - self.incr_every_n_steps,
        )
        step = learn.astype(paddle.int32) - quiet.astype(paddle.int32)
        C_ops.clip_(C_ops.add_(memory.margin, step), MIN_MARGIN, MAX_MARGIN)
        changed = paddle.logical_or(learn, quiet)
        paddle.assign(C_ops.where(changed, now, memory.margin_at), output=memory.margin_at)
        paddle.assign(C_ops.where(learn, known.never, memory.grown_at), output=memory.grown_at)

    def _grow_to_fit_(
        self,
        memory: HeadroomMemory,
        usable: Tensor,
        amax: Tensor,
        now: Tensor,
        known: _Constants,
    ) -> Tensor:
        # How many growth steps fit below the margin's limit; none where nothing was
        # usable (an inf amax fits none).
        usable_amax = C_ops.where(usable, amax, known.infinity)
        limit = paddle.gather(known.limits, memory.margin)
        steps = (usable_amax * known.growth_factors <= limit).sum()
        grown = C_ops.minimum(memory.scale * paddle.gather(known.factors, steps), known.cap)
        grew = grown > memory.scale
        paddle.assign(grown, output=memory.scale)
        paddle.assign(C_ops.where(grew, now, memory.grown_at), output=memory.grown_at)
        paddle.assign(C_ops.where(usable, amax, memory.amax), output=memory.amax)
        return grew

    # -- the state dict -------------------------------------------------------------------

    @classmethod
    def memory_from_state(cls, value: Any, name: str) -> dict[str, Any]:
        # Where each field of the memory may lie; those in FLOATS are numbers, the rest ints.
        bounds: dict[str, tuple[Any, Any]] = {
            "margin": (MIN_MARGIN, MAX_MARGIN),
            "margin_at": (0, INT32_MAX),
            "anchor": (0, FLOAT32_MAX),
            "grown_at": (NEVER, INT32_MAX),
            "amax": (0, FLOAT32_MAX),
        }
        validation.check_keys(value, name, tuple(bounds))
        return {
            key: (
                validation.check_number_within
                if key in HeadroomMemory.FLOATS
                else validation.check_int_within
            )(value[key], f"{name}[{key!r}]", *bounds[key])
            for key in bounds
        }


def growth_steps(amax: float, margin: int, incr_ratio: float) -> int:
    """The largest k <= MAX_GROWTH_STEPS with ``amax * incr_ratio**k`` at most
    ``FLOAT16_MAX / 2**margin``, in float32 (0 for an amax that leaves no room)."""
    limit = margin_limits()[margin]
    with np.errstate(over="ignore"):
        products = np.float32(amax) * growth_factors(incr_ratio)[1:]
    return int(np.count_nonzero(products <= limit))


def calibration_stride(decr_ratio: float) -> np.float32:
    """The calibration's extra back-off factor, ``decr_ratio ** (CALIBRATION_STRIDE - 1)``
    rounded to float32 (both forms use this value)."""
    return np.float32(decr_ratio ** (CALIBRATION_STRIDE - 1))


def margin_limits() -> np.ndarray:
    """float32 ``FLOAT16_MAX / 2 ** margin`` for margin = 0 .. MAX_MARGIN (both forms use
    this table)."""
    margins = np.arange(MAX_MARGIN + 1, dtype=np.float32)
    limits: np.ndarray = np.float32(FLOAT16_MAX) * np.exp2(-margins).astype(np.float32)
    return limits


def growth_factors(incr_ratio: float) -> np.ndarray:
    """float32 ``incr_ratio ** k`` for k = 0 .. MAX_GROWTH_STEPS, as a cumulative product
    (both forms use this table)."""
    with np.errstate(over="ignore"):
        factors: np.ndarray = np.cumprod(
            np.concatenate([[1.0], np.full(MAX_GROWTH_STEPS, incr_ratio)]).astype(np.float32),
            dtype=np.float32,
        )
    return factors


class _Constants:
    """The rule's constants as device tensors, made once per rule and place: a measured
    iteration then copies nothing from the host but its number."""

    def __init__(self, rule: HeadroomRule, place: Any) -> None:
        def on_device(values: Any, dtype: Any = paddle.float32) -> Tensor:
            return paddle.to_tensor(values, dtype=dtype, place=place)

        self.calibration_stride = float(calibration_stride(rule.decr_ratio))
        self.min_scale = on_device([rule.min_scale])
        self.cap = on_device([rule._cap])
        self.infinity = on_device([np.inf])
        self.never = on_device([NEVER], paddle.int32)
        factors = growth_factors(rule.incr_ratio)
        self.factors = on_device(factors)
        self.growth_factors = on_device(factors[1:])
        self.limits = on_device(margin_limits())


_made: dict[tuple[HeadroomRule, str], _Constants] = {}


def _constants(rule: HeadroomRule, place: Any) -> _Constants:
    key = (rule, str(place))
    if key not in _made:
        _made[key] = _Constants(rule, place)
    return _made[key]
