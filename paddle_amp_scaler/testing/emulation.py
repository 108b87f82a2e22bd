"""fp16 emulation: a float32 model that computes with float16's range and precision, for
machines without fp16 kernels (Paddle's CPU build runs no float16 matmul)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle

from ..core.limits import FLOAT16_MAX
from .census import UnderflowCensus


def emulate_fp16_grads(model: paddle.nn.Layer) -> list[Any]:
    """Round every parameter gradient of ``model`` through float16, as fp16 training would.

    Paddle's CPU build runs no float16 matmul, so a float32 model stands in for an fp16
    one: each gradient is rounded to float16 in a gradient hook. Values beyond
    float16's range (65504) become inf and tiny ones flush to zero, so overflow,
    skipped steps and back-off happen as they would on a GPU. Returns the hook handles
    (call ``.remove()`` on each to undo). Paddle runs these hooks in ``backward()``, not
    in ``paddle.grad``: there, round the gradients yourself.
    """
    _require_layer(model)
    return [
        param.register_hook(_nearest_float16)
        for param in model.parameters()
        if not param.stop_gradient
    ]


def _require_layer(model: Any) -> None:
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(f"model must be a paddle.nn.Layer, got {type(model).__name__}")


@functools.cache
def _cast_rounds_to_nearest() -> bool:
    """Whether Paddle's cast to float16 rounds to nearest, as float16 arithmetic and every
    GPU cast do. Paddle 2.6's CPU cast truncates toward zero instead: an emulation built
    on it would flush everything below 2**-24, not 2**-25, and bias every value down."""
    below_a_half_ulp = paddle.to_tensor([1 + 0.75 * 2.0**-10], dtype=paddle.float32)
    rounded = below_a_half_ulp.astype(paddle.float16).astype(paddle.float32)
    return bool(rounded.numpy()[0] == 1 + 2.0**-10)


def _nearest_float16(values: paddle.Tensor) -> paddle.Tensor:
    """``values`` rounded to the nearest float16, ties to even, in their own dtype."""
    if _cast_rounds_to_nearest():
        return values.astype(paddle.float16).astype(values.dtype)
    # Float16's rounding in float arithmetic: each magnitude is a whole number of its
    # binade's float16 steps (powers of two, so the divisions are exact), rounded to
    # nearest with ties to even. Paddle's float == allows a difference of 1e-8, many
    # float16 steps down here, so the comparisons are inequalities, which are exact.
    magnitude = values.abs()
    exponent = paddle.clip(paddle.floor(paddle.log2(magnitude)), -14.0, 15.0)
    step = paddle.pow(paddle.full_like(exponent, 2.0), exponent - 10.0)
    steps = magnitude / step
    whole = paddle.floor(steps)
    part = steps - whole
    odd = paddle.remainder(whole, paddle.full_like(whole, 2.0)) > 0.5
    tie = paddle.logical_and(part >= 0.5, part <= 0.5)
    up = paddle.logical_or(part > 0.5, paddle.logical_and(tie, odd))
    nearest = (whole + up.astype(whole.dtype)) * step
    nearest = paddle.where(nearest > FLOAT16_MAX, paddle.full_like(nearest, np.inf), nearest)
    return paddle.sign(values) * nearest


class _RoundedToFloat16(paddle.autograd.PyLayer):  # type: ignore[misc]
    """Rounds to the nearest float16 in both passes, where Paddle's own cast does not."""

    @staticmethod
    def forward(ctx: Any, values: paddle.Tensor) -> paddle.Tensor:
        return _nearest_float16(values)

    @staticmethod
    def backward(ctx: Any, grad: paddle.Tensor) -> paddle.Tensor:
        return _nearest_float16(grad)


def round_through_float16(
    tensor: paddle.Tensor, census: UnderflowCensus | None = None, label: str = ""
) -> paddle.Tensor:
    """``tensor`` rounded to float16 and back to its dtype, in both passes.

    For a hand-written matmul (attention's, say) on a machine without float16 kernels:
    round its inputs and its output. The backward of the two casts rounds the gradient
    through float16 too, as the cast operations of O1 do on a GPU: a gradient above
    65504 becomes inf and one at or below 2**-25 flushes to zero. With a ``census``, a
    hook counts that gradient before it is rounded, under ``label``. (Paddle 2.6's CPU
    cast truncates; there the rounding to nearest is done in float arithmetic.)
    """
    if _cast_rounds_to_nearest():
        rounded = tensor.astype(paddle.float16).astype(tensor.dtype)
    else:
        rounded = _RoundedToFloat16.apply(tensor)
    if census is not None and not rounded.stop_gradient:
        rounded.register_hook(census.hook(label))
    return rounded


class RestoredForward:
    """Undoes ``round_linear_layers`` for one layer: ``remove()`` gives it back its own
    ``forward``."""

    def __init__(self, layer: paddle.nn.Layer) -> None:
        self._layer = layer

    def remove(self) -> None:
        self._layer.__dict__.pop("forward", None)


def round_linear_layers(
    model: paddle.nn.Layer, census: UnderflowCensus | None = None
) -> list[RestoredForward]:
    """Make every ``paddle.nn.Linear`` of ``model`` (itself included) compute as a float16
    matmul would on a GPU under O1: input, weight, bias and output each rounded through
    float16 by ``round_through_float16``, so that forward values and the gradients of
    all four are float16's. ``census`` counts them under the layer's path in ``model``
    (``"blocks.0.up.weight"``; a ``model`` that is itself a Linear: its full name). The
    parameters stay float32, as O1's master copies. Returns one handle per layer
    (``.remove()`` undoes it). Matmuls written by hand need ``round_through_float16``.
    """
    _require_layer(model)
    handles = []
    for path, layer in model.named_sublayers(include_self=True):
        if isinstance(layer, paddle.nn.Linear):
            layer.forward = _rounding_forward(layer, census, path or layer.full_name())
            handles.append(RestoredForward(layer))
    return handles


def _rounding_forward(
    layer: paddle.nn.Linear, census: UnderflowCensus | None, name: str
) -> Callable[[paddle.Tensor], paddle.Tensor]:
    def forward(inputs: paddle.Tensor) -> paddle.Tensor:
        bias = layer.bias
        output = paddle.nn.functional.linear(
            round_through_float16(inputs, census, f"{name}.input"),
            round_through_float16(layer.weight, census, f"{name}.weight"),
            None if bias is None else round_through_float16(bias, census, f"{name}.bias"),
        )
        return round_through_float16(output, census, f"{name}.output")

    return forward
