"""Paddle's AMP kernels as the scaler uses them. All but ``read_numbers`` queue work on the
device and return without waiting: nothing reads a tensor back. Facts kept here:

* ``check_finite_and_unscale_`` takes one dtype per call and a scale of the kernel's compute
  dtype: float32 for float16/bfloat16/float32 grads, float64 for float64 (the CPU build:
  float32 and float64 only). It writes its inputs, each times ``1/scale``; once it meets a
  non-finite tensor it turns -inf into NaN and zeroes the tensors after it, even at a scale
  of 1: useless to an all-finite test that must leave them alone. Paddle 2.6's refuses a
  tensor with no elements (``TAKES_EMPTY``); 3's takes one, as ``update_loss_scaling_`` does.
* ``update_loss_scaling_`` refuses an empty ``xs`` and zeroes every tensor of ``xs`` when
  ``found_inf`` is set, and only that with ``stop_update=True``. Its rule is ``Rule.adjust_``'s.
* Both keep their names and signatures from Paddle 2.6 to 3.x as ``C_ops`` functions.
* ``C_ops.scale`` takes its factor as a tensor on the device and keeps a 0-d tensor 0-d:
  one operation, where a multiply by a [1] scale needs a reshape first.
* Under Paddle 3's semi-automatic parallelism gradients are dist tensors; handed them,
  ``check_finite_and_unscale_`` turns its dense scale into a replicated dist tensor, in place
  (``dist.shard_scaler``'s unscale does so to the scaler's ``_scale``). A dist tensor read as
  a Scalar (``C_ops.scale``'s factor) ends the process; a kernel mixing dist and dense tensors
  raises. So each function here works on this rank's part (``local_value``), which shares
  its storage.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import paddle
from paddle import Tensor

if TYPE_CHECKING:  # typing.TypeGuard needs Python 3.10
    from typing_extensions import TypeGuard

# Untyped for the checker, like the rest of Paddle: Paddle 3 ships a stub of its ops,
# which mypy would follow (follow_imports does not reach stubs) and 2.6 has none.
C_ops: Any = paddle._C_ops

# Whether the unscale kernel takes a tensor with no elements (the facts above).
TAKES_EMPTY = not paddle.__version__.startswith("2.")
# Gradients by the name of their dtype (``dtype_name``).
Groups = Mapping[str, Sequence[Tensor]]


def dtype_name(dtype: Any) -> str:
    """``"float32"`` for float32: compared, unlike a Paddle dtype, without a call into Paddle."""
    return str(dtype).replace("paddle.", "")


def unscale_and_check_(groups: Groups, scale: Tensor, all_finite: Tensor) -> Tensor:
    """Multiply the gradients of ``groups`` (``grads_by_dtype_of``) in place by 1/scale
    and check them for inf/nan, one launch per dtype. Returns the found-inf flag, a bool
    [1] tensor (``all_finite`` if nothing is checked).
    """
    scale = local_value(scale)
    flags = []
    for dtype, group in groups.items():
        flags.append(C_ops.check_finite_and_unscale_(group, _scale_for(dtype, scale))[1])

    return any_of(flags) if flags else all_finite


# float16's smallest normal magnitude: below it, and above 0, lie its subnormals.
FLOAT16_TINY = 2.0**-14


def measure(grads: Sequence[Tensor | None], times: Tensor | None = None) -> Tensor | None:
    """Each checked gradient (``is_checked``; of a sharded one, this rank's shard), times
    ``times`` (a scale) if given, measured: a float64 [n, 3] tensor of rows (largest
    magnitude, elements in float16's subnormal range, nonzero elements) in the order of
    ``grads``, or None. Seven operations per gradient; measure before an unscale.
    """
    largest, counts = [], []
    # Zero and float16's floor, made once per dtype.
    bounds: dict[Any, tuple[Tensor, Tensor]] = {}

    # Paddle's gradients require gradients: under autograd each measurement would record a
    # graph, and the headroom rule's memory would chain one more to it every measured iteration.
    with paddle.no_grad():
        for grad in filter(is_checked, map(held_shard, grads)):
            if times is not None:
                grad = grad.astype(paddle.float32) * local_value(times).reshape([])
            dtype = grad.dtype
            if dtype not in bounds:
                bounds[dtype] = (paddle.zeros([], dtype), paddle.full([], FLOAT16_TINY, dtype))
            zero, tiny = bounds[dtype]

            magnitude = C_ops.abs(grad)
            nonzero = C_ops.greater_than(magnitude, zero)
            subnormal = C_ops.logical_and(nonzero, C_ops.less_than(magnitude, tiny))
            amax = C_ops.max(magnitude, [], False)
            largest.append(amax if amax.dtype == paddle.float32 else amax.astype(paddle.float32))
            counts += [subnormal.sum(), nonzero.sum()]

    if not largest:
        return None
    table = [paddle.stack(largest).reshape([-1, 1]), paddle.stack(counts).reshape([-1, 2])]
    return paddle.concat([column.astype(paddle.float64) for column in table], 1)


def amax_in(table: Tensor | None) -> Tensor | None:
    """The largest magnitude a ``measure`` table holds, float32 [1] (None for None)."""
    if table is None:
        return None

    return C_ops.max(table[:, 0], [], True).astype(paddle.float32).reshape([1])


def zero_if_found_(groups: Groups, found_inf: Tensor, placeholder: Callable[[Any], Tensor]) -> None:
    """Zero every gradient of ``groups`` if ``found_inf`` holds, one launch per dtype.

    ``placeholder(dtype)`` gives a [1] tensor of that dtype for the kernel's arguments that
    do not matter here.
    """
    found_inf = local_value(found_inf)
    for dtype, group in groups.items():
        # With stop_update=True the kernel only zeroes, but it still wants a scale of the
        # compute dtype and two counters.
        scale = placeholder(paddle.float64 if dtype == "float64" else paddle.float32)
        counter = placeholder(paddle.int32)
        C_ops.update_loss_scaling_(group, found_inf, scale, counter, counter, 1, 1, 2.0, 0.5, True)


def grads_by_dtype_of(grads: Iterable[Tensor | None]) -> dict[str, list[Tensor]]:
    """Gradients grouped by dtype (``Groups``) in parameter order, leaving out ``None`` (and
    empty ones where the kernel refuses them): Paddle's kernels take one dtype per call.
    Of a dist gradient, the shard this rank holds.
    """
    groups: dict[str, list[Tensor]] = {}

    # Naming a Paddle dtype costs half a microsecond; neighbours mostly share one, and
    # Paddle 3.3 returns the same dtype object for each.
    last_dtype, last_group = None, []
    for grad in grads:
        if grad is not None and grad.is_dist():
            grad = held_shard(grad)

        # The shape is read once per gradient and step: on the cold cache a backward
        # leaves, it is the dearest read of a gradient.
        if grad is not None and (TAKES_EMPTY or 0 not in grad.shape):
            dtype = grad.dtype
            if dtype is not last_dtype:
                last_dtype, last_group = dtype, groups.setdefault(dtype_name(dtype), [])
            last_group.append(grad)

    return groups


def is_checked(grad: Tensor | None) -> TypeGuard[Tensor]:
    """Whether a gradient goes to the kernels: it exists and has elements."""
    # `0 not in shape`, not `grad.size`: Paddle computes the size through NumPy (~6 us).
    return grad is not None and 0 not in grad.shape


def _scale_for(dtype: str, scale: Tensor) -> Tensor:
    return scale.astype(paddle.float64) if dtype == "float64" else scale


def scaled(tensor: Tensor, scale: Tensor) -> Tensor:
    """A new tensor holding ``tensor * scale``: float64 for float64, else float32 (a
    float16 loss times a large scale would overflow in float16).
    """
    if tensor.dtype not in (paddle.float32, paddle.float64):
        tensor = tensor.astype(paddle.float32)

    # One operation that keeps a 0-d loss 0-d, with the factor on the device (the facts).
    return C_ops.scale(tensor, local_value(scale), 0.0, True)


def unscaled(tensor: Tensor, scale: Tensor) -> Tensor:
    """A new tensor holding ``tensor * (1 / scale)`` in ``tensor``'s dtype, as the unscale
    kernel computes it (float16 and bfloat16 through float32).
    """
    scale = _scale_for(dtype_name(tensor.dtype), local_value(scale))
    inverse = paddle.reciprocal(scale).reshape([])

    if tensor.dtype in (paddle.float16, paddle.bfloat16):
        return (tensor.astype(paddle.float32) * inverse).astype(tensor.dtype)
    return tensor * inverse


def largest_of(amaxes: Sequence[Tensor | None]) -> Tensor | None:
    """The largest of float32 [1] amaxes, on the device; None if any is None (an
    iteration is measured only where every unscale in it was).
    """
    if not amaxes or any(amax is None for amax in amaxes):
        return None

    return functools.reduce(C_ops.maximum, amaxes)


def any_of(flags: Sequence[Tensor]) -> Tensor:
    """Logical OR of bool tensors of shape [1], computed on the device."""
    return functools.reduce(C_ops.bitwise_or, [local_value(flag) for flag in flags])


def clip_(tensor: Tensor, lower: float, upper: float) -> None:
    """Clamp ``tensor`` into ``[lower, upper]`` in place."""
    C_ops.clip_(local_value(tensor), lower, upper)


def read_numbers(*tensors: Tensor) -> list[float]:
    """The values of ``tensors``, flattened and joined, in one read of the device: a sync,
    for getters, ``stats()`` and ``state_dict()`` only.
    """
    together = [local_value(tensor).reshape([-1]).astype(paddle.float64) for tensor in tensors]
    numbers: list[float] = paddle.concat(together).numpy().tolist()
    return numbers


def local_value(tensor: Tensor) -> Tensor:
    """What this rank holds of ``tensor``: a dist tensor's local value (an in-place write to it
    is one to the dist tensor; of a replicated one, the whole), else ``tensor`` itself.
    """
    return tensor._local_value() if tensor.is_dist() else tensor


def held_shard(grad: Tensor | None) -> Tensor | None:
    """What this rank holds of a gradient: the gradient, or a dist one's shard; None where
    it holds none (no gradient, or one on a mesh without this rank, as a pipeline stage's
    are on the other stages' ranks: its local value is uninitialized memory).
    """
    if grad is None or not grad.is_dist():
        return grad

    shard = grad._local_value()
    return shard if shard._is_initialized() else None
