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
``~/.cache/paddle_extensions``) under the folder ``build_status().directory`` names,
quietly but for one INFO line of the package logger. Everything the build prints, its
compiler's and Paddle's, goes to ``build.log`` in that folder, never to the terminal.

Without a compiler (or when the build fails for another reason) the scaler uses Paddle's
kernels, with the same results, after one WARNING line that gives the cause, names the
log and says that ``PADDLE_AMP_SCALER_FUSED=0`` turns the helper off. The failure is
remembered in that folder (``paddle_amp_scaler.failed``) with the compilers it was tried
with, the path and ``--version`` output of ``$CXX`` and ``$CC`` or, unset, of those
Python was built with (which setuptools, under Paddle's builder, runs): later processes
with the same Paddle and the same compilers try nothing and say nothing (DEBUG only),
and ``build_status()`` reads ``"failed"``. A new compiler, a new version of it, or a new
Paddle tries again; so does deleting the folder. With ``PADDLE_AMP_SCALER_FUSED=0`` in
the environment nothing is built or said.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import functools
import glob
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import traceback
import warnings
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, Optional, TextIO

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
_FAILED = "paddle_amp_scaler.failed"
_LOG = "build.log"

# The compiled module: unscale_and_check(grads, scale) -> (found_inf, found as a bool);
# unscale_check_and_tally(grads, scale) -> (found_inf, tally, found as a bool);
# zero_if_found(grads, found_inf); update_scale(found_inf, scale, incr_count, decr_count,
# incr_every_n_steps, decr_every_n_nan_or_inf, incr_ratio, decr_ratio, min_scale,
# max_scale, backoff_divisor) -> fired, and count_iteration(counts, found_inf, fired), in
# place. Grads are float32 or float64 CPU tensors, mixed as they come.
FusedOps = Any

# What identifies a compiler for the failure record: {"CXX": {"command", "chosen_by",
# "path", "version"}, "CC": {...}}, as JSON reads it back.
Compilers = dict[str, dict[str, Optional[str]]]

_FALLBACK = "the scaler uses Paddle's kernels on CPU, with the same results, a few times slower"
_WAY_OUT = "PADDLE_AMP_SCALER_FUSED=0 turns the helper off and this warning with it"


def disabled_by_environment() -> bool:
    return os.environ.get("PADDLE_AMP_SCALER_FUSED", "1").strip().lower() in ("0", "false", "no")


@functools.cache
def load() -> FusedOps | None:
    """The compiled module, built if need be; None if it cannot be had here."""
    if disabled_by_environment():
        return None
    try:
        return _build_or_import()
    except _BuildFailed as failure:
        if failure.remembered:
            # Said once, by the process that tried; the others only leave a trace.
            logger.debug(
                "the compiled CPU helper failed to build before with this Paddle and "
                "compiler (%s; build log: %s); %s",
                failure.reason,
                failure.log_file,
                _FALLBACK,
            )
        else:
            logger.warning(
                "the compiled CPU helper could not be built (%s; build log: %s); %s, and "
                "tries the build again only when the compiler or Paddle changes. %s",
                failure.reason,
                failure.log_file,
                _FALLBACK,
                _WAY_OUT,
            )
        return None
    except Exception as error:  # an unwritable cache, a kept build that no longer loads
        logger.warning(
            "the compiled CPU helper could not be built or loaded (%s); %s. %s",
            _first_line(error),
            _FALLBACK,
            _WAY_OUT,
        )
        return None


@dataclasses.dataclass(frozen=True)
class BuildStatus:
    """What is known of the compiled helper here, without building it: ``state`` is
    ``"built"``, ``"not built yet"``, ``"failed"`` or ``"disabled"``; ``directory`` is
    where its build for this Paddle lives; ``log_file`` holds a build's output, where
    one was kept; ``reason`` says why it is disabled or failed (or, not built yet after
    a build that failed with other compilers, that failure: these ones will be tried)."""

    state: str
    directory: str
    log_file: str | None = None
    reason: str | None = None


def build_status() -> BuildStatus:
    """The helper's state for this Paddle installation; builds nothing, loads nothing
    (it asks the compilers their ``--version`` after a failure, to know whether it
    holds for them)."""
    directory = os.path.join(cache_directory(), _build_name())
    if disabled_by_environment():
        return BuildStatus("disabled", directory, reason="PADDLE_AMP_SCALER_FUSED=0")
    if os.path.exists(os.path.join(directory, _BUILT)):
        log_file = os.path.join(directory, _LOG)
        return BuildStatus("built", directory, log_file if os.path.exists(log_file) else None)
    failure = _Failure.read(directory)
    if failure is None:
        return BuildStatus("not built yet", directory)
    if failure.compilers == _compilers():
        return BuildStatus("failed", directory, failure.log_file, failure.reason)
    return BuildStatus(
        "not built yet",
        directory,
        failure.log_file,
        f"the last build failed with other compilers ({failure.reason}); the next "
        "scaler tries these",
    )


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
            tensors.margin_at,
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
            rule.NEVER,
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
    # One builder at a time; a build killed half-way has no marker and is redone. A
    # process that waited for a build that failed finds its record, and stays quiet.
    with _exclusive(directory + ".lock"):
        if os.path.exists(marker):
            # Importing the built library directly skips the seconds that
            # cpp_extension.load spends re-checking the build in every process.
            with open(marker, encoding="utf-8") as built:
                module = _import(name, built.read().strip())
            _verify(module)
            return module
        compilers = _compilers()
        failure = _Failure.read(directory)
        if failure is not None and failure.compilers == compilers:
            if failure.warned or not _heard(logging.WARNING):
                raise _BuildFailed(failure.reason, failure.log_file, remembered=True)
            # The process that failed was not heard (a rank other than 0, whose
            # records distributed.py drops): the first one that is says it.
            dataclasses.replace(failure, warned=True).write(directory)
            raise _BuildFailed(failure.reason, failure.log_file, remembered=False)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        log_file = os.path.join(directory, _LOG)
        try:
            library = _build(name, directory, log_file, compilers)
            module = _import(name, library)
            _verify(module)
        except Exception as error:
            reason = error.reason if isinstance(error, _CompileFailed) else _first_line(error)
            with open(log_file, "a", encoding="utf-8") as log:
                log.write(f"\nnot built: {reason}\n\n{traceback.format_exc()}")
            _Failure(reason, log_file, compilers, _heard(logging.WARNING)).write(directory)
            raise _BuildFailed(reason, log_file, remembered=False) from error
        with open(marker, "w", encoding="utf-8") as built:
            built.write(library)
    return module


def _build(name: str, directory: str, log_file: str, compilers: Compilers) -> str:
    """Build the library with Paddle's extension builder, everything it says written to
    ``log_file``; its path. Raises ``_CompileFailed`` with the cause if Paddle's build
    fails."""
    cxx = compilers["CXX"]
    if cxx["path"] is None:
        # The build is still run: Paddle's builder is the judge, and its error goes to
        # the log; but no "building" line is promised for a build that cannot succeed.
        logger.debug("no C++ compiler found; trying Paddle's build anyway, into %s", directory)
    else:
        logger.info(
            "building the compiled CPU helper once for this Paddle, about 15 s, into %s",
            directory,
        )
    # Appending: the build's processes write through descriptors that share the file.
    with open(log_file, "a", encoding="utf-8", buffering=1) as log:
        log.write(_log_header(compilers))
        start = log.tell()
        try:
            with _output_into(log):
                from paddle.utils import cpp_extension

                cpp_extension.load(
                    name=name,
                    sources=[_SOURCE],
                    build_directory=directory,
                    extra_cxx_cflags=[
                        "-O3",
                        "-fopenmp-simd",
                        f"-DPADDLE_AMP_SCALER_MODULE={name}",
                    ],
                    verbose=True,  # the compiler's command lines, for the log
                )
        except Exception as error:
            with open(log_file, encoding="utf-8") as written:
                written.seek(start)
                output = written.read()
            raise _CompileFailed(_cause(error, output, compilers)) from error
    libraries = glob.glob(os.path.join(directory, "**", "*.so"), recursive=True)
    if len(libraries) != 1:
        raise RuntimeError(f"expected one built library in {directory}, found {libraries}")
    return libraries[0]


class _CompileFailed(Exception):
    """Paddle's build failed; ``reason`` is the cause that its output shows, in one line
    (Paddle's own exception only says that a command failed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _BuildFailed(Exception):
    """The build failed, in this process or (``remembered``) in an earlier one with the
    same Paddle and compilers."""

    def __init__(self, reason: str, log_file: str, *, remembered: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_file = log_file
        self.remembered = remembered


@dataclasses.dataclass(frozen=True)
class _Failure:
    """A failed build, kept in its folder: the folder is per Paddle installation, the
    record says with which compilers it failed, and whether its warning was heard."""

    reason: str
    log_file: str
    compilers: Compilers
    warned: bool = True

    @staticmethod
    def read(directory: str) -> _Failure | None:
        try:
            with open(os.path.join(directory, _FAILED), encoding="utf-8") as file:
                record = json.load(file)
            return _Failure(
                str(record["reason"]),
                str(record["log_file"]),
                record["compilers"],
                bool(record.get("warned", True)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            # None kept, or not one this code wrote: the next scaler builds again.
            return None

    def write(self, directory: str) -> None:
        path = os.path.join(directory, _FAILED)
        with open(path + ".tmp", "w", encoding="utf-8") as file:
            json.dump(dataclasses.asdict(self), file, indent=1)
        os.replace(path + ".tmp", path)


def _compilers() -> Compilers:
    """The compilers Paddle's builder will run, picked as setuptools picks them: ``$CXX``
    and ``$CC`` (unset: those Python was built with); each with where PATH finds it and
    what its ``--version`` says, so that a new compiler, or a new version, is noticed."""
    found: Compilers = {}
    for role, default in (("CXX", "c++"), ("CC", "cc")):
        chosen_by = f"${role}" if role in os.environ else "Python's build"
        command = os.environ.get(role, sysconfig.get_config_var(role) or default)
        words = shlex.split(command) or [default]
        path = shutil.which(words[0])
        version = None
        if path is not None:
            try:
                answer = subprocess.run(
                    [path, *words[1:], "--version"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                version = (answer.stdout + answer.stderr).strip()
            except (OSError, subprocess.SubprocessError) as error:
                version = f"no answer to --version: {error}"
        found[role] = {"command": command, "chosen_by": chosen_by, "path": path, "version": version}
    return found


def _cause(error: BaseException, output: str, compilers: Compilers) -> str:
    """The cause of a failed build in one line: the missing compiler, else the compiler's
    first error, else the build's last exception, else Paddle's own message (which names
    neither: "Failed to run command: <built-in function compile>, ...")."""
    cxx = compilers["CXX"]
    if cxx["path"] is None:
        name = shlex.split(cxx["command"] or "c++")[0]
        where = "is not on PATH" if cxx["chosen_by"] == "Python's build" else "($CXX) is not found"
        return f"no C++ compiler: {name} {where}; install one, or name it in CXX"
    lines = [line.strip() for line in output.splitlines()]
    compiler_errors = [line for line in lines if re.search(r"\berror:", line, re.IGNORECASE)]
    if compiler_errors:
        return compiler_errors[0]
    exceptions = [line for line in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception): ", line)]
    if exceptions:
        return exceptions[-1]
    return _first_line(error)


def _heard(level: int) -> bool:
    """Whether a record at ``level`` passes the package logger's level and filters in
    this process."""
    record = logger.makeRecord(logger.name, level, __file__, 0, "", (), None)
    return logger.isEnabledFor(level) and bool(logger.filter(record))


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), repr(error))


def _log_header(compilers: Compilers) -> str:
    lines = [
        f"paddle_amp_scaler: building {_SOURCE}",
        f"started: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"paddle: {paddle.__version__} (commit {paddle.version.commit}) in "
        f"{os.path.dirname(paddle.__file__)}",
        f"python: {sys.executable} {sys.version.split()[0]}",
        f"PATH: {os.environ.get('PATH', '')}",
    ]
    for role, compiler in compilers.items():
        version = (compiler["version"] or "").splitlines()
        lines.append(
            f"{role}: {compiler['command']} (from {compiler['chosen_by']}) -> "
            f"{compiler['path'] or 'not found'}" + (f": {version[0]}" if version else "")
        )
    return "\n".join(lines) + "\n\n"


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
def _output_into(log: TextIO) -> Iterator[None]:
    """Everything said during the build into ``log``: this process's output and its
    children's, Paddle's extension logger and warnings.

    Paddle's builder runs ``python setup.py build`` in a shell that writes to this
    process's file descriptors 1 and 2 (its traceback, when there is no compiler),
    whatever ``sys.stdout`` is: so the descriptors themselves point at the log for the
    build's seconds, other threads' output with them. ``sys.stdout`` and ``sys.stderr``
    follow too, for where they are not descriptors (a notebook's)."""
    from paddle.utils.cpp_extension import extension_utils

    chatty = extension_utils.logger
    handlers, propagate, level = chatty.handlers, chatty.propagate, chatty.level
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    saved = []
    for descriptor in (1, 2):
        with contextlib.suppress(OSError):  # closed: nothing can be printed there
            saved.append((descriptor, os.dup(descriptor)))
            os.dup2(log.fileno(), descriptor)
    chatty.handlers, chatty.propagate = [logging.StreamHandler(log)], False
    chatty.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield
    finally:
        log.flush()
        for descriptor, copy in saved:
            os.dup2(copy, descriptor)
            os.close(copy)
        chatty.handlers, chatty.propagate = handlers, propagate
        chatty.setLevel(level)
