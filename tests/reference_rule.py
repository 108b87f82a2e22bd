"""The tests' references for the update rules: ``IntervalRule.adjust`` itself, the rule's
specification (test_rule.py holds it to worked examples and to the pseudo-code), with a
count of how often it acted, for the statistics; and the headroom rule's specification,
written here on host numbers apart from the package's one form, on the device."""

from __future__ import annotations

import dataclasses

import numpy as np

from paddle_amp_scaler.core.rules import IntervalRule, Memory
from paddle_amp_scaler.core.validation import FLOAT16_MAX, FLOAT32_MAX


class ReferenceScaler:
    """A scaler's scale and counters as ``IntervalRule.adjust`` moves them, in float32."""

    def __init__(
        self,
        scale: float,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 1000,
        decr_every_n_nan_or_inf: int = 1,
        dynamic: bool = True,
        min_scale: float = 1.0,
        max_scale: float | None = None,
    ):
        self.rule = IntervalRule(
            incr_ratio,
            decr_ratio,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
            min_scale,
            max_scale,
        )
        self.memory = Memory(np.float32(scale))
        self.dynamic = dynamic
        # How often the rule acted: a growth refused at float32's limit, or a back-off held
        # at the floor, still counts.
        self.growths = 0
        self.backoffs = 0

    def update(self, found_inf: bool) -> None:
        if not self.dynamic:
            return
        self.memory, acted = self.rule.adjust(self.memory, found_inf)
        if acted:
            if found_inf:
                self.backoffs += 1
            else:
                self.growths += 1

    @property
    def scale(self) -> float:
        return float(self.memory.scale)

    @property
    def incr_count(self) -> int:
        return self.memory.incr_count

    @property
    def decr_count(self) -> int:
        return self.memory.decr_count

    def snapshot(self):
        return self.scale, self.incr_count, self.decr_count


def headroom_adjust(rule, memory, found, amax=None, iteration=0, loss_finite=True):
    """The headroom rule's specification on host numbers, written apart from its device
    form (``HeadroomRule.adjust_``), which test_rule.py holds to it: the memory after
    ``iteration`` (1-based) and whether the rule grew or backed off (a fit downward is
    neither). ``amax`` is the largest magnitude among the scaled gradients checked, None
    where the iteration was not measured; ``loss_finite``, whether the iteration's loss
    was finite. Every number is float32, as on the device."""
    incr_count, decr_count, backed_off = rule.count(memory.incr_count, memory.decr_count, found)
    scale = memory.scale
    if backed_off:
        scale = max(scale * np.float32(rule.decr_ratio), np.float32(rule.min_scale))
    memory = dataclasses.replace(
        memory,
        scale=np.float32(scale),
        incr_count=incr_count,
        decr_count=decr_count,
        **{name: np.float32(getattr(memory, name)) for name in memory.FLOATS if name != "scale"},
    )
    # A back-off the loss caused (inf/nan before scaling) is no sign that the scale was
    # too high: the anchor the next measurement compares with goes down with it.
    if backed_off and not loss_finite:
        anchor = np.float32(memory.anchor * np.float32(rule.decr_ratio))
        memory = dataclasses.replace(memory, anchor=anchor)
    if amax is None:
        return memory, backed_off
    calibrating = iteration <= rule.calibration_iterations
    floor, cap = np.float32(rule.min_scale), np.float32(rule.max_scale or FLOAT32_MAX)
    if backed_off and calibrating:
        stride = np.float32(rule.decr_ratio ** (rule.calibration_stride - 1))
        memory = dataclasses.replace(memory, scale=max(memory.scale * stride, floor))
    if calibrating:
        since = 1
    else:
        previous = (iteration - 1) // rule.measure_every * rule.measure_every
        since = iteration - max(previous, rule.calibration_iterations)
    amax = np.float32(0.0 if found else amax)
    usable = bool(0 < amax <= FLOAT16_MAX)
    # The overflow's bound falls a growth per incr_every_n_steps; an overflow within a
    # quarter of that after a growth raises it to a growth below the scale that overflowed.
    overflow_peak = memory.overflow_peak * np.float32(
        rule.incr_ratio ** (-since / rule.incr_every_n_steps)
    )
    if memory.scale < memory.anchor and memory.grown_at >= iteration - rule.incr_every_n_steps // 4:
        limit = np.float32(FLOAT16_MAX * rule.incr_ratio / 2**rule.margin)
        overflow_peak = max(overflow_peak, limit / memory.anchor)
    # The peak forgets a bit per half-life and is never stale by more than stale_bits.
    peak = memory.peak * np.float32(2.0 ** (-since / rule.peak_half_life))
    if usable:
        latest = amax / memory.scale
        peak = min(max(peak, latest), latest * np.float32(2.0**rule.stale_bits))
    memory = dataclasses.replace(memory, overflow_peak=overflow_peak, peak=peak)
    grew = False
    if usable:
        margin = rule.calibration_margin if calibrating else rule.margin
        with np.errstate(over="ignore", divide="ignore"):
            room = np.float32(FLOAT16_MAX / 2**margin) / (max(peak, overflow_peak) * memory.scale)
            steps = np.arange(-rule.max_fit_steps, rule.max_fit_steps + 1, dtype=np.float64)
            factors = np.power(rule.incr_ratio, steps).astype(np.float32)
            fitted = memory.scale * factors[int(np.count_nonzero(factors[1:] <= room))]
        fitted = min(max(fitted, floor), cap)
        grew = bool(fitted > memory.scale)
        memory = dataclasses.replace(
            memory, scale=fitted, grown_at=iteration if grew else memory.grown_at
        )
    memory = dataclasses.replace(
        memory, anchor=memory.scale, amax=amax if amax > 0 else memory.amax
    )
    return memory, backed_off or grew


def reference_adjust(rule, memory, found, amax=None, iteration=0, loss_finite=True):
    """Either rule's specification: ``IntervalRule.adjust``, or ``headroom_adjust``."""
    if isinstance(rule, IntervalRule):
        return rule.adjust(memory, found)
    return headroom_adjust(rule, memory, found, amax, iteration, loss_finite)
