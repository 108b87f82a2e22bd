"""The scaler's CPU work compiled (``fused_unscale.cc``), built on first use with Paddle's
extension tools.

On CPU, Paddle's ``check_finite_and_unscale`` makes three passes over each gradient
(a bool buffer, its reduction, the multiply). The compiled module makes one: it
multiplies in place and max-reduces the exponent bits, vectorised, at about the speed
of a plain copy, bit-identical to Paddle's kernel (the same ``x * (1 / scale)`` in the
gradient's precision, the same inf/nan verdict). It also applies the update rule, counts
an iteration's statistics, zeroes a plain SGD step's gradients, and unscales while
counting each gradient's inf and nan elements for the overflow report: each a function
call of a few microseconds, where a Paddle operation costs tens right after a training
step (see the source for why it is not a Paddle custom operator).

It is built the first time a scaler is made on a CPU (or ``kernels.unscale_paths()`` is
asked): about 15 s with a C++ compiler, once per Paddle installation and source
revision, cached in Paddle's extension directory (``$PADDLE_EXTENSION_DIR``, else
``~/.cache/paddle_extensions``), quietly but for one INFO line of the package logger.
Without a compiler, or with ``PADDLE_AMP_SCALER_FUSED=0`` in the environment, the scaler
uses Paddle's kernels, after one WARNING line saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import glob
import hashlib
import importlib.util
import io
import logging
import math
import os
import shutil
import sys
import warnings
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import paddle
from paddle import Tensor

from . import rule
from .kernels import PaddleKernels
from .scale_tensors import ScaleTensors
from .verdict import Verdict

logger = logging.getLogger("paddle_amp_scaler")

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_unscale.cc")
_BUILT = "paddle_amp_scaler.built"

# The compiled module: unscale_and_check(grads, scale) -> (found_inf, found as a bool);
# unscale_check_and_tally(grads, scale) -> (found_inf, tally, found as a bool);
# zero_if_found(grads, found_inf); update_scale(found_inf, scale, incr_count, decr_count,
# incr_every_n_steps, decr_every_n_nan_or_inf, incr_ratio, decr_ratio, min_scale,
# max_scale, backoff_divisor) -> fired, and count_iteration(counts, found_inf, fired), in
# place. Grads are float32 or float64 CPU tensors, mixed as they come.
FusedOps = Any


def disabled_by_environment() -> bool:
    return os.environ.get("PADDLE_AMP_SCALER_FUSED", "1").strip().lower() in ("0", "false", "no")


@functools.cache
def load() -> FusedOps | None:
    """The compiled module, built if need be; None if it cannot be had here."""
    if disabled_by_environment():
        return None
    try:
        return _build_or_import()
    except Exception as error:  # no compiler, no headers, a failed check: fall back
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        logger.warning(
            "the compiled CPU helper could not be built or loaded (%s); the scaler uses "
            "Paddle's kernels on CPU, with the same results, a few times slower",
            first_line,
        )
        return None


@dataclasses.dataclass(frozen=True)
class BuildStatus:
    """What is known of the compiled helper here, without building it: ``state`` is
    ``"built"``, ``"not built yet"``, ``"failed"`` or ``"disabled"``; ``directory`` is
    where its build for this Paddle lives; ``log_file`` holds a build's output, where
    one was kept; ``reason`` says why it is disabled or failed."""

    state: str
    directory: str
    log_file: str | None = None
    reason: str | None = None


def build_status() -> BuildStatus:
    """The helper's state for this Paddle installation; builds nothing, loads nothing."""
    directory = os.path.join(cache_directory(), _build_name())
    if disabled_by_environment():
        return BuildStatus("disabled", directory, reason="PADDLE_AMP_SCALER_FUSED=0")
    if os.path.exists(os.path.join(directory, _BUILT)):
        return BuildStatus("built", directory)
    return BuildStatus("not built yet", directory)


def cache_directory() -> str:
    """Where the helper is built and cached: Paddle's extension directory, that is
    ``$PADDLE_EXTENSION_DIR`` or ``~/.cache/paddle_extensions``."""
    return os.environ.get("PADDLE_EXTENSION_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "paddle_extensions"
    )


