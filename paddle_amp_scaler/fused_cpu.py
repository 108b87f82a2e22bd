"""A fused CPU unscale-and-check kernel, compiled on first use with Paddle's custom-op tools.

On CPU, Paddle's ``check_finite_and_unscale`` makes three passes over each gradient
(a bool buffer, its reduction, the multiply). ``fused_unscale.cc`` makes one: it
multiplies in place and OR-reduces the exponent bits, vectorised, at about the speed
of a plain copy. The results are bit-identical to Paddle's kernel (the same
``x * (1 / scale)`` in the gradient's precision, the same inf/nan verdict). A second op
counts an iteration's statistics in one call where Paddle ops take six, each of which
costs microseconds of dispatch on a CPU; a third unscales and counts each gradient's inf
and nan elements in the same pass, for the overflow report.

The build needs a C++ compiler and takes about 15 s, once per Paddle version and
source revision (cached under Paddle's extension directory). Without a compiler, or
with ``PADDLE_AMP_SCALER_FUSED=0`` in the environment, the scaler uses Paddle's kernel.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import hashlib
import io
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import paddle
from paddle import Tensor

logger = logging.getLogger("paddle_amp_scaler")

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_unscale.cc")
_BUILT = "paddle_amp_scaler.built"

# unscale_and_check(grads, scale) -> found_inf; grads share one dtype, scale has it too.
UnscaleAndCheck = Callable[[Sequence[Tensor], Tensor], Tensor]
# count_iteration(row, found, incr_count, decr_count, dynamic) -> the next row of
# statistics.py's counters.
CountIteration = Callable[[Tensor, Tensor, Tensor, Tensor, bool], Tensor]
# unscale_check_and_count(grads, scale, row, found, incr, decr, dynamic) -> (found_inf,
# row): the previous iteration's count done in the same call as this one's unscale.
UnscaleCheckAndCount = Callable[
    [Sequence[Tensor], Tensor, Tensor, Tensor, Tensor, Tensor, bool], tuple[Tensor, Tensor]
]
# unscale_check_and_tally(grads, scale) -> (found_inf, tally): tally is int64
# [len(grads), 2], each gradient's (infs, nans) before it was unscaled.
UnscaleCheckAndTally = Callable[[Sequence[Tensor], Tensor], tuple[Tensor, Tensor]]


class FusedOps(NamedTuple):
    unscale_and_check: UnscaleAndCheck
    count_iteration: CountIteration
    unscale_check_and_count: UnscaleCheckAndCount
    unscale_check_and_tally: UnscaleCheckAndTally


def disabled_by_environment() -> bool:
    return os.environ.get("PADDLE_AMP_SCALER_FUSED", "1").strip().lower() in ("0", "false", "no")


@functools.cache
def load() -> FusedOps | None:
    """The compiled ops, built if need be; None if they cannot be had here."""
    if disabled_by_environment():
        return None
    try:
        return _build_or_register()
    except Exception as error:  # no compiler, no headers, a failed check: fall back
        logger.warning(
            "fused CPU unscale kernel unavailable (%s); using Paddle's "
            "check_finite_and_unscale on CPU",
            error,
        )
        return None


def _build_or_register() -> FusedOps:
    from paddle.utils import cpp_extension

    with open(_SOURCE, "rb") as source:
        digest = hashlib.sha256(source.read()).hexdigest()[:12]
    version = paddle.__version__.replace(".", "_").replace("-", "_").replace("+", "_")
    name = f"paddle_amp_scaler_fused_{version}_{digest}"
    directory = os.path.join(cpp_extension.get_build_directory(), name)
    marker = os.path.join(directory, _BUILT)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    # One builder at a time; a build killed half-way has no marker and is redone.
    with _exclusive(directory + ".lock"):
        if os.path.exists(marker):
            # Registering the built library directly skips the seconds that
            # cpp_extension.load spends re-checking the build in every process.
            with open(marker, encoding="utf-8") as built, _quiet_paddle_build_output():
                cpp_extension.load_op_meta_info_and_register_op(built.read().strip())
            runner = _runner()
            _verify(runner)
            return runner
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        logger.info("building the fused CPU unscale kernel in %s (once, about 15 s)", directory)
        with warnings.catch_warnings(), _quiet_paddle_build_output():
            warnings.simplefilter("ignore")
            cpp_extension.load(
                name=name,
                sources=[_SOURCE],
                build_directory=directory,
                extra_cxx_cflags=["-O3", "-fopenmp-simd"],
                verbose=False,
            )
        runner = _runner()
        _verify(runner)
        libraries = glob.glob(os.path.join(directory, "**", "*.so"), recursive=True)
        if len(libraries) != 1:
            raise RuntimeError(f"expected one built library in {directory}, found {libraries}")
        with open(marker, "w", encoding="utf-8") as built:
            built.write(libraries[0])
    return runner


def _runner() -> FusedOps:
    # How Paddle's generated wrappers call a registered custom op, in 3.x and in 2.6:
    # inputs, then attributes, positionally.
    run = getattr(paddle._C_ops, "_run_custom_op", None) or paddle.base.core.eager._run_custom_op

    def unscale_and_check(grads: Sequence[Tensor], scale: Tensor) -> Tensor:
        return run("fused_unscale_and_check", grads, scale)[0]

    def count_iteration(
        row: Tensor, found: Tensor, incr_count: Tensor, decr_count: Tensor, dynamic: bool
    ) -> Tensor:
        return run("fused_count_iteration", row, found, incr_count, decr_count, dynamic)[0]

    def unscale_check_and_count(
        grads: Sequence[Tensor],
        scale: Tensor,
        row: Tensor,
        found: Tensor,
        incr_count: Tensor,
        decr_count: Tensor,
        dynamic: bool,
    ) -> tuple[Tensor, Tensor]:
        found_inf, counted = run(
            "fused_unscale_check_and_count",
            grads,
            scale,
            row,
            found,
            incr_count,
            decr_count,
            dynamic,
        )
        return found_inf, counted

    def unscale_check_and_tally(grads: Sequence[Tensor], scale: Tensor) -> tuple[Tensor, Tensor]:
        found_inf, tally = run("fused_unscale_check_and_tally", grads, scale)
        return found_inf, tally

    return FusedOps(
        unscale_and_check, count_iteration, unscale_check_and_count, unscale_check_and_tally
    )


def _verify(ops: FusedOps) -> None:
    """Check the ops against known answers before trusting them with gradients.

    Reads its own small CPU tensors back (never a gradient), once per process when the
    ops are first loaded: every scaler's constructor loads them, so that neither the
    build nor these reads land in a training step.
    """
    unscale_and_check = ops.unscale_and_check
    for dtype in ("float32", "float64"):
        scale = paddle.to_tensor([2.0], dtype=dtype)
        values = [1.0, -2.0, 0.5, 3e38, -0.0]
        finite = paddle.to_tensor(values, dtype=dtype)
        found = unscale_and_check([finite], scale).numpy()[0]
        expected = np.array(values, dtype=dtype) * np.array(0.5, dtype=dtype)
        if found or not np.array_equal(finite.numpy(), expected):
            raise RuntimeError(f"the compiled kernel failed its check on finite {dtype}")
        for bad in (np.inf, -np.inf, np.nan):
            grads = [finite, paddle.to_tensor([1.0, bad, 2.0], dtype=dtype)]
            if not unscale_and_check(grads, scale).numpy()[0]:
                raise RuntimeError(f"the compiled kernel missed {bad} in {dtype}")
    # [skipped, skip_streak, since_skip, growths, backoffs, 1]: a skip that backs off.
    row = paddle.to_tensor([[2.0, 1.0, 0.0, 5.0, 3.0, 1.0]], dtype="float64")
    zero, one = paddle.to_tensor([0], dtype="int32"), paddle.to_tensor([1], dtype="int32")
    counted = ops.count_iteration(row, paddle.to_tensor([True]), zero, zero, True).numpy()
    if counted.tolist() != [[3.0, 2.0, 0.0, 5.0, 4.0, 1.0]] or row.numpy()[0, 0] != 2.0:
        raise RuntimeError("the compiled counter failed its check on a skipped iteration")
    counted = ops.count_iteration(row, paddle.to_tensor([False]), one, zero, True).numpy()
    if counted.tolist() != [[2.0, 0.0, 1.0, 5.0, 3.0, 1.0]]:
        raise RuntimeError("the compiled counter failed its check on a finite iteration")
    grads = [paddle.to_tensor([4.0, np.inf], dtype="float32")]
    found, counted = ops.unscale_check_and_count(
        grads, paddle.to_tensor([2.0]), row, paddle.to_tensor([False]), zero, zero, True
    )
    if (
        not found.numpy()[0]
        or counted.numpy().tolist() != [[2.0, 0.0, 1.0, 6.0, 3.0, 1.0]]
        or grads[0].numpy()[0] != 2.0
    ):
        raise RuntimeError("the compiled unscale-and-count failed its check")
    for dtype in ("float32", "float64"):
        grads = [
            paddle.to_tensor([np.inf, -np.inf, np.nan, 4.0], dtype=dtype),
            paddle.to_tensor([8.0], dtype=dtype),
            paddle.to_tensor([-np.nan, np.inf, 1.0], dtype=dtype),
        ]
        found, tally = ops.unscale_check_and_tally(grads, paddle.to_tensor([2.0], dtype=dtype))
        if (
            not found.numpy()[0]
            or tally.numpy().tolist() != [[2, 1], [0, 0], [1, 1]]
            or grads[1].numpy()[0] != 4.0
        ):
            raise RuntimeError(f"the compiled unscale-and-tally failed its check on {dtype}")


@contextlib.contextmanager
def _exclusive(lock_path: str) -> Iterator[None]:
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_paddle_build_output() -> Iterator[None]:
    # Paddle's extension builder prints a notice and logs at INFO on every load; the
    # user asked for neither (our own INFO line above says what happens).
    from paddle.utils.cpp_extension import extension_utils

    chatty = extension_utils.logger
    level = chatty.level
    chatty.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        chatty.setLevel(level)
