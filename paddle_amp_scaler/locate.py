"""``locate_overflow(model)``: where an overflow starts, for one diagnostic iteration.

A skip says that something overflowed, not where. Inside the context, every sublayer's
forward output and the gradients its backward produces (with respect to its inputs and
its own parameters) are checked as they are made, through Paddle's forward post hooks
and tensor hooks, and each that holds inf or nan, or a magnitude beyond float16's
largest, is noted. The checks read every tensor back to the host: a diagnosis, not a
training step. The hooks go when the context ends, also on an exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import paddle
from paddle import Tensor

from . import nested
from .core.validation import FLOAT16_MAX, check_number_within

# How many findings a report shows after the first.
_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class OverflowOrigin:
    """One tensor that overflowed, and the sublayer that made it.

    Args:
        layer: the sublayer's name as ``model.named_sublayers()`` gives it (``""`` for
            the model itself); where containers nest, the innermost that made it.
        phase: ``"forward"`` (its output) or ``"backward"`` (a gradient its backward
            produced, with respect to one of its inputs or its own parameters).
        kind: ``"inf"`` (some element is inf), else ``"nan"``, else ``"beyond float16"``
            (finite, but some magnitude above the ceiling: it overflows where that
            tensor is float16).
        shape: the tensor's shape.
        dtype: the tensor's dtype, as ``"float32"``.
        largest: its largest finite magnitude (None where none is finite).
    """

    layer: str
    phase: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    largest: float | None


class OverflowLocation:
    """What ``locate_overflow`` found: ``origins``, every finding in the order met (the
    forward pass first, then the backward, from the loss back), and ``first``.
    """

    def __init__(self, ceiling: float, kinds: dict[str, str]) -> None:
        self.ceiling = ceiling
        self.origins: list[OverflowOrigin] = []
        # Each sublayer's class name, by its name, for the report.
        self._kinds = kinds

    @property
    def first(self) -> OverflowOrigin | None:
        """The first finding: where the overflow starts (None if nothing overflowed)."""
        return self.origins[0] if self.origins else None

    def check(self, tensor: Tensor, layer: str, phase: str) -> None:
        """Note ``tensor`` if it overflows (one read of it)."""
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            return

        # Read apart from autograd: a forward hook's cast would be recorded in the graph.
        with paddle.no_grad():
            values = np.abs(tensor.astype(paddle.float32).numpy())
        finite = values[np.isfinite(values)]
        largest = float(finite.max()) if finite.size else None
        if np.isinf(values).any():
            kind = "inf"
        elif np.isnan(values).any():
            kind = "nan"
        elif largest is not None and largest > self.ceiling:
            kind = "beyond float16"
        else:
            return

        dtype = str(tensor.dtype).replace("paddle.", "")
        origin = OverflowOrigin(layer, phase, kind, tuple(tensor.shape), dtype, largest)
        self.origins.append(origin)

    def describe(self, origin: OverflowOrigin) -> str:
        """One finding in words."""
        where = f"layer {origin.layer!r} ({self._kinds.get(origin.layer, '?')})"
        what = "the forward output of" if origin.phase == "forward" else "a gradient made by"
        largest = None if origin.largest is None else f"{origin.largest:.4g}"
        if origin.kind == "beyond float16":
            kind = f"beyond float16 (largest {largest} > {self.ceiling:g})"
        elif largest is None:
            kind = f"{origin.kind} (no finite value)"
        else:
            kind = f"{origin.kind} (largest finite {largest})"
        shape = f"shape {list(origin.shape)}, {origin.dtype}"
        if origin.phase == "backward":
            where = f"the backward of {where}"
        return f"{what} {where} is {kind}, {shape}"

    def __str__(self) -> str:
        if not self.origins:
            return (
                "no overflow: every sublayer's output and gradient was finite and within "
                f"{self.ceiling:g}"
            )

        lines = [f"first overflow: {self.describe(self.origins[0])}"]
        lines += [f"then: {self.describe(origin)}" for origin in self.origins[1 : 1 + _SHOWN]]
        if len(self.origins) > 1 + _SHOWN:
            lines.append(f"and {len(self.origins) - 1 - _SHOWN} more")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"OverflowLocation(first={self.first!r}, origins={len(self.origins)})"


@contextlib.contextmanager
def locate_overflow(model: Any, *, ceiling: float = FLOAT16_MAX) -> Iterator[OverflowLocation]:
    """Check, for one diagnostic iteration inside the context, every sublayer's forward
    output and the gradients its backward produces, and yield what overflowed::

        with paddle_amp_scaler.locate_overflow(model) as found:
            loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
        report = str(found)     # a readable report
        origin = found.first    # an OverflowOrigin, or None

    Args:
        model: a ``paddle.nn.Layer``.
        ceiling: a finite magnitude above it is an overflow (default float16's largest,
            65504): in a float32 run, as on a CPU, or in a float32 operation whose output
            feeds a float16 one, that is where float16 would have overflowed.
    """
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(
            f"locate_overflow() takes the model, a paddle.nn.Layer, got {type(model).__name__}"
        )
    ceiling = check_number_within(ceiling, "ceiling", 0.0, float("inf"))
    layers = [("", model), *model.named_sublayers()]
    found = OverflowLocation(ceiling, {name: type(layer).__name__ for name, layer in layers})

    handles: list[Any] = []
    try:
        for name, layer in layers:
            handles.append(layer.register_forward_post_hook(_forward_hook(found, name, handles)))
            for param in layer.parameters(include_sublayers=False):
                if not param.stop_gradient:
                    handles.append(param.register_hook(_gradient_hook(found, name)))
        yield found
    finally:
        for handle in handles:
            handle.remove()


def _forward_hook(
    found: OverflowLocation, name: str, handles: list[Any]
) -> Callable[[Any, Any, Any], None]:
    def check_output(layer: Any, inputs: Any, outputs: Any) -> None:
        for output in nested.tensors_in(outputs):
            found.check(output, name, "forward")

        # The gradients with respect to the inputs are what this layer's backward makes.
        for tensor in nested.tensors_in(inputs):
            if isinstance(tensor, Tensor) and not tensor.stop_gradient:
                handles.append(tensor.register_hook(_gradient_hook(found, name)))

    return check_output


def _gradient_hook(found: OverflowLocation, name: str) -> Callable[[Tensor], None]:
    def check_gradient(grad: Tensor) -> None:
        found.check(grad, name, "backward")

    return check_gradient
