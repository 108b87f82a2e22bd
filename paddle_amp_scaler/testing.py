"""Tools for testing a mixed-precision training loop on a machine without fp16 kernels."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import paddle

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PADDLE_DIR = os.path.dirname(os.path.abspath(paddle.__file__))


def emulate_fp16_grads(model: paddle.nn.Layer) -> list[Any]:
    """Round every parameter gradient of ``model`` through float16, as fp16 training would.

    Paddle's CPU build runs no float16 matmul, so a float32 model stands in for an fp16
    one: each gradient is cast to float16 and back in a gradient hook. Values beyond
    float16's range (65504) become inf and tiny ones flush to zero, so overflow,
    skipped steps and back-off happen as they would on a GPU. Returns the hook handles
    (call ``.remove()`` on each to undo). Paddle runs these hooks in ``backward()``, not
    in ``paddle.grad``: there, round the gradients yourself.
    """
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(f"model must be a paddle.nn.Layer, got {type(model).__name__}")
    return [
        param.register_hook(_round_through_float16)
        for param in model.parameters()
        if not param.stop_gradient
    ]


def _round_through_float16(grad: paddle.Tensor) -> paddle.Tensor:
    return grad.astype(paddle.float16).astype(grad.dtype)


_READ_METHODS = (
    "__bool__",
    "__nonzero__",
    "numpy",
    "item",
    "tolist",
    "__float__",
    "__int__",
    "__index__",
    "__array__",
)


class HostReadCounter:
    """Counts reads of tensors back to the host (each a device sync on GPU), by origin.

    Origins: ``"scaler"`` (this package), ``"paddle"`` (Paddle's own code, e.g. its
    optimizer reading the found-inf flag) and ``"other"`` (yours). Only the outermost
    read is counted: ``bool(t)`` calling ``t.numpy()`` is one read. ``where`` lists
    (origin, file, line) of each::

        counter = HostReadCounter()
        with counter.counting():
            scaler.step(optimizer)
            scaler.update()
        counter.reads            # {"scaler": 0, "paddle": 1, "other": 0} for Adam
    """

    def __init__(self) -> None:
        self.reads = {"scaler": 0, "paddle": 0, "other": 0}
        self.where: list[tuple[str, str, int]] = []
        self._depth = 0

    def total(self) -> int:
        """The reads counted so far, of every origin."""
        return sum(self.reads.values())

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self

        def counting(tensor: paddle.Tensor, *args: Any, **kwargs: Any) -> Any:
            if counter._depth == 0:
                caller = sys._getframe(1).f_code.co_filename
                origin = (
                    "scaler"
                    if caller.startswith(_PACKAGE_DIR)
                    else "paddle"
                    if caller.startswith(_PADDLE_DIR)
                    else "other"
                )
                counter.reads[origin] += 1
                counter.where.append((origin, caller, sys._getframe(1).f_lineno))
            counter._depth += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                counter._depth -= 1

        return counting

    @contextlib.contextmanager
    def counting(self) -> Iterator[HostReadCounter]:
        """A context in which reads are counted (added to those already counted)."""
        saved = {name: paddle.Tensor.__dict__.get(name) for name in _READ_METHODS}
        try:
            for name in _READ_METHODS:
                original = getattr(paddle.Tensor, name, None)
                if original is not None:
                    setattr(paddle.Tensor, name, self._wrap(original))
            yield self
        finally:
            for name, original in saved.items():
                if original is None:
                    if name in paddle.Tensor.__dict__:
                        delattr(paddle.Tensor, name)
                else:
                    setattr(paddle.Tensor, name, original)


class OperationCounter:
    """Counts the Paddle operations run inside ``counting()``, by name: on a GPU each is a
    kernel launch (or a few), so this is what a step costs there, measured on any machine.

    Paddle's profiler records them (on its CPU tracer); an operation that runs others
    inside counts once::

        counter = OperationCounter()
        with counter.counting():
            scaler.step(optimizer)
            scaler.update()
        counter.operations      # Counter({"check_finite_and_unscale_": 1, ...})
    """

    def __init__(self) -> None:
        self.operations: collections.Counter[str] = collections.Counter()

    def total(self) -> int:
        """The operations counted so far, of every name."""
        return sum(self.operations.values())

    @contextlib.contextmanager
    def counting(self) -> Iterator[OperationCounter]:
        """A context whose operations are counted (added to those already counted)."""
        from paddle import profiler

        recorder = profiler.Profiler(
            targets=[profiler.ProfilerTarget.CPU], on_trace_ready=lambda _: None
        )
        recorder.start()
        try:
            yield self
        finally:
            recorder.stop()
            for root in recorder.profiler_result.get_data().values():
                self._count(root, profiler.TracerEventType.Operator)

    def _count(self, node: Any, operator_type: Any) -> None:
        if node.type == operator_type:
            # "adamw_ dygraph": the operation's name, then how it was run.
            self.operations[node.name.split()[0]] += 1
            return
        for child in node.children_node:
            self._count(child, operator_type)