class FusedCpu:
    """The unscale path on a CPU with the compiled module: unscale and check every dtype
    in one call, the update rule and an iteration's statistics in place, each a call of a
    few microseconds. A verdict comes back as a host bool too, with no read."""

    name = "fused-cpu"
    # The amax comes in the unscale's own pass: every iteration is measured.
    measure_every = 1

    def __init__(self, ops: FusedOps) -> None:
        self._ops = ops
        # Statistics count each iteration in place as it ends (statistics.py).
        self.count_iteration_ = ops.count_iteration
        self._tables: dict[float, tuple[Tensor, Tensor]] = {}

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # A compiled module does not pickle; an unpickled scaler takes this machine's.
        return _fused_or_paddle, ()

    def unscale_and_check_(
        self,
        grads: Sequence[Tensor | None],
        scale: Tensor,
        all_finite: Tensor,
        *,
        measure: bool = False,
    ) -> Verdict:
        present = [grad for grad in grads if grad is not None]
        if not present:
            return Verdict(all_finite, False)
        if measure:
            found_inf, found, amax = self._ops.unscale_check_and_measure(present, scale)
            return Verdict(found_inf, found, amax)
        return Verdict(*self._ops.unscale_and_check(present, scale))

    def unscale_check_and_tally_(
        self, grads: Sequence[Tensor], scale: Tensor, all_finite: Tensor, *, measure: bool = False
    ) -> tuple[Verdict, Tensor | None]:
        if not grads:
            return Verdict(all_finite, False), None
        found_inf, tally, found, amax = self._ops.unscale_check_and_tally(list(grads), scale)
        return Verdict(found_inf, found, amax if measure else None), tally

    def zero_if_found_(self, grads: Sequence[Tensor | None], found_inf: Tensor) -> None:
        self._ops.zero_if_found([grad for grad in grads if grad is not None], found_inf)

    def adjust_(
        self,
        found: Tensor,
        tensors: ScaleTensors,
        policy: rule.Policy,
        *,
        amax: Tensor | None = None,
        iteration: int = 0,
    ) -> Tensor:
        if policy.name == "headroom":
            return self._adjust_headroom_(found, tensors, policy, amax, iteration)
        fired: Tensor = self._ops.update_scale(
            found,
            tensors.scale,
            tensors.incr_count,
            tensors.decr_count,
            policy.incr_every_n_steps,
            policy.decr_every_n_nan_or_inf,
            policy.incr_ratio,
            policy.decr_ratio,
            policy.min_scale,
            math.inf if policy.max_scale is None else policy.max_scale,
            policy.backoff_divisor or 0.0,
        )
        return fired

    def _adjust_headroom_(
        self,
        found: Tensor,
        tensors: ScaleTensors,
        policy: rule.Policy,
        amax: Tensor | None,
        iteration: int,
    ) -> Tensor:
        factors, limits = self._tables_for(policy.incr_ratio)
        fired: Tensor = self._ops.update_scale_headroom(
            found,
            tensors.amax if amax is None else amax,  # read only when measured
            amax is not None,
            iteration,
            tensors.scale,
            tensors.incr_count,
            tensors.decr_count,
            tensors.margin,
            tensors.grown_at,
            tensors.anchor,
            tensors.amax,
            policy.incr_every_n_steps,
            policy.decr_every_n_nan_or_inf,
            policy.decr_ratio,
            policy.min_scale,
            rule.FLOAT32_MAX if policy.max_scale is None else policy.max_scale,
            policy.backoff_divisor or 0.0,
            rule.calibration_stride(policy.decr_ratio),
            rule.CALIBRATION_ITERATIONS,
            rule.MIN_MARGIN,
            rule.MAX_MARGIN,
            factors,
            limits,
        )
        return fired

    def _tables_for(self, incr_ratio: float) -> tuple[Tensor, Tensor]:
        """rule.py's float32 tables, made once per ratio: the growth factors and the
        limit of each margin."""
        if incr_ratio not in self._tables:
            self._tables[incr_ratio] = (
                paddle.to_tensor(rule.growth_factors(incr_ratio), place=paddle.CPUPlace()),
                paddle.to_tensor(rule.margin_limits(), place=paddle.CPUPlace()),
            )
        return self._tables[incr_ratio]


def _fused_or_paddle() -> FusedCpu | PaddleKernels:
    ops = load()
    return PaddleKernels() if ops is None else FusedCpu(ops)


def _build_name() -> str:
    """One build per source revision and Paddle installation: the library links to the
    Paddle it was built against (two environments with the same Paddle version, or a
    CPU and a GPU build, do not share one)."""
    with open(_SOURCE, "rb") as source:
        digest = hashlib.sha256(source.read()).hexdigest()[:12]
    installation = os.path.realpath(os.path.dirname(paddle.__file__))
    identity = f"{installation}|{paddle.version.commit}|{sys.version}".encode()
    version = paddle.__version__.replace(".", "_").replace("-", "_").replace("+", "_")
    return f"paddle_amp_scaler_fused_{version}_{digest}_{hashlib.sha256(identity).hexdigest()[:8]}"


def _build_or_import() -> FusedOps:
    name = _build_name()
    directory = os.path.join(cache_directory(), name)
    marker = os.path.join(directory, _BUILT)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    # One builder at a time; a build killed half-way has no marker and is redone.
    with _exclusive(directory + ".lock"):
        if os.path.exists(marker):
            # Importing the built library directly skips the seconds that
            # cpp_extension.load spends re-checking the build in every process.
            with open(marker, encoding="utf-8") as built:
                module = _import(name, built.read().strip())
            _verify(module)
            return module
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        logger.info(
            "building the compiled CPU helper once for this Paddle, about 15 s, into %s",
            directory,
        )
        with _quiet_paddle_build():
            from paddle.utils import cpp_extension

            cpp_extension.load(
                name=name,
                sources=[_SOURCE],
                build_directory=directory,
                extra_cxx_cflags=["-O3", "-fopenmp-simd", f"-DPADDLE_AMP_SCALER_MODULE={name}"],
                verbose=False,
            )
        libraries = glob.glob(os.path.join(directory, "**", "*.so"), recursive=True)
        if len(libraries) != 1:
            raise RuntimeError(f"expected one built library in {directory}, found {libraries}")
        module = _import(name, libraries[0])
        _verify(module)
        with open(marker, "w", encoding="utf-8") as built:
            built.write(libraries[0])
    return module


