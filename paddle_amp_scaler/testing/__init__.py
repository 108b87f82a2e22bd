"""Testing a mixed-precision training loop on a machine without fp16 kernels: a float32
model that computes with float16's range and precision (``emulate_fp16_grads``,
``round_linear_layers``, ``round_through_float16``), and the census of where the
gradients it rounds land in float16's range (``UnderflowCensus``, ``count_float16_range``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle

from ..core.validation import FLOAT16_MAX

# Where float32 magnitudes land in float16, rounding to nearest, ties to even: at most
# half the smallest subnormal (2**-25, a tie that goes to the even 0) flushes to zero;
# below the midpoint between the largest subnormal and 2**-14 (a tie that goes to the
# even 2**-14) stays subnormal; from the midpoint between 65504 and 65536 up is inf.
FLUSH_LIMIT = 2.0**-25
SUBNORMAL_LIMIT = 2.0**-14 - 2.0**-25
OVERFLOW_LIMIT = 65520.0
_FLOAT32_MANTISSA_BITS, _FLOAT32_EXPONENTS = 23, 256


@dataclasses.dataclass
class CensusCounts:
    """Gradient elements counted by an ``UnderflowCensus``.

    Args:
        nonzero: finite elements other than zero, before rounding.
        flushed: those of them that float16 rounds to zero.
        subnormal: those that float16 holds only as subnormals (nonzero, below 2**-14).
        overflowed: finite elements that float16 rounds to inf.
    """

    nonzero: int = 0
    flushed: int = 0
    subnormal: int = 0
    overflowed: int = 0

    def __add__(self, other: CensusCounts) -> CensusCounts:
        pairs = zip(dataclasses.astuple(self), dataclasses.astuple(other))
        return CensusCounts(*(mine + theirs for mine, theirs in pairs))

    @property
    def flushed_fraction(self) -> float:
        """``flushed / nonzero`` (0.0 with nothing counted)."""
        return self.flushed / self.nonzero if self.nonzero else 0.0

    @property
    def subnormal_fraction(self) -> float:
        """``subnormal / nonzero`` (0.0 with nothing counted)."""
        return self.subnormal / self.nonzero if self.nonzero else 0.0


def count_float16_range(values: Any) -> CensusCounts:
    """Where the elements of ``values`` (a tensor or an array) land when rounded to
    float16: ``CensusCounts`` of them. Elements already inf or nan are left out.
    """
    return _counted(_finite_magnitudes(values))


def _finite_magnitudes(values: Any) -> Any:
    array = values.numpy() if isinstance(values, paddle.Tensor) else np.asarray(values)
    magnitudes = np.abs(array.astype(np.float32, copy=False))
    return magnitudes[np.isfinite(magnitudes)]


def _counted(finite: np.ndarray) -> CensusCounts:
    nonzero = int(np.count_nonzero(finite))
    at_most_flush = int(np.count_nonzero(finite <= FLUSH_LIMIT))
    below_normal = int(np.count_nonzero(finite < SUBNORMAL_LIMIT))
    zeros = finite.size - nonzero
    return CensusCounts(
        nonzero=nonzero,
        flushed=at_most_flush - zeros,
        subnormal=below_normal - at_most_flush,
        overflowed=int(np.count_nonzero(finite >= OVERFLOW_LIMIT)),
    )


def _add_to_label(by_label: dict[str, CensusCounts], label: str, counts: CensusCounts) -> None:
    by_label[label] = by_label.get(label, CensusCounts()) + counts


class UnderflowCensus:
    """Counts, per iteration, what float16 does to the gradients that reach tensors
    rounded by ``round_through_float16`` (``round_linear_layers`` included): of the
    nonzero finite elements, how many it flushes to zero, how many it keeps only as
    subnormals and how many it turns into inf. With a loss scale these are the scaled
    gradients, as a GPU's fp16 backward holds them.

    Each gradient is read to the host once, in the backward pass (on a GPU, a sync per
    rounded tensor: a tool for experiments). End every iteration with ``end_iteration``:
    a skipped iteration's counts are discarded, its gradients never reached the weights::

        census = UnderflowCensus()
        round_linear_layers(model, census)
        for batch in batches:
            scaler.scale(loss_of(model, batch)).backward()
            scaler.step(optimizer)
            scaler.update()
            census.end_iteration(skipped=scaler.last_step_skipped())
        census.kept.flushed_fraction

    Args:
        by_label: also count by the label given to ``round_through_float16``
            (``round_linear_layers`` gives each layer's path in the model): the kept
            iterations' in ``kept_by_label``, the last iteration's (kept or not, in the
            order the backward pass reached them) in ``last_by_label``.
        exponents: also count the nonzero elements of each iteration by their float32
            exponent: after ``end_iteration``, ``last_exponents[e]`` is how many had
            the biased exponent ``e`` (magnitudes in ``[2**(e-127), 2**(e-126))``; 0
            holds float32's subnormals), and ``last_amax`` is their largest magnitude,
            for asking what another scale would have kept.
    """

    def __init__(self, *, by_label: bool = False, exponents: bool = False) -> None:
        self.kept = CensusCounts()
        self.kept_iterations = 0
        self.discarded_iterations = 0
        self.kept_by_label: dict[str, CensusCounts] = {}
        self.last_by_label: dict[str, CensusCounts] = {}
        self.last_exponents: np.ndarray | None = None
        self.last_amax = 0.0
        self._by_label = by_label
        self._current = CensusCounts()
        self._current_by_label: dict[str, CensusCounts] = {}
        self._current_exponents: np.ndarray | None = (
            np.zeros(_FLOAT32_EXPONENTS, dtype=np.int64) if exponents else None
        )
        self._current_amax = 0.0

    def observe(self, grad: paddle.Tensor, label: str = "") -> None:
        """Count one gradient into the current iteration (the hook's body)."""
        finite = _finite_magnitudes(grad)
        counts = _counted(finite)
        self._current = self._current + counts
        if self._by_label:
            _add_to_label(self._current_by_label, label, counts)
        if self._current_exponents is not None:
            # The sign bit is clear: the exponent is all that is left above the mantissa.
            biased = finite[finite > 0].view(np.uint32) >> _FLOAT32_MANTISSA_BITS
            self._current_exponents += np.bincount(biased, minlength=_FLOAT32_EXPONENTS)
            if finite.size:
                self._current_amax = max(self._current_amax, float(finite.max()))

    def hook(self, label: str = "") -> Callable[[paddle.Tensor], None]:
        """A gradient hook that counts into this census and leaves the gradient as it is
        (``observe`` returns None: a hook returning anything but a tensor or None crashes
        Paddle's backward pass).
        """
        return functools.partial(self.observe, label=label)

    def end_iteration(self, *, skipped: bool = False) -> CensusCounts:
        """Close the current iteration: its counts are kept, or discarded if its step was
        ``skipped``. Returns them either way.
        """
        counts, by_label = self._current, self._current_by_label
        self._current, self._current_by_label = CensusCounts(), {}
        self.last_by_label = by_label
        if self._current_exponents is not None:
            self.last_exponents = self._current_exponents
            self._current_exponents = np.zeros_like(self.last_exponents)
            self.last_amax, self._current_amax = self._current_amax, 0.0
        if skipped:
            self.discarded_iterations += 1
            return counts
        self.kept = self.kept + counts
        self.kept_iterations += 1
        for label, label_counts in by_label.items():
            _add_to_label(self.kept_by_label, label, label_counts)
        return counts


def emulate_fp16_grads(model: paddle.nn.Layer) -> list[Any]:
    """Round every parameter gradient of ``model`` through float16, as fp16 training would.

    Paddle's CPU build runs no float16 matmul, so a float32 model stands in for an fp16
    one: each gradient is rounded to float16 in a gradient hook. Values beyond
    float16's range (65504) become inf and tiny ones flush to zero, so overflow,
    skipped steps and back-off happen as they would on a GPU. Only the parameters'
    gradients are rounded, as backward leaves them: the gradients inside the backward
    pass (the activations'), where float16 flushes most, stay float32. Enough to test a
    loop; to compare loss-scale policies, round every matmul with ``round_linear_layers``
    (the demo does). Returns the hook handles (call ``.remove()`` on each to undo).
    Paddle runs these hooks in ``backward()``, not in ``paddle.grad``: there, round the
    gradients yourself.
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
    on it would flush everything below 2**-24, not 2**-25, and bias every value down.
    """
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
    hook counts that gradient before it is rounded, under ``label``.
    """
    fast = _cast_rounds_to_nearest()
    rounded = _nearest_float16(tensor) if fast else _RoundedToFloat16.apply(tensor)
    if census is not None and not rounded.stop_gradient:
        rounded.register_hook(census.hook(label))
    return rounded


class RestoredForward:
    """Undoes ``round_linear_layers`` for one layer: ``remove()`` gives it back its own
    ``forward``.
    """

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
    parameters stay float32, as O1's master copies: what float16 does to a backward pass,
    underflow included, which is what tells loss-scale policies apart. Returns one handle
    per layer (``.remove()`` undoes it).

    It reaches ``paddle.nn.Linear`` only. The products inside
    ``paddle.nn.MultiHeadAttention`` (q·kᵀ and attention·v), and every matmul a model
    writes by hand, stay float32: their overflows and underflows are not emulated, and
    an attention overflow never shows. Round their operands with
    ``round_through_float16``, as ``benchmarks/policy_workloads.py`` does.
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
