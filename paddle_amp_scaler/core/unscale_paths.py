"""Which implementation of the device work a scaler uses: chosen once, by its place.

Two unscale paths do the same work with the same bits (the tests hold them to each
other and to ``rule.adjust``):

* ``"fused-cpu"`` (``fused_cpu.FusedCpu``): on a CPU, where the compiled module can be
  built; one pass over every gradient, the rule and the statistics in calls of a few
  microseconds, and the verdict handed back to the host with no read.
* ``"paddle"`` (``kernels.PaddleKernels``): everywhere else, GPU, XPU and custom
  devices included, and on a CPU without a compiler or with ``PADDLE_AMP_SCALER_FUSED=0``.

A scaler asks ``path_for`` once, when it is built, and keeps the answer for its life.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import paddle
from paddle import Tensor

from . import fused_cpu, rule
from .kernels import PaddleKernels, on_cpu
from .scale_tensors import ScaleTensors
from .verdict import Verdict

PADDLE_PATH, FUSED_CPU_PATH = PaddleKernels.name, fused_cpu.FusedCpu.name

# The path that scalers built inside using_unscale_path() take.
_chosen: str | None = None


class UnscalePath(Protocol):
    """What a scaler asks of the device: the operations of one training step."""

    name: str
    # The headroom policy measures the amax every this many iterations (rule.measured).
    measure_every: int
    # Counts an iteration's statistics in place: (counts, found, fired); None where the
    # statistics are kept per iteration and added up in batches instead.
    count_iteration_: Any

    def unscale_and_check_(
        self,
        grads: Sequence[Tensor | None],
        scale: Tensor,
        all_finite: Tensor,
        *,
        measure: bool = False,
    ) -> Verdict: ...

    def unscale_check_and_tally_(
        self, grads: Sequence[Tensor], scale: Tensor, all_finite: Tensor, *, measure: bool = False
    ) -> tuple[Verdict, Tensor | None]: ...

    def zero_if_found_(self, grads: Sequence[Tensor | None], found_inf: Tensor) -> None: ...

    def adjust_(
        self,
        found: Tensor,
        tensors: ScaleTensors,
        policy: rule.Policy,
        *,
        amax: Tensor | None = None,
        iteration: int = 0,
    ) -> Tensor: ...


def unscale_paths() -> list[str]:
    """The unscale-and-check implementations this machine can run."""
    return [PADDLE_PATH] + ([FUSED_CPU_PATH] if fused_cpu.load() is not None else [])


def default_unscale_path(place: Any = None) -> str:
    """The implementation a scaler built for gradients on ``place`` (default: Paddle's
    current device) uses."""
    if _chosen is not None:
        return _chosen
    place = place or paddle.framework._current_expected_place()
    return FUSED_CPU_PATH if on_cpu(place) and fused_cpu.load() is not None else PADDLE_PATH


def path_for(place: Any) -> UnscalePath:
    """The path for a new scaler whose tensors live on ``place``."""
    return by_name(default_unscale_path(place))


def by_name(name: str) -> UnscalePath:
    """The path called ``name`` (one of ``unscale_paths()``)."""
    if name == FUSED_CPU_PATH:
        ops = fused_cpu.load()
        if ops is not None:
            return fused_cpu.FusedCpu(ops)
    elif name == PADDLE_PATH:
        return PaddleKernels()
    raise ValueError(f"unscale path {name!r} is not available here: {unscale_paths()}")


@contextlib.contextmanager
def using_unscale_path(name: str) -> Iterator[None]:
    """Build the scalers made inside the block on ``name`` (for tests and benchmarks);
    restored on exit. A scaler keeps its path after the block."""
    global _chosen
    if name not in unscale_paths():
        raise ValueError(f"unscale path {name!r} is not available here: {unscale_paths()}")
    previous, _chosen = _chosen, name
    try:
        yield
    finally:
        _chosen = previous
