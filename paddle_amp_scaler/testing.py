"""Tools for testing a mixed-precision training loop on a machine without fp16 kernels."""

from __future__ import annotations

import paddle


def emulate_fp16_grads(model: paddle.nn.Layer) -> list:
    """Round every parameter gradient of ``model`` through float16, as fp16 training would.

    Paddle's CPU build runs no float16 matmul, so a float32 model stands in for an fp16
    one: each gradient is cast to float16 and back in a gradient hook. Values beyond
    float16's range (65504) become inf and tiny ones flush to zero, so overflow,
    skipped steps and back-off happen as they would on a GPU. Returns the hook handles
    (call ``.remove()`` on each to undo).
    """
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(f"model must be a paddle.nn.Layer, got {type(model).__name__}")
    return [param.register_hook(_round_through_float16) for param in model.parameters()
            if not param.stop_gradient]


def _round_through_float16(grad: paddle.Tensor) -> paddle.Tensor:
    return grad.astype(paddle.float16).astype(grad.dtype)
