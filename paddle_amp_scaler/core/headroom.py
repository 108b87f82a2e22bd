"""The headroom policy as a type: ``HeadroomRule``, and ``HeadroomMemory``, what it
remembers beyond the scale and its counters.

Paddle's rule grows blindly every period and climbs back one growth per period after a
spike. This one measures the gradients' largest magnitude (the amax) and fits the scale
to the largest amax seen lately, a margin below float16's ceiling, so the scale sits as
high as the gradients allow, as soon as they allow it: small gradients flush to zero far
less. Like ``IntervalRule`` it is written twice, pure (``adjust``) and on the device
(``adjust_``), with the same names and the same direction of every comparison.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, cast

import numpy as np
import paddle
from paddle import Tensor

from . import validation
from .interval import IntervalRule, Memory
from .kernels import C_ops
from .limits import FLOAT16_MAX, FLOAT32_MAX, INT32_MAX

# Bits kept between the peak amax and float16's ceiling, and one more while the peak
# rests on the first measurements alone.
MARGIN, CALIBRATION_MARGIN = 1, 2
# The peak halves in this many iterations: it forgets one bit per half-life.
PEAK_HALF_LIFE = 512
# Bits the peak may stand above the latest amax: a peak further above is stale, the
# gradients having shrunk faster than it forgets.
STALE_BITS = 3
# The most growth steps one fit moves the scale, either way.
MAX_FIT_STEPS = 24
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
        peak: the largest true (unscaled) amax measured lately, forgetting a bit every
            ``PEAK_HALF_LIFE`` iterations (0: none yet).
        overflow_peak: the peak an overflow implies: one whose fit keeps the scale a
            growth below a scale that overflowed soon after the scale reached it. It
            falls a growth every ``incr_every_n_steps`` iterations (0: none).
        anchor: the scale after the last measured iteration (0: none yet).
        grown_at: the iteration of the last growth (``NEVER``: none).
        amax: the amax of the last finite measured iteration (0: none yet).

    ``incr_count`` counts the finite iterations since the last overflow: the counters
    only ever back off.
    """

    FLOATS: ClassVar[tuple[str, ...]] = ("scale", "peak", "overflow_peak", "anchor", "amax")

    peak: Any = 0.0
    overflow_peak: Any = 0.0
    anchor: Any = 0.0
    grown_at: Any = NEVER
    amax: Any = 0.0


