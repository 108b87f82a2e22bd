"""Paddle's AMP kernels, and the device and version facts the scaler must not care about.

``PaddleKernels`` is the unscale path of every GPU, XPU and custom device (and of a
CPU without the compiled helper): unscale and check, the update rule, the zeroing of a
skipped plain-SGD step, each as Paddle kernels. The free functions are the operations
the faces share with it (scale, unscale out of place, an all-finite test).

Every function here queues work on the device and returns without waiting for it:
nothing in this module reads a tensor back to the host.

Facts kept here:

* ``check_finite_and_unscale_`` takes one dtype per call, and its scale must have the
  kernel's compute dtype: float32 for float16/bfloat16/float32 grads, float64 for
  float64 grads (the CPU build registers float32 and float64 only).
* ``check_finite_and_unscale_`` writes its inputs: each value times ``1/scale``, and once
  it meets a non-finite tensor it turns -inf into NaN and zeroes the tensors after it,
  even at a scale of 1. An all-finite test that must leave its inputs alone cannot use it.
* ``update_loss_scaling_`` refuses an empty ``xs`` and zeroes every tensor of ``xs``
  when ``found_inf`` is set; with ``stop_update=True`` it does only that zeroing. It
  floors the scale at 1.0, backs off by multiplying, and resets the counter of the
  verdict's kind exactly when it grows or backs off, leaving the other at 0.
* Both keep their names and signatures from Paddle 2.6 to 3.x as ``_C_ops`` functions.
  Paddle 2.6's ``check_finite_and_unscale`` refuses a tensor with no elements, which
  has nothing to check anyway.
* ``_C_ops.scale`` takes its factor as a tensor on the device and keeps a 0-d tensor
  0-d: one operation, where a multiply by a [1] scale needs a reshape first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import paddle
from paddle import Tensor

from . import rule
from .scale_tensors import ScaleTensors
from .verdict import Verdict

if TYPE_CHECKING:  # typing.TypeGuard needs Python 3.10
    from typing_extensions import TypeGuard

# Untyped for the checker, like the rest of Paddle: Paddle 3 ships a stub of its ops,
# which mypy would follow (follow_imports does not reach stubs) and 2.6 has none.
_C_ops: Any = paddle._C_ops

# Gradients by dtype (a paddle dtype), in parameter order: Paddle's kernels take one
# dtype per call.
GradGroups = dict[Any, list[Tensor]]

FLOAT32_MAX = 3.4028234663852886e38
_INT32_MAX = 2**31 - 1


class PaddleKernels:
    """The unscale path on Paddle's kernels: one launch per dtype group, however many
    tensors; the interval rule in one ``update_loss_scaling`` launch for default bounds.

    The headroom policy measures the amax one iteration in ``measure_every`` (and in
    each of the first ones): one operation per gradient then, and some thirty for its
    rule, so that a step costs on average about what the interval rule's does.
    """

    name = "paddle"
    measure_every = 64
    # Statistics are kept per iteration and added up in batches (statistics.py).
    count_iteration_ = None

    def __init__(self) -> None:
        self._headroom_constants: dict[tuple[rule.Policy, str], _HeadroomConstants] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Constants are made again on first use: Paddle 2.6's tensors do not pickle.
        return {"_headroom_constants": {}}

    def unscale_and_check_(
        self,
        grads: Sequence[Tensor | None],
        scale: Tensor,
        all_finite: Tensor,
        *,
        measure: bool = False,
    ) -> Verdict:
        """Multiply ``grads`` (any dtypes, None for a missing one) in place by 1/scale and
        check them for inf/nan. ``all_finite`` is the flag when there is nothing to check.
        With ``measure``, the verdict also carries the largest magnitude among the grads
        as they came (float32 [1]; NaN is passed over, inf is not)."""
        groups = grads_by_dtype_of(grads)
        # Measured first: the unscale below writes the gradients in place.
        amax = _largest_magnitude(groups) if measure and groups else None
        flags = [
            _C_ops.check_finite_and_unscale_(group, _scale_for(dtype, scale))[1]
            for dtype, group in groups.items()
        ]
        return Verdict(any_of(flags) if flags else all_finite, amax=amax)

    def unscale_check_and_tally_(
        self, grads: Sequence[Tensor], scale: Tensor, all_finite: Tensor, *, measure: bool = False
    ) -> tuple[Verdict, Tensor | None]:
        """``unscale_and_check_`` of ``grads`` (each present and non-empty), also counting
        each one's inf and nan elements before it is unscaled: an int64 [len(grads), 2]
        tensor of (infs, nans), None when there are no grads. Five operations more per
        gradient."""
        if not grads:
            return Verdict(all_finite), None
        tally = paddle.stack(
            [paddle.stack([paddle.isinf(grad).sum(), paddle.isnan(grad).sum()]) for grad in grads]
        )
        return self.unscale_and_check_(grads, scale, all_finite, measure=measure), tally

    def zero_if_found_(self, grads: Sequence[Tensor | None], found_inf: Tensor) -> None:
        """Set every gradient (None for a missing one) to zero when ``found_inf`` holds,
        decided on the device."""
        for dtype, group in grads_by_dtype_of(grads).items():
            # With stop_update=True the kernel only zeroes; it wants a scale of the group's
            # compute dtype and counters all the same.
            scale = stand_in(
                found_inf, paddle.float64 if dtype == paddle.float64 else paddle.float32
            )
            counter = stand_in(found_inf, paddle.int32)
            _C_ops.update_loss_scaling_(
                group, found_inf, scale, counter, counter, 1, 1, 2.0, 0.5, True
            )

    def adjust_(
        self,
        found: Tensor,
        tensors: ScaleTensors,
        policy: rule.Policy,
        *,
        amax: Tensor | None = None,
        iteration: int = 0,
    ) -> Tensor:
        """``rule.advance`` in place from a bool [1] verdict (and, in a measured iteration
        of the headroom policy, the amax, float32 [1]; ``iteration`` is its number);
        returns whether the rule fired, a bool [1] tensor. Nothing is read."""
        if policy.name == "headroom":
            return self._adjust_headroom_(found, tensors, policy, amax, iteration)
        return self._adjust_interval_(found, tensors, policy)

    def _adjust_interval_(
        self, found: Tensor, tensors: ScaleTensors, policy: rule.Policy
    ) -> Tensor:
        """``rule.adjust``. The kernel floors at 1.0 and multiplies: a lower ``min_scale``
        or a ``backoff_divisor`` redoes its back-off, a higher floor or a ``max_scale``
        clips after it (no operation for the default policy)."""
        scale, incr_count, decr_count = tensors.scale, tensors.incr_count, tensors.decr_count
        redo_backoff = policy.min_scale < 1.0 or policy.backoff_divisor is not None
        before = scale.clone() if redo_backoff else None
        # The kernel zeroes its ``xs`` when ``found``, and refuses an empty list: the
        # gradients were dealt with before, so it gets a stand-in.
        _C_ops.update_loss_scaling_(
            [stand_in(scale, paddle.float32)],
            found,
            scale,
            incr_count,
            decr_count,
            policy.incr_every_n_steps,
            policy.decr_every_n_nan_or_inf,
            policy.incr_ratio,
            policy.decr_ratio,
            False,
        )
        # It reset the counter of the verdict's kind and left the other at 0: both are 0
        # exactly when it fired. One operation, the statistics' only one per iteration.
        fired = paddle.equal(incr_count, decr_count)
        if before is not None:
            # Rare settings: readability over the handful of operations they cost.
            backed_off = paddle.logical_and(found, decr_count == 0)
            if policy.backoff_divisor is None:
                lowered = before * policy.decr_ratio
            else:
                lowered = before / paddle.full_like(before, policy.backoff_divisor)
            lowered = paddle.maximum(lowered, paddle.full_like(before, policy.min_scale))
            paddle.assign(paddle.where(backed_off, lowered, scale), output=scale)
        if policy.min_scale > 1.0 or policy.max_scale is not None:
            clip_(scale, policy.min_scale, policy.max_scale)
        return fired

    def _adjust_headroom_(
        self,
        found: Tensor,
        tensors: ScaleTensors,
        policy: rule.Policy,
        amax: Tensor | None,
        iteration: int,
    ) -> Tensor:
        """``rule.adjust_headroom``: the interval rule's back-off, never growing, in every
        iteration (its cost, no more); in a measured one, the rest of the rule in some
        thirty operations on tensors that never leave the device."""
        never_growing = dataclasses.replace(policy, incr_every_n_steps=_INT32_MAX)
        backed_off = self._adjust_interval_(found, tensors, never_growing)
        if amax is None:
            return backed_off
        known = self._constants_for(policy, tensors.scale)
        scale, margin = tensors.scale, tensors.margin
        if iteration <= rule.CALIBRATION_ITERATIONS:
            lowered = _C_ops.maximum(scale * known.calibration_stride, known.min_scale)
            paddle.assign(_C_ops.where(backed_off, lowered, scale), output=scale)
        now = paddle.full([1], iteration, dtype=paddle.int32)
        recent = paddle.greater_equal(tensors.grown_at, now - policy.incr_every_n_steps // 4)
        learn = paddle.logical_and(paddle.less_than(scale, tensors.anchor), recent)
        usable = paddle.logical_and(
            paddle.logical_not(found), paddle.greater_than(amax, known.zero)
        )
        # Unchanged for a period, and not learning now: learning and narrowing at once
        # would leave the margin where it was.
        stale = paddle.less_equal(tensors.margin_at, now - policy.incr_every_n_steps)
        quiet = paddle.logical_and(paddle.logical_and(usable, stale), paddle.logical_not(learn))
        step = learn.astype(paddle.int32) - quiet.astype(paddle.int32)
        _C_ops.clip_(_C_ops.add_(margin, step), rule.MIN_MARGIN, rule.MAX_MARGIN)
        changed = paddle.logical_or(learn, quiet)
        paddle.assign(_C_ops.where(changed, now, tensors.margin_at), output=tensors.margin_at)
        # How many growth steps fit below the margin's limit; none where nothing was
        # usable (an inf amax fits none).
        usable_amax = _C_ops.where(usable, amax, known.infinity)
        limit = paddle.gather(known.limits, margin)
        fits = paddle.less_equal(usable_amax * known.growth_factors, limit)
        grown = _C_ops.minimum(scale * paddle.gather(known.factors, fits.sum()), known.cap)
        grew = paddle.greater_than(grown, scale)
        paddle.assign(grown, output=scale)
        # A growth is charged one bit of margin at most: learning forgets it.
        grown_at = _C_ops.where(learn, known.never, tensors.grown_at)
        paddle.assign(_C_ops.where(grew, now, grown_at), output=tensors.grown_at)
        paddle.assign(_C_ops.where(usable, amax, tensors.amax), output=tensors.amax)
        paddle.assign(scale, output=tensors.anchor)
        return paddle.logical_or(backed_off, grew)

    def _constants_for(self, policy: rule.Policy, beside: Tensor) -> _HeadroomConstants:
        key = (policy, str(beside.place))
        if key not in self._headroom_constants:
            self._headroom_constants[key] = _HeadroomConstants(policy, beside.place)
        return self._headroom_constants[key]


class _HeadroomConstants:
    """The headroom rule's constants as device tensors, made once per policy and place:
    a measured iteration then makes no tensor from a host value but its number."""

    def __init__(self, policy: rule.Policy, place: Any) -> None:
        def on_device(values: Any, dtype: Any) -> Tensor:
            return paddle.to_tensor(values, dtype=dtype, place=place)

        self.calibration_stride = rule.calibration_stride(policy.decr_ratio)
        self.min_scale = on_device([policy.min_scale], paddle.float32)
        cap = rule.FLOAT32_MAX if policy.max_scale is None else policy.max_scale
        self.cap = on_device([cap], paddle.float32)
        self.zero = on_device([0.0], paddle.float32)
        self.infinity = on_device([np.inf], paddle.float32)
        self.never = on_device([rule.NEVER], paddle.int32)
        factors = rule.growth_factors(policy.incr_ratio)
        self.factors = on_device(factors, paddle.float32)
        self.growth_factors = on_device(factors[1:], paddle.float32)
        self.limits = on_device(rule.margin_limits(), paddle.float32)


def _largest_magnitude(groups: GradGroups) -> Tensor:
    """The largest magnitude in every gradient of ``groups``, float32 [1]: one operation
    per gradient, and two or three per dtype group."""
    largest: Tensor | None = None
    for group in groups.values():
        norms = paddle.stack([_C_ops.p_norm(grad, np.inf, 0, 1e-12, False, True) for grad in group])
        group_max = _C_ops.max(norms, [], True)
        if group_max.dtype != paddle.float32:
            group_max = group_max.astype(paddle.float32)
        largest = group_max if largest is None else _C_ops.maximum(largest, group_max)
    return cast(Tensor, largest)


def grads_by_dtype_of(grads: Iterable[Tensor | None]) -> GradGroups:
    """Gradients grouped by dtype, leaving out ``None`` and empty ones: Paddle's kernels
    take one dtype per call."""
    groups: GradGroups = {}
    # Hashing a Paddle dtype costs half a microsecond; neighbours mostly share one,
    # and Paddle 3 returns the same dtype object for each.
    last_dtype, last_group = None, []
    for grad in grads:
        if is_checked(grad):
            dtype = grad.dtype
            if dtype is not last_dtype:
                last_dtype, last_group = dtype, groups.setdefault(dtype, [])
            last_group.append(grad)
    return groups


def is_checked(grad: Tensor | None) -> TypeGuard[Tensor]:
    """Whether a gradient goes to the kernels: it exists and has elements."""
    # `0 not in shape`, not `grad.size`: Paddle computes size through NumPy (~6 us).
    return grad is not None and 0 not in grad.shape


def _scale_for(dtype: Any, scale: Tensor) -> Tensor:
    return scale.astype(paddle.float64) if dtype == paddle.float64 else scale


def scaled(tensor: Tensor, scale: Tensor) -> Tensor:
    """A new tensor holding ``tensor * scale``: float64 for float64, else float32 (a
    float16 loss times a large scale would overflow in float16)."""
    if tensor.dtype not in (paddle.float32, paddle.float64):
        tensor = tensor.astype(paddle.float32)
    # One operation that keeps the tensor's shape (a 0-d loss stays 0-d); it takes the
    # factor from the device, in the tensor's precision.
    return _C_ops.scale(tensor, scale, 0.0, True)


def unscaled(tensor: Tensor, scale: Tensor) -> Tensor:
    """A new tensor holding ``tensor * (1 / scale)`` in ``tensor``'s dtype, computed as the
    unscale kernel computes it (float16 and bfloat16 through float32)."""
    inverse = paddle.reciprocal(_scale_for(tensor.dtype, scale)).reshape([])
    if tensor.dtype in (paddle.float16, paddle.bfloat16):
        return (tensor.astype(paddle.float32) * inverse).astype(tensor.dtype)
    return tensor * inverse


def largest_of(amaxes: Sequence[Tensor | None]) -> Tensor | None:
    """The largest of float32 [1] amaxes, on the device; None if any is None (an
    iteration is measured only where every unscale in it was)."""
    if not amaxes or any(amax is None for amax in amaxes):
        return None
    largest = cast(Tensor, amaxes[0])
    for amax in amaxes[1:]:
        largest = _C_ops.maximum(largest, amax)
    return largest


def any_of(flags: Sequence[Tensor]) -> Tensor:
    """Logical OR of bool tensors of shape [1], computed on the device."""
    combined = flags[0]
    for flag in flags[1:]:
        combined = _C_ops.bitwise_or(combined, flag)
    return combined


def all_finite(tensors: Iterable[Tensor]) -> Tensor:
    """A bool [1] tensor: no inf/nan in ``tensors``, decided on the device; the tensors
    are left as they are (the unscale kernel would write them). Integer and bool
    tensors are always finite."""
    finite = paddle.ones([1], dtype=paddle.bool)
    checked = [tensor for tensor in tensors if tensor.is_floating_point() and tensor.size]
    if checked:
        each = paddle.stack([paddle.isfinite(tensor).all() for tensor in checked])
        finite = each.all().reshape([1])
    return finite


def on_cpu(place: Any) -> bool:
    """Whether ``place`` is the host."""
    # Paddle 2.6's expected place is a CPUPlace, which has no is_cpu_place().
    return isinstance(place, paddle.CPUPlace) or (
        hasattr(place, "is_cpu_place") and bool(place.is_cpu_place())
    )


def clip_(tensor: Tensor, lower: float, upper: float | None) -> None:
    """Clamp ``tensor`` into ``[lower, upper]`` in place (None: no upper bound)."""
    _C_ops.clip_(tensor, lower, FLOAT32_MAX if upper is None else upper)


def clamp_below_(counter: Tensor, period: int) -> None:
    """Lower ``counter`` to at most ``period - 1`` in place, with no read of it."""
    paddle.assign(paddle.minimum(counter, paddle.full_like(counter, period - 1)), output=counter)


_stand_ins: dict[tuple[str, str], Tensor] = {}


def stand_in(beside: Tensor, dtype: Any) -> Tensor:
    """A [1] tensor of zero on ``beside``'s place, for a kernel argument whose value does
    not matter; made once per place and dtype, and never written by the caller."""
    key = (str(beside.place), str(dtype))
    if key not in _stand_ins:
        _stand_ins[key] = paddle.to_tensor([0], dtype=dtype, place=beside.place)
    return _stand_ins[key]
