"""The update rules: what every rule is (``Rule``; ``Memory``, what it remembers between
iterations), Paddle's rule (``IntervalRule``) and the headroom policy (``HeadroomRule``),
and the registry that turns ``policy="headroom"`` into a type (``RULES``).

Each rule's device update is one method, ``adjust_``, read top to bottom. ``IntervalRule``
also has ``adjust``, the same rule on host numbers: the specification the tests hold the
device form to, and the form MindSpore's host-side managers run.
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
from .kernels import C_ops
from .validation import FLOAT16_MAX, FLOAT32_MAX, INT32_MAX


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

    def _made_once(self, key: Any, place: Any, make: Callable[[], Any]) -> Any:
        made, where = self.__dict__["_on_device"], (key, str(place))
        if where not in made:
            made[where] = make()

        return made[where]

    def placeholder(self, place: Any, dtype: Any) -> Tensor:
        """The rule's [1] zero of ``dtype`` on ``place``, for a kernel argument that does not
        matter (``update_loss_scaling``'s ``xs``; with ``stop_update``, scale and counters).
        """
        return self._made_once(
            ("placeholder", str(dtype)),
            place,
            lambda: paddle.to_tensor([0], dtype=dtype, place=place),
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
        backs off): from the verdicts alone, so a scaler can keep them on the host.
        """
        if found:
            decr_count += 1
            acts = decr_count == self.decr_every_n_nan_or_inf
            return 0, 0 if acts else decr_count, acts

        incr_count += 1
        acts = incr_count == self.incr_count_limit
        return 0 if acts else incr_count, 0, acts

    def adjust_(
        self,
        memory: Memory,
        found: Tensor,
        amax: Tensor | None = None,
        iteration: int = 0,
        loss_finite: Tensor | None = None,
    ) -> Tensor:
        """The rule on ``memory``'s device tensors, in place, after ``iteration`` (1-based),
        from a bool [1] verdict and, where measured, the amax; ``loss_finite``: whether the
        iteration's loss was finite (None: not known). Returns whether it acted, a bool [1]
        tensor, and reads nothing.

        Here Paddle's kernel, the whole of ``IntervalRule``'s device form (``adjust`` is its
        specification), which ignores ``amax``, ``iteration`` and ``loss_finite``; a rule
        that does more writes its own.
        """
        return self.paddles_update_(memory, found)

    def paddles_update_(self, memory: Memory, found: Tensor) -> Tensor:
        """``count`` and its move on the device, shared by every rule: Paddle's
        ``update_loss_scaling`` kernel, one launch, with ``incr_count_limit`` as its period.
        Returns whether the rule acted, a bool [1] tensor.

        The kernel floors the scale at 1.0, backs off by multiplying, refuses a growth that
        would overflow float32, and resets the verdict's counter exactly when it acts,
        leaving the other at 0. A lower ``min_scale`` or a ``backoff_divisor`` redoes its
        back-off, and a higher floor or a ``max_scale`` clips after it.
        """
        scale = memory.scale
        redone = self.min_scale < 1.0 or self.backoff_divisor is not None
        before = scale.clone() if redone else None

        # The gradients were dealt with before: ``xs`` is a placeholder (the facts in
        # ``kernels``).
        kernels.C_ops.update_loss_scaling_(
            [self.placeholder(scale.place, paddle.float32)],
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
        state dict's ``state_key`` entry.
        """
        counted = [field.name for field in dataclasses.fields(Memory)]
        return {key: value for key, value in memory.numbers().items() if key not in counted}

    @classmethod
    def memory_from_state(cls, value: Any, name: str) -> dict[str, Any]:
        """``memory_to_state``'s dict, checked (``ValueError`` naming ``name``), as keyword
        arguments of ``memory_type``: floats from 0 to float32's largest, ints (iterations)
        from their default, "never", to int32's largest.
        """
        memory = cls.memory_type
        # The fields past Memory's own.
        extra = dataclasses.fields(memory)[len(dataclasses.fields(Memory)) :]
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
        ``amax`` and ``iteration``. Its device form is ``adjust_``; MindSpore's host-side
        managers run this one, in Python floats.
        """
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
                       peak whose fit is a growth below the scale that overflowed (a
                       back-off whose loss was already inf/nan lowers the anchor with it:
                       no scale caused it)
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
        self,
        memory: Memory,
        found: Tensor,
        amax: Tensor | None = None,
        iteration: int = 0,
        loss_finite: Tensor | None = None,
    ) -> Tensor:
        """In place on ``memory``'s device tensors, after ``iteration`` (1-based): ``Rule``'s
        back-off every iteration, at its cost; in a measured one (``amax``: the largest
        magnitude of the checked scaled gradients) the rest, some forty device operations.
        Returns whether it grew or backed off (a fit downward is neither), a bool [1] tensor.
        """
        tensors = cast(HeadroomMemory, memory)
        backed_off = self._back_off_(tensors, found, loss_finite)
        if amax is None:
            return backed_off

        scale = tensors.scale
        constants = self._constants(iteration, scale.place)

        # Calibrate: an overflow in the first iterations backs off several steps at once.
        # Lowered, the scale stays under the ceiling: clipping to both bounds applies the
        # floor, with no bound tensor to keep.
        if constants.calibrating:
            lowered = C_ops.clip(scale * constants.calibration_factor, *constants.bounds)
            paddle.assign(C_ops.where(backed_off, lowered, scale), output=scale)

        now = paddle.full_like(tensors.grown_at, iteration)
        amax = C_ops.where(found, constants.zero, amax)
        finite = amax > 0
        usable = paddle.logical_and(finite, amax <= FLOAT16_MAX)

        # What an overflow soon after a growth proved, falling a growth per period.
        overflow_peak = tensors.overflow_peak * constants.overflow_fall
        too_high = paddle.logical_and(
            scale < tensors.anchor, tensors.grown_at >= now - self.incr_every_n_steps // 4
        )
        raised = C_ops.maximum(overflow_peak, constants.overflow_limit / tensors.anchor)
        paddle.assign(C_ops.where(too_high, raised, overflow_peak), output=tensors.overflow_peak)

        # The peak forgets, takes the true amax, and is never stale by more than stale_bits.
        peak = tensors.peak * constants.peak_fall
        latest = amax / scale
        fresh = C_ops.minimum(C_ops.maximum(peak, latest), latest * constants.stale)
        paddle.assign(C_ops.where(usable, fresh, peak), output=tensors.peak)

        # The fit: the largest whole number of growth steps that keeps the peak in room.
        room = constants.limit / (C_ops.maximum(tensors.peak, tensors.overflow_peak) * scale)
        steps = (constants.factors_above_lowest <= room).sum()
        fitted = C_ops.clip(scale * paddle.gather(constants.factors, steps), *constants.bounds)
        fitted = C_ops.where(usable, fitted, scale)
        grew = fitted > scale
        paddle.assign(fitted, output=scale)
        paddle.assign(C_ops.where(grew, now, tensors.grown_at), output=tensors.grown_at)

        # Remembered for the next measured iteration.
        paddle.assign(scale, output=tensors.anchor)
        paddle.assign(C_ops.where(finite, amax, tensors.amax), output=tensors.amax)
        return paddle.logical_or(backed_off, grew)

    def _back_off_(
        self, tensors: HeadroomMemory, found: Tensor, loss_finite: Tensor | None
    ) -> Tensor:
        """Back off as every rule does, at its cost, in every iteration; returns whether
        it did.

        A back-off whose loss was already inf/nan tells of the forward pass, not of the
        scale: the anchor follows it down, so that the next measurement does not take it
        for a scale that was too high, and the fit climbs back.
        """
        backed_off = self.paddles_update_(tensors, found)
        if loss_finite is not None:
            forward = paddle.logical_and(backed_off, paddle.logical_not(loss_finite))
            lowered = tensors.anchor * self.decr_ratio
            paddle.assign(C_ops.where(forward, lowered, tensors.anchor), output=tensors.anchor)

        return backed_off

    def _constants(self, iteration: int, place: Any) -> _MeasuredIteration:
        """The numbers of measured iteration ``iteration``, made once per place for each
        spacing since the last measured one.
        """
        calibrating = iteration <= self.calibration_iterations
        since = 1
        if not calibrating:
            every = cast(int, self.measure_every)
            since = iteration - max((iteration - 1) // every * every, self.calibration_iterations)

        def make() -> _MeasuredIteration:
            return _MeasuredIteration(self, since, calibrating, place)

        constants: _MeasuredIteration = self._made_once((since, calibrating), place, make)
        return constants


class _MeasuredIteration:
    """A measured iteration's numbers, in float32 as on the device: scalars as Python floats,
    the rest as tensors on ``place``, among them ``incr_ratio**k`` for |k| <= max_fit_steps.
    """

    def __init__(self, rule: HeadroomRule, since: int, calibrating: bool, place: Any) -> None:
        def single(value: float) -> float:
            return float(np.float32(value))

        def tensor(values: Any) -> Tensor:
            return paddle.to_tensor(values, dtype=paddle.float32, place=place)

        self.calibrating = calibrating
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


# The rules by name: the one place where ``policy="headroom"`` becomes a type. Past the
# constructor and the state dict, the rule itself answers.
RULES: dict[str, type[Rule]] = {rule.name: rule for rule in (IntervalRule, HeadroomRule)}


def rule_named(name: object, argument: str = "policy") -> type[Rule]:
    """The rule type called ``name``; ``ValueError`` naming ``argument`` and the names."""
    if not isinstance(name, str) or name not in RULES:
        accepted = " or ".join(repr(choice) for choice in RULES)
        raise ValueError(f"{argument} must be {accepted}, got {name!r}")

    return RULES[name]


def rule_from_arguments(
    policy: object,
    incr_ratio: Any,
    decr_ratio: Any,
    incr_every_n_steps: Any,
    decr_every_n_nan_or_inf: Any,
    min_scale: Any,
    max_scale: Any,
    measure_every: Any,
) -> Rule:
    """The rule a scaler's constructor arguments describe, each checked (a ``ValueError``
    or ``TypeError`` naming the argument, by the constructor's names).
    """
    lower, upper = validation.check_bounds(min_scale, max_scale)
    rule_type = rule_named(policy)
    settings = validation.check_rule_settings(
        incr_ratio, decr_ratio, incr_every_n_steps, decr_every_n_nan_or_inf
    )
    if measure_every is not None:
        # Else the rule's own: never for the interval rule, every 64th for headroom.
        settings["measure_every"] = validation.check_period(measure_every, "measure_every")

    return rule_type(**settings, min_scale=lower, max_scale=upper)


def check_fixable(rule: Rule, dynamic: bool) -> bool:
    """``dynamic`` (``use_dynamic_loss_scaling``), where ``rule`` allows it: a policy other
    than Paddle's moves a dynamic scale, and refuses a fixed one (``ValueError``).
    """
    if not dynamic and type(rule) is not IntervalRule:
        raise ValueError(
            f"policy={rule.name!r} moves a dynamic scale, and use_dynamic_loss_scaling="
            "False fixes the scale: drop policy, or keep the scale dynamic"
        )

    return dynamic