def _import(name: str, library: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{library} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verify(ops: FusedOps) -> None:
    """Check the module against known answers before trusting it with gradients.

    Reads its own small CPU tensors back (never a gradient), once per process when the
    module is first loaded: every scaler's constructor loads it, so that neither the
    build nor these reads land in a training step.
    """
    for dtype in ("float32", "float64"):
        scale = paddle.to_tensor([2.0])
        values = [1.0, -2.0, 0.5, 3e38, -0.0]
        finite = paddle.to_tensor(values, dtype=dtype)
        found_inf, found = ops.unscale_and_check([finite], scale)
        found = found or found_inf.numpy()[0]
        expected = np.array(values, dtype=dtype) * np.array(0.5, dtype=dtype)
        if found or not np.array_equal(finite.numpy(), expected):
            raise RuntimeError(f"the compiled kernel failed its check on finite {dtype}")
        for bad in (np.inf, -np.inf, np.nan):
            grads = [finite, paddle.to_tensor([1.0, bad, 2.0], dtype=dtype)]
            found_inf, found = ops.unscale_and_check(grads, scale)
            if not (found and found_inf.numpy()[0]):
                raise RuntimeError(f"the compiled kernel missed {bad} in {dtype}")
        grads = [
            paddle.to_tensor([np.inf, -np.inf, np.nan, 4.0], dtype=dtype),
            paddle.to_tensor([8.0], dtype=dtype),
            paddle.to_tensor([-np.nan, np.inf, 1.0], dtype=dtype),
        ]
        found_inf, tally, found, amax = ops.unscale_check_and_tally(grads, scale)
        if (
            not (found and found_inf.numpy()[0])
            or tally.numpy().tolist() != [[2, 1], [0, 0], [1, 1]]
            or grads[1].numpy()[0] != 4.0
            or amax.numpy()[0] != 8.0
        ):
            raise RuntimeError(f"the compiled unscale-and-tally failed its check on {dtype}")
        grads = [paddle.to_tensor([-3.0, np.inf, 1.0], dtype=dtype), paddle.to_tensor([6.0])]
        _, found, amax = ops.unscale_check_and_measure(grads, scale)
        if not found or amax.numpy()[0] != 6.0 or grads[0].numpy()[0] != -1.5:
            raise RuntimeError(f"the compiled unscale-and-measure failed its check on {dtype}")
    # [skipped, skip_streak, since_skip, growths, backoffs]: a skip that backs off, then a
    # finite iteration that does not grow.
    counts = paddle.to_tensor([2, 1, 0, 5, 3], dtype="int64")
    true, false = paddle.to_tensor([True]), paddle.to_tensor([False])
    ops.count_iteration(counts, true, true)
    if counts.numpy().tolist() != [3, 2, 0, 5, 4]:
        raise RuntimeError("the compiled counter failed its check on a skipped iteration")
    ops.count_iteration(counts, false, false)
    if counts.numpy().tolist() != [3, 0, 1, 5, 4]:
        raise RuntimeError("the compiled counter failed its check on a finite iteration")
    # rule.adjust's answers: a back-off on the second overflow, a growth every step.
    one = paddle.to_tensor([1], dtype="int32")
    scale, incr, decr = paddle.to_tensor([4.0]), one.clone(), one.clone()
    fired = ops.update_scale(true, scale, incr, decr, 3, 2, 2.0, 0.5, 1.0, math.inf, 0.0)
    if [scale.numpy()[0], incr.numpy()[0], decr.numpy()[0], fired.numpy()[0]] != [2.0, 0, 0, True]:
        raise RuntimeError("the compiled update rule failed its check on a back-off")
    fired = ops.update_scale(false, scale, incr, decr, 1, 2, 2.0, 0.5, 1.0, math.inf, 0.0)
    if [scale.numpy()[0], incr.numpy()[0], decr.numpy()[0], fired.numpy()[0]] != [4.0, 0, 0, True]:
        raise RuntimeError("the compiled update rule failed its check on a growth")


@contextlib.contextmanager
def _exclusive(lock_path: str) -> Iterator[None]:
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_paddle_build() -> Iterator[None]:
    """Paddle's extension builder warns (a missing ccache among others), prints a notice
    and logs at INFO; the user asked for none of it (our one INFO line says what
    happens)."""
    # The build runs Python in a child process, which imports Paddle and warns again.
    child_warnings = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = "ignore"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from paddle.utils.cpp_extension import extension_utils

        chatty = extension_utils.logger
        level = chatty.level
        chatty.setLevel(logging.WARNING)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            chatty.setLevel(level)
            if child_warnings is None:
                del os.environ["PYTHONWARNINGS"]
            else:
                os.environ["PYTHONWARNINGS"] = child_warnings