@dataclasses.dataclass(frozen=True)
class HeadroomRule(IntervalRule):
    """Fit the scale to the largest amax of late, a margin below float16's ceiling, in
    both directions, and keep a growth below any scale that overflowed soon after it was
    reached::

        back off as the interval rule does; never grow by the counters
        if measured:
            calibrate: an overflow in the first iterations backs off eight steps at once
            overflow:  overflow_peak falls a growth per incr_every_n_steps iterations; an
                       overflow within a quarter of that after a growth raises it to the
                       peak whose fit is a growth below the scale that overflowed
            peak:      halves every 512 iterations; the larger of it and the true amax,
                       but at most 8 times that amax (a peak further above is stale)
            fit:       the scale becomes the one, in whole growth steps, that keeps
                       max(peak, overflow_peak) * scale at most 65504 / 2**margin
                       (margin 1; 2 in the first iterations)

    Why: gradients shrink as a loss falls, and a run can be short; a blind rule leaves the
    scale far below what they allow for a thousand iterations at a time, and float16
    flushes what falls below its floor. One measured amax is a single draw: the peak over
    several is what the iterations between measurements reach. A fit downward meets
    gradients that grow before they overflow; a peak far above the latest amax is stale,
    the gradients having shrunk. An overflow soon after a growth says that
    level is too high, for a long while; one long after it is a spike, and the scale
    climbs back at the next measurement. A measured amax above 65504 that is finite is
    not of float16 gradients (float32 ones where ``amp_guard`` is off, or gradients summed
    over several backward passes): the rule holds the scale. The amax is measured in the
    first iterations and then one in ``measure_every``, where one operation per gradient
    is cheap next to a step.

    The Paddle arguments keep their meaning but for one: ``incr_every_n_steps`` is how
    long a scale that overflowed is held off, a growth each that many iterations.
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
        """log2(FLOAT16_MAX / amax) of the last finite measured iteration; None before it.
        Negative: those gradients were not float16, and the rule held the scale."""
        amax = float(cast(HeadroomMemory, memory).amax)
        return math.log2(FLOAT16_MAX / amax) if amax > 0 else None

    # -- the pure form ----------------------------------------------------------------

    def adjust(
        self, memory: Memory, found: bool, amax: float | None = None, iteration: int = 0
    ) -> tuple[Memory, bool]:
        """The memory after ``iteration`` (1-based) and whether the rule grew or backed
        off (a fit downward is neither). ``amax`` is the largest magnitude among the scaled
        gradients checked, before unscaling; None where the iteration was not measured
        (``measures``)."""
        counted, backed_off = super().adjust(memory, found)
        if amax is None:
            return counted, backed_off
        moved = _in_float32(cast(HeadroomMemory, counted))
        if backed_off and iteration <= CALIBRATION_ITERATIONS:
            moved = self._calibrate(moved)
        amax = np.float32(0.0 if found else amax)
        usable = bool(0 < amax <= FLOAT16_MAX)
        constants = self._constants(iteration)
        moved = self._remember_overflow(moved, constants, iteration)
        moved = self._remember_peak(moved, usable, amax, constants)
        moved, grew = self._fit(moved, usable, constants, iteration)
        moved = dataclasses.replace(
            moved, anchor=moved.scale, amax=amax if amax > 0 else moved.amax
        )
        return moved, backed_off or grew

    def _calibrate(self, memory: HeadroomMemory) -> HeadroomMemory:
        lowered = memory.scale * calibration_stride(self.decr_ratio)
        return dataclasses.replace(memory, scale=max(lowered, np.float32(self.min_scale)))

    def _remember_overflow(
        self, memory: HeadroomMemory, constants: _Constants, iteration: int
    ) -> HeadroomMemory:
        overflow_peak = memory.overflow_peak * constants.overflow_fall
        too_high = (
            memory.scale < memory.anchor
            and memory.grown_at >= iteration - self.incr_every_n_steps // 4
        )
        if too_high:
            overflow_peak = max(overflow_peak, constants.overflow_limit / memory.anchor)
        return dataclasses.replace(memory, overflow_peak=overflow_peak)

    def _remember_peak(
        self, memory: HeadroomMemory, usable: bool, amax: np.float32, constants: _Constants
    ) -> HeadroomMemory:
        peak = memory.peak * constants.peak_fall
        if usable:
            latest = amax / memory.scale
            peak = min(max(peak, latest), latest * constants.stale)
        return dataclasses.replace(memory, peak=peak)

    def _fit(
        self, memory: HeadroomMemory, usable: bool, constants: _Constants, iteration: int
    ) -> tuple[HeadroomMemory, bool]:
        if not usable:
            return memory, False
        peak = max(memory.peak, memory.overflow_peak)
        with np.errstate(over="ignore"):
            room = constants.limit / (peak * memory.scale)
        # The factors that fit, counted from the lowest: its index names the largest.
        steps = int(np.count_nonzero(constants.factors[1:] <= room))
        fitted = memory.scale * constants.factors[steps]
        fitted = min(max(fitted, constants.min_scale), constants.cap)
        grew = bool(fitted > memory.scale)
        return (
            dataclasses.replace(
                memory, scale=fitted, grown_at=iteration if grew else memory.grown_at
            ),
            grew,
        )

    def _constants(self, iteration: int) -> _Constants:
        calibrating = iteration <= CALIBRATION_ITERATIONS
        return _constants(self, self._since_last_measure(iteration), calibrating)

    def _since_last_measure(self, iteration: int) -> int:
        """Iterations since the measurement before ``iteration``, by the schedule."""
        if iteration <= CALIBRATION_ITERATIONS:
            return 1
        previous = (iteration - 1) // self.measure_every * self.measure_every
        return iteration - max(previous, CALIBRATION_ITERATIONS)

    @property
    def _cap(self) -> float:
        return FLOAT32_MAX if self.max_scale is None else self.max_scale

    # -- the device form ----------------------------------------------------------------

    def adjust_(
        self, memory: Memory, found: Tensor, amax: Tensor | None = None, iteration: int = 0
    ) -> Tensor:
        """``adjust`` on the device tensors of ``memory``, in place: the interval rule's
        back-off in every iteration (its cost, no more); in a measured one, the rest in
        some forty operations on tensors that never leave the device."""
        backed_off = super().adjust_(memory, found)
        if amax is None:
            return backed_off
        tensors = cast(HeadroomMemory, memory)
        constants = self._constants(iteration)
        known = constants.on(tensors.scale.place)
        if iteration <= CALIBRATION_ITERATIONS:
            self._calibrate_(tensors, backed_off, known)
        now = paddle.full_like(tensors.grown_at, iteration)
        amax = C_ops.where(found, known.zero, amax)
        finite = amax > 0
        usable = paddle.logical_and(finite, amax <= FLOAT16_MAX)
        self._remember_overflow_(tensors, constants, now, known)
        self._remember_peak_(tensors, usable, amax, constants)
        grew = self._fit_(tensors, usable, known, now)
        paddle.assign(tensors.scale, output=tensors.anchor)
        paddle.assign(C_ops.where(finite, amax, tensors.amax), output=tensors.amax)
        return paddle.logical_or(backed_off, grew)

    def _calibrate_(self, memory: HeadroomMemory, backed_off: Tensor, known: _OnDevice) -> None:
        scale = memory.scale
        # Lowered, the scale stays under the ceiling: clipping to both (scalar) bounds
        # applies the floor, with no bound tensor to keep.
        lowered = C_ops.clip(scale * known.calibration_stride, *known.bounds)
        paddle.assign(C_ops.where(backed_off, lowered, scale), output=scale)

    def _remember_overflow_(
        self, memory: HeadroomMemory, constants: _Constants, now: Tensor, known: _OnDevice
    ) -> None:
        overflow_peak = memory.overflow_peak * float(constants.overflow_fall)
        too_high = paddle.logical_and(
            memory.scale < memory.anchor,
            memory.grown_at >= now - self.incr_every_n_steps // 4,
        )
        raised = C_ops.maximum(overflow_peak, known.overflow_limit / memory.anchor)
        overflow_peak = C_ops.where(too_high, raised, overflow_peak)
        paddle.assign(overflow_peak, output=memory.overflow_peak)

    def _remember_peak_(
        self, memory: HeadroomMemory, usable: Tensor, amax: Tensor, constants: _Constants
    ) -> None:
        peak = memory.peak * float(constants.peak_fall)
        latest = amax / memory.scale
        fresh = C_ops.minimum(C_ops.maximum(peak, latest), latest * float(constants.stale))
        paddle.assign(C_ops.where(usable, fresh, peak), output=memory.peak)

    def _fit_(
        self, memory: HeadroomMemory, usable: Tensor, known: _OnDevice, now: Tensor
    ) -> Tensor:
        scale = memory.scale
        peak = C_ops.maximum(memory.peak, memory.overflow_peak)
        room = known.limit / (peak * scale)
        steps = (known.factors_above_lowest <= room).sum()
        factor = paddle.gather(known.factors, steps)
        fitted = C_ops.clip(scale * factor, *known.bounds)
        fitted = C_ops.where(usable, fitted, scale)
        grew = fitted > scale
        paddle.assign(fitted, output=scale)
        paddle.assign(C_ops.where(grew, now, memory.grown_at), output=memory.grown_at)
        return grew

    # -- the state dict -------------------------------------------------------------------

    @classmethod
    def memory_from_state(cls, value: Any, name: str) -> dict[str, Any]:
        # Where each field of the memory may lie; those in FLOATS are numbers, the rest ints.
        bounds: dict[str, tuple[Any, Any]] = {
            "peak": (0, FLOAT32_MAX),
            "overflow_peak": (0, FLOAT32_MAX),
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


def _in_float32(memory: HeadroomMemory) -> HeadroomMemory:
    """``memory`` with its ``FLOATS`` as float32 numbers, as the device holds them."""
    return dataclasses.replace(
        memory, **{name: np.float32(getattr(memory, name)) for name in memory.FLOATS}
    )


def calibration_stride(decr_ratio: float) -> np.float32:
    """The calibration's extra back-off factor, ``decr_ratio ** (CALIBRATION_STRIDE - 1)``
    rounded to float32 (both forms use this value)."""
    return np.float32(decr_ratio ** (CALIBRATION_STRIDE - 1))


# Compared by identity: each is made once (``_constants``), and keys its device copies.
@dataclasses.dataclass(frozen=True, eq=False)
class _Constants:
    """The numbers a measured iteration works with, in float32, as both forms use them."""

    limit: np.float32  # FLOAT16_MAX / 2**margin
    peak_fall: np.float32  # the peak's forgetting since the last measurement
    stale: np.float32  # 2**STALE_BITS
    overflow_fall: np.float32  # overflow_peak's fall since the last measurement
    # FLOAT16_MAX * incr_ratio / 2**MARGIN: over a scale that overflowed, the peak whose
    # fit keeps the scale a growth below it.
    overflow_limit: np.float32
    min_scale: np.float32
    cap: np.float32
    calibration_stride: np.float32
    factors: np.ndarray  # incr_ratio**k for k = -MAX_FIT_STEPS .. MAX_FIT_STEPS

    def on(self, place: Any) -> _OnDevice:
        key = (self, str(place))
        if key not in _made:
            _made[key] = _OnDevice(self, place)
        return _made[key]


@functools.cache
def _constants(rule: HeadroomRule, since: int, calibrating: bool) -> _Constants:
    margin = CALIBRATION_MARGIN if calibrating else MARGIN
    steps = np.arange(-MAX_FIT_STEPS, MAX_FIT_STEPS + 1, dtype=np.float64)
    with np.errstate(over="ignore"):
        factors = np.power(rule.incr_ratio, steps).astype(np.float32)
    return _Constants(
        limit=np.float32(FLOAT16_MAX / 2**margin),
        peak_fall=np.float32(2.0 ** (-since / PEAK_HALF_LIFE)),
        stale=np.float32(2.0**STALE_BITS),
        overflow_fall=np.float32(rule.incr_ratio ** (-since / rule.incr_every_n_steps)),
        overflow_limit=np.float32(FLOAT16_MAX * rule.incr_ratio / 2**MARGIN),
        min_scale=np.float32(rule.min_scale),
        cap=np.float32(rule._cap),
        calibration_stride=calibration_stride(rule.decr_ratio),
        factors=factors,
    )


class _OnDevice:
    """``_Constants`` as [1] device tensors (``factors`` whole), made once per place: a
    measured iteration then copies nothing from the host but its number."""

    def __init__(self, constants: _Constants, place: Any) -> None:
        def tensor(values: Any, dtype: Any = paddle.float32) -> Tensor:
            return paddle.to_tensor(values, dtype=dtype, place=place)

        self.limit = tensor([constants.limit])
        self.overflow_limit = tensor([constants.overflow_limit])
        self.bounds = (float(constants.min_scale), float(constants.cap))
        self.factors = tensor(constants.factors)
        self.factors_above_lowest = tensor(constants.factors[1:])
        self.calibration_stride = float(constants.calibration_stride)
        self.zero = tensor([0.0])


_made: dict[tuple[_Constants, str], _OnDevice] = {}
