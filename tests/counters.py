"""What a step costs on a GPU, counted on any machine: its reads of tensors back to the
host (device syncs) and its Paddle operations (kernel launches). Instruments of the tests
and the benchmarks, not of the package: they patch ``paddle.Tensor`` and read stack
frames."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import paddle
from paddle import profiler

import paddle_amp_scaler

# The package's folder: a read by any module of the package is the scaler's.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(paddle_amp_scaler.__file__))
_PADDLE_DIR = os.path.dirname(os.path.abspath(paddle.__file__))

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
        def counting(tensor: paddle.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                caller = sys._getframe(1)
                filename = caller.f_code.co_filename
                origin = (
                    "scaler"
                    if filename.startswith(_PACKAGE_DIR)
                    else "paddle"
                    if filename.startswith(_PADDLE_DIR)
                    else "other"
                )
                self.reads[origin] += 1
                self.where.append((origin, filename, caller.f_lineno))
            self._depth += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._depth -= 1

        return counting

    @contextlib.contextmanager
    def counting(self) -> Iterator[HostReadCounter]:
        """A context in which reads are counted (added to those already counted)."""
        with contextlib.ExitStack() as patches:
            for name in _READ_METHODS:
                original = getattr(paddle.Tensor, name, None)
                if original is not None:
                    counting = self._wrap(original)
                    patches.enter_context(mock.patch.object(paddle.Tensor, name, counting))
            yield self


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
        recorder = profiler.Profiler(
            targets=[profiler.ProfilerTarget.CPU], on_trace_ready=lambda _: None
        )
        recorder.start()
        try:
            yield self
        finally:
            recorder.stop()
            for root in recorder.profiler_result.get_data().values():
                self._count(root)

    def _count(self, node: Any) -> None:
        if node.type == profiler.TracerEventType.Operator:
            # "adamw_ dygraph": the operation's name, then how it was run.
            self.operations[node.name.split()[0]] += 1
            return
        for child in node.children_node:
            self._count(child)
