"""``HeadroomRule``, the headroom policy as a type, and ``HeadroomMemory``, what it remembers.
Why it fits the scale to the amax, at what cost: ``docs/concepts.md``, "The headroom policy".
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, cast

import numpy as np
import paddle
from paddle import Tensor

from .interval import Memory, Rule
from .kernels import C_ops
from .validation import FLOAT16_MAX, FLOAT32_MAX

# "Never grew", as an iteration number (an int32 on the device).
NEVER = -(2**30)


@dataclasses.dataclass(frozen=True)
class HeadroomMemory(Memory):
    """``Memory``, and what the headroom rule learns.

    Args:
        peak: the largest true (unscaled) amax measured lately, forgetting a bit every
            ``peak_half_life`` iterations (0: none yet).
        overflow_peak: the peak whose fit keeps the scale a growth below one that overflowed soon
            after it was reached, falling a growth per ``incr_every_n_steps`` iterations (0: none).
        anchor: the scale after the last measured iteration (0: none yet).
        grown_at: the iteration of the last growth (``NEVER``: none).
        amax: the amax of the last finite measured iteration (0: none yet).
    """

    FLOATS: ClassVar[tuple[str, ...]] = ("scale", "peak", "overflow_peak", "anchor", "amax")

    peak: Any = 0.0
    overflow_peak: Any = 0.0
    anchor: Any = 0.0
    grown_at: Any = NEVER
    amax: Any = 0.0


@dataclasses.dataclass(frozen=True)
class HeadroomRule(Rule):
    """Fit the scale, both ways, to the largest amax of late, a margin below float16's
    ceiling, and keep a growth below any scale that overflowed soon after it was reached::

        back off as the interval rule does; never grow by the counters
        if measured:
            calibrate: an overflow in the first iterations backs off
                       calibration_stride steps at once
            overflow:  overflow_peak falls a growth per incr_every_n_steps iterations; an
                       overflow within a quarter of that after a growth raises it to the
                       peak whose fit is a growth below the scale that overflowed
            peak:      halves every peak_half_life iterations (peak_half_life_periods
                       periods); the larger of it and the true amax, but at most
                       2**stale_bits times that amax
            fit:       the scale becomes the one, in whole growth steps (at most max_fit_steps),
                       that keeps max(peak, overflow_peak) * scale at most 65504 / 2**margin
                       (calibration_margin in the first iterations)

    Why each step: ``docs/concepts.md``, "The headroom policy". A finite amax above 65504 is
    not of float16 gradients: the rule holds the scale. ``incr_every_n_steps`` is how long
    a scale that overflowed is held off; ``measure_every`` is 64 unless the scaler sets one.

    Args (beyond ``Rule``'s; the policy's tuning, which the scalers leave as they are):
        margin: bits kept between the peak amax and float16's ceiling.
        calibration_margin: the same, while the peak rests on the first measurements.
        peak_half_life_periods: the peak halves in this many periods (512 iterations at 64).
        stale_bits: bits the peak may stand above the latest amax.
        max_fit_steps: the most growth steps one fit moves the scale, either way.
        calibration_iterations: the first iterations, all measured.
        calibration_stride: an overflow among them backs off this many steps at once.
    """

    name: ClassVar[str] = "headroom"
    memory_type: ClassVar[type[Memory]] = HeadroomMemory
    state_key: ClassVar[str | None] = "headroom"
    fits_amax: ClassVar[bool] = True

    measure_every: int | None = 64
    margin: int = 1
    calibration_margin: int = 2
    peak_half_life_periods: int = 8
    stale_bits: int = 3
    max_fit_steps: int = 24
    calibration_iterations: int = 3
    calibration_stride: int = 8

    @property
    def peak_half_life(self) -> int:
        """The peak halves in this many iterations: its memory follows the period."""
        return self.peak_half_life_periods * cast(int, self.measure_every)

    def measures(self, iteration: int) -> bool:
        return iteration <= self.calibration_iterations or super().measures(iteration)

    def adjust_(
        self, memory: Memory, found: Tensor, amax: Tensor | None = None, iteration: int = 0
    ) -> Tensor:
        """In place on ``memory``'s device tensors, after ``iteration`` (1-based): ``Rule``'s
        back-off every iteration, at its cost; in a measured one (``amax``: the largest
        magnitude of the checked scaled gradients) the rest, some forty device operations.
        Returns whether it grew or backed off (a fit downward is neither), a bool [1] tensor."""
        backed_off = super().adjust_(memory, found)
        if amax is None:
            return backed_off
        tensors = cast(HeadroomMemory, memory)
        scale, place = tensors.scale, tensors.scale.place
        calibrating = iteration <= self.calibration_iterations
        since = 1  # iterations since the last measured one
        if not calibrating:
            every = cast(int, self.measure_every)
            since = iteration - max((iteration - 1) // every * every, self.calibration_iterations)
        known: _MeasuredIteration = self._kept(
            (since, calibrating), place, lambda: _MeasuredIteration(self, since, calibrating, place)
        )
        if calibrating:
            # Lowered, the scale stays under the ceiling: clipping to both bounds applies
            # the floor, with no bound tensor to keep.
            lowered = C_ops.clip(scale * known.calibration_factor, *known.bounds)
            paddle.assign(C_ops.where(backed_off, lowered, scale), output=scale)
        now = paddle.full_like(tensors.grown_at, iteration)
        amax = C_ops.where(found, known.zero, amax)
        finite = amax > 0
        usable = paddle.logical_and(finite, amax <= FLOAT16_MAX)

        # What an overflow soon after a growth proved, falling a growth per period.
        overflow_peak = tensors.overflow_peak * known.overflow_fall
        too_high = paddle.logical_and(
            scale < tensors.anchor, tensors.grown_at >= now - self.incr_every_n_steps // 4
        )
        raised = C_ops.maximum(overflow_peak, known.overflow_limit / tensors.anchor)
        paddle.assign(C_ops.where(too_high, raised, overflow_peak), output=tensors.overflow_peak)

        # The peak forgets, takes the true amax, and is never stale by more than stale_bits.
        peak = tensors.peak * known.peak_fall
        latest = amax / scale
        fresh = C_ops.minimum(C_ops.maximum(peak, latest), latest * known.stale)
        paddle.assign(C_ops.where(usable, fresh, peak), output=tensors.peak)

        # The fit: the largest whole number of growth steps that keeps the peak in room.
        room = known.limit / (C_ops.maximum(tensors.peak, tensors.overflow_peak) * scale)
        steps = (known.factors_above_lowest <= room).sum()
        fitted = C_ops.clip(scale * paddle.gather(known.factors, steps), *known.bounds)
        fitted = C_ops.where(usable, fitted, scale)
        grew = fitted > scale
        paddle.assign(fitted, output=scale)
        paddle.assign(C_ops.where(grew, now, tensors.grown_at), output=tensors.grown_at)

        paddle.assign(scale, output=tensors.anchor)
        paddle.assign(C_ops.where(finite, amax, tensors.amax), output=tensors.amax)
        return paddle.logical_or(backed_off, grew)


class _MeasuredIteration:
    """A measured iteration's numbers, in float32 as on the device: scalars as Python floats,
    the rest as tensors on ``place``, among them ``incr_ratio**k`` for |k| <= max_fit_steps."""

    def __init__(self, rule: HeadroomRule, since: int, calibrating: bool, place: Any) -> None:
        def single(value: float) -> float:
            return float(np.float32(value))

        def tensor(values: Any) -> Tensor:
            return paddle.to_tensor(values, dtype=paddle.float32, place=place)

        margin = rule.calibration_margin if calibrating else rule.margin
        self.peak_fall = single(2.0 ** (-since / rule.peak_half_life))
        self.overflow_fall = single(rule.incr_ratio ** (-since / rule.incr_every_n_steps))
        self.stale = single(2.0**rule.stale_bits)
        self.calibration_factor = single(rule.decr_ratio ** (rule.calibration_stride - 1))
        self.bounds = (single(rule.min_scale), single(rule.max_scale or FLOAT32_MAX))
        self.limit = tensor([FLOAT16_MAX / 2**margin])
        # Over a scale that overflowed, the peak whose fit keeps the scale a growth below.
        self.overflow_limit = tensor([FLOAT16_MAX * rule.incr_ratio / 2**rule.margin])
        steps = np.arange(-rule.max_fit_steps, rule.max_fit_steps + 1, dtype=np.float64)
        with np.errstate(over="ignore"):
            factors = np.power(rule.incr_ratio, steps).astype(np.float32)
        self.factors = tensor(factors)
        self.factors_above_lowest = tensor(factors[1:])
        self.zero = tensor([0.0])
