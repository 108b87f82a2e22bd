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
  Paddle 2.6's ``check_finite_and_unscale`` refuses a tensor with no elements, which
  has nothing to check anyway.
* ``_C_ops.scale`` takes its factor as a tensor on the device and keeps a 0-d tensor
  0-d: one operation, where a multiply by a [1] scale needs a reshape first.
* On CPU, ``check_finite_and_unscale`` makes three passes per tensor, and each Paddle
  operation costs tens of microseconds of dispatch right after an optimizer step; the
  compiled module (``fused_cpu``), when it can be built, gives the same bits in one pass
  over every dtype at once, and the update rule's and the SGD skip's in calls of a few
  microseconds. GPU, XPU and custom devices keep Paddle's kernels: one launch per dtype
  group, however many tensors.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import paddle
from paddle import Tensor

from . import fused_cpu

if TYPE_CHECKING:  # typing.TypeGuard needs Python 3.10
    from typing_extensions import TypeGuard

# Untyped for the checker, like the rest of Paddle: Paddle 3 ships a stub of its ops,
# which mypy would follow (follow_imports does not reach stubs) and 2.6 has none.
_C_ops: Any = paddle._C_ops

# Gradients by dtype (a paddle dtype), in parameter order: Paddle's kernels take one
# dtype per call.
GradGroups = dict[Any, list[Tensor]]


PADDLE_PATH, FUSED_CPU_PATH = "paddle", "fused-cpu"
_CPU_KERNEL_DTYPES = (paddle.float32, paddle.float64)
_CHECKED_DTYPES = (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)
_FLOAT32_MAX = 3.4028234663852886e38
_forced_path: str | None = None


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


