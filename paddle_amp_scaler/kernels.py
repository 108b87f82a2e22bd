"""Paddle's AMP kernels, and the device and version facts the scaler must not care about.

Every function here queues work on the device and returns without waiting for it:
nothing in this module reads a tensor back to the host.

Facts kept here:

* ``check_finite_and_unscale_`` takes one dtype per call, and its scale must have the
  kernel's compute dtype: float32 for float16/bfloat16/float32 grads, float64 for
  float64 grads (the CPU build registers float32 and float64 only).
* ``update_loss_scaling_`` refuses an empty ``xs`` and zeroes every tensor of ``xs``
  when ``found_inf`` is set; with ``stop_update=True`` it does only that zeroing.
* Both keep their names and signatures from Paddle 2.6 to 3.x as ``_C_ops`` functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import paddle
from paddle import _C_ops

Tensor = paddle.Tensor


def grads_to_unscale(params: Iterable[Tensor]) -> list[Tensor]:
    """The gradient of each parameter that has one, preferring its master gradient.

    Paddle's master-grad mode accumulates into ``param.main_grad`` (float32) and the
    optimizer reads that one, so it is the gradient that must be unscaled and checked.
    """
    grads = []
    for param in params:
        grad = getattr(param, "main_grad", None)
        if grad is None:
            grad = param._grad_ivar()
        if grad is not None:
            grads.append(grad)
    return grads


def _by_dtype(tensors: Iterable[Tensor]) -> dict:
    groups: dict = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor)
    return groups


def _scale_for(dtype, scale: Tensor) -> Tensor:
    return scale.astype(paddle.float64) if dtype == paddle.float64 else scale


def any_of(flags: Sequence[Tensor]) -> Tensor:
    """Logical OR of bool tensors of shape [1], computed on the device."""
    combined = flags[0]
    for flag in flags[1:]:
        combined = _C_ops.bitwise_or(combined, flag)
    return combined


def unscale_and_check_(grads: Sequence[Tensor], scale: Tensor, all_finite: Tensor) -> Tensor:
    """Multiply ``grads`` in place by 1/scale; return a bool [1] tensor: any inf/nan.

    One kernel launch per dtype group, however many tensors. ``all_finite`` is the
    flag returned when there is nothing to check.
    """
    flags = [
        _C_ops.check_finite_and_unscale_(group, _scale_for(dtype, scale))[1]
        for dtype, group in _by_dtype(grads).items()
    ]
    return any_of(flags) if flags else all_finite


def zero_if_found_(grads: Sequence[Tensor], found_inf: Tensor, scale: Tensor,
                   incr_count: Tensor, decr_count: Tensor) -> None:
    """Set every gradient to zero when ``found_inf`` holds, decided on the device.

    ``stop_update=True`` makes the kernel leave scale and counters alone; they are
    passed only because the kernel's signature wants them.
    """
    for dtype, group in _by_dtype(grads).items():
        _C_ops.update_loss_scaling_(group, found_inf, _scale_for(dtype, scale),
                                    incr_count, decr_count, 1, 1, 2.0, 0.5, True)


def update_scale_(found_inf: Tensor, scale: Tensor, incr_count: Tensor,
                  decr_count: Tensor, scratch: Tensor, *, incr_every_n_steps: int,
                  decr_every_n_nan_or_inf: int, incr_ratio: float,
                  decr_ratio: float) -> None:
    """Apply one step of the dynamic update rule to scale and counters, in place.

    ``scratch`` is a float32 [1] tensor that stands in for the kernel's ``xs``: the
    grads were dealt with before the step, and the kernel refuses an empty list.
    """
    _C_ops.update_loss_scaling_([scratch], found_inf, scale, incr_count, decr_count,
                                incr_every_n_steps, decr_every_n_nan_or_inf,
                                incr_ratio, decr_ratio, False)