def any_of(flags: Sequence[Tensor]) -> Tensor:
    """Logical OR of bool tensors of shape [1], computed on the device."""
    combined = flags[0]
    for flag in flags[1:]:
        combined = _C_ops.bitwise_or(combined, flag)
    return combined


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether an unscale found inf/nan: a bool [1] ``flag`` on the device, and the same
    as a host bool where it came with no read (on a CPU the compiled unscale hands it
    back with the flag), else None."""

    flag: Tensor
    on_host: bool | None = None


def unscale_and_check_(
    grads: Sequence[Tensor | None], scale: Tensor, all_finite: Tensor
) -> Verdict:
    """Multiply ``grads`` (any dtypes, None for a missing one) in place by 1/scale and
    check them for inf/nan. ``all_finite`` is the flag when there is nothing to check.

    One call on a CPU, where the compiled module serves; elsewhere one kernel launch
    per dtype, however many tensors.
    """
    fused = fused_ops_for(scale)
    if fused is not None:
        present = [grad for grad in grads if grad is not None]
        if not present:
            return Verdict(all_finite, False)
        return Verdict(*fused.unscale_and_check(present, scale))
    flags = [
        _C_ops.check_finite_and_unscale_(group, _scale_for(dtype, scale))[1]
        for dtype, group in grads_by_dtype_of(grads).items()
    ]
    return Verdict(any_of(flags) if flags else all_finite)


def unscale_check_and_tally_(
    grads: Sequence[Tensor], scale: Tensor, all_finite: Tensor
) -> tuple[Verdict, Tensor | None]:
    """``unscale_and_check_`` of ``grads`` (each present and non-empty), also counting
    each one's inf and nan elements before it is unscaled: an int64 [len(grads), 2]
    tensor of (infs, nans), None when there are no grads.

    The compiled module counts in its one pass; elsewhere each gradient costs five
    Paddle operations more.
    """
    fused = fused_ops_for(scale)
    if not grads:
        return Verdict(all_finite, False if fused is not None else None), None
    if fused is not None:
        found_inf, tally, found = fused.unscale_check_and_tally(list(grads), scale)
        return Verdict(found_inf, found), tally
    tally = paddle.stack(
        [paddle.stack([paddle.isinf(grad).sum(), paddle.isnan(grad).sum()]) for grad in grads]
    )
    return unscale_and_check_(grads, scale, all_finite), tally


def all_finite(tensors: Iterable[Tensor]) -> Tensor:
    """A bool [1] tensor: no inf/nan in ``tensors``, decided on the device.

    Where the unscale kernel takes the dtype it runs with a scale of exactly 1 (one
    launch per dtype, however many tensors), which writes every value back unchanged, in
    place; elsewhere (float16 and bfloat16 on a CPU) each tensor is tested on its own.
    Integer and bool tensors are always finite.
    """
    groups = grads_by_dtype_of(tensors)
    kernel_groups = {dtype: group for dtype, group in groups.items() if dtype in _CHECKED_DTYPES}
    found = unscale_and_check_(
        [tensor for group in kernel_groups.values() if _kernel_takes(group[0]) for tensor in group],
        paddle.ones([1], dtype=paddle.float32),
        paddle.zeros([1], dtype=paddle.bool),
    ).flag
    finite = paddle.logical_not(found)
    for group in kernel_groups.values():
        if not _kernel_takes(group[0]):
            for tensor in group:
                finite = paddle.logical_and(finite, paddle.isfinite(tensor).all().reshape([1]))
    return finite


def _kernel_takes(tensor: Tensor) -> bool:
    # Paddle's CPU build registers check_finite_and_unscale for float32/float64 only.
    return tensor.dtype in _CPU_KERNEL_DTYPES or not _on_cpu(tensor.place)


def unscale_paths() -> list[str]:
    """The unscale-and-check implementations this machine can run."""
    return [PADDLE_PATH] + ([FUSED_CPU_PATH] if fused_cpu.load() is not None else [])


def default_unscale_path(place: Any = None) -> str:
    """The implementation used for gradients on ``place`` (default: Paddle's current)."""
    place = place or paddle.framework._current_expected_place()
    return FUSED_CPU_PATH if _on_cpu(place) and fused_cpu.load() is not None else PADDLE_PATH


def _on_cpu(place: Any) -> bool:
    # Paddle 2.6's expected place is a CPUPlace, which has no is_cpu_place().
    return isinstance(place, paddle.CPUPlace) or (
        hasattr(place, "is_cpu_place") and bool(place.is_cpu_place())
    )


@contextlib.contextmanager
def using_unscale_path(name: str) -> Iterator[None]:
    """Force one implementation (for tests and benchmarks); restored on exit."""
    global _forced_path
    if name not in unscale_paths():
        raise ValueError(f"unscale path {name!r} is not available here: {unscale_paths()}")
    previous, _forced_path = _forced_path, name
    try:
        yield
    finally:
        _forced_path = previous


def _path_for(scale: Tensor) -> str:
    return _forced_path or default_unscale_path(scale.place)


def fused_ops_for(tensor: Tensor) -> fused_cpu.FusedOps | None:
    """The compiled CPU module, where it serves tensors beside ``tensor``; else None."""
    return fused_cpu.load() if _path_for(tensor) == FUSED_CPU_PATH else None


def zero_if_found_(grads: Sequence[Tensor | None], found_inf: Tensor) -> None:
    """Set every gradient (None for a missing one) to zero when ``found_inf`` holds,
    decided on the device."""
    fused = fused_ops_for(found_inf)
    if fused is not None:
        fused.zero_if_found([grad for grad in grads if grad is not None], found_inf)
        return
    for dtype, group in grads_by_dtype_of(grads).items():
        # With stop_update=True the kernel only zeroes; it wants a scale of the group's
        # compute dtype and counters all the same.
        scale = stand_in(found_inf, paddle.float64 if dtype == paddle.float64 else paddle.float32)
        counter = stand_in(found_inf, paddle.int32)
        _C_ops.update_loss_scaling_(group, found_inf, scale, counter, counter, 1, 1, 2.0, 0.5, True)


def clip_(tensor: Tensor, lower: float, upper: float | None) -> None:
    """Clamp ``tensor`` into ``[lower, upper]`` in place (None: no upper bound)."""
    _C_ops.clip_(tensor, lower, _FLOAT32_MAX if upper is None else upper)


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
