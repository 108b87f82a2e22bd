#!/usr/bin/env python
"""Per-step overhead of loss scalers on CPU: Paddle's own against paddle_amp_scaler.

A step here is the optimizer step and whatever the scaler adds to it, and nothing else:
no forward or backward runs in the timed region. The model is N float32 parameter
tensors whose scaled gradients are restored in place before every step (untimed), so
every implementation sees the same finite gradients; with ``--backward`` a real forward
and backward make them instead, as a training loop does, and leave the caches as a loop
leaves them. Implementations run interleaved, round by round in a fresh random order,
so that noise on a shared machine hits them all alike; every figure is a median.
``--before DIR`` also times the package of an earlier checkout, in the same rounds.

    PYTHONPATH=. python benchmarks/bench_scaler.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import importlib.metadata
import json
import math
import os
import platform
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import types
import warnings
from collections import defaultdict

# Paddle warns about a missing ccache on import; it says nothing about this benchmark.
warnings.filterwarnings("ignore", message="No ccache found")


def threading_env() -> dict:
    # OpenMP settings change how kernels that spawn threads behave on a busy machine.
    names = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "MKL_NUM_THREADS")
    return {name: os.environ[name] for name in names if name in os.environ}


# Taken before importing Paddle, which sets OMP_NUM_THREADS=1 when it is unset.
THREADING_ENV_AT_START = threading_env()

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle import _legacy_C_ops  # noqa: E402
from paddle.amp import grad_scaler as paddle_grad_scaler  # noqa: E402
from paddle.amp.auto_cast import amp_global_state  # noqa: E402

import paddle_amp_scaler  # noqa: E402
from paddle_amp_scaler import kernels  # noqa: E402
from paddle_amp_scaler.testing import HostReadCounter  # noqa: E402

import figures  # noqa: E402  (benchmarks/figures.py, beside this script)

SCALE = 2.0**10
# The saved gradients are scaled by SCALE, so the scale must never grow during a run.
NEVER = 2**31 - 1
SCALER_ARGS = {"init_loss_scaling": SCALE, "incr_every_n_steps": NEVER}

OVERHEAD_RATIO_TARGET = 0.35  # ours may cost at most this fraction of Paddle's overhead
# ...and at most this fraction with a forward and backward before each step, whose cold
# caches weigh more on the fixed costs.
OVERHEAD_RATIO_TARGET_BACKWARD = 0.5
BANDWIDTH_TARGET = 0.5  # ours' unscale pass must reach this fraction of a plain copy
# ...and take at most this multiple of NumPy's in-place multiply over the same memory,
# the least a pass that reads and writes every gradient can cost.
NUMPY_MULTIPLE_TARGET = 1.5
SEED = 2024
FLOAT32_BYTES = 4  # every parameter and gradient here is float32
WARMUP_ROUNDS = 3

# The pair of implementations each ratio compares: like with like, step with step.
RATIO_PAIRS = {
    "step": ("ours-step", "native-step"),
    "minimize": ("ours-minimize", "native-minimize"),
}
# With --before: the earlier checkout's package, as "before-step" and "before-minimize".
BEFORE_RATIO_PAIRS = {
    "before step": ("before-step", "native-step"),
    "before minimize": ("before-minimize", "native-minimize"),
}
# The earlier checkout's package, imported as paddle_amp_scaler_before by --before.
before_package = None
READ_ORIGINS = ("scaler", "paddle", "other")


@dataclasses.dataclass(frozen=True)
class Profile:
    workloads: str
    step_budget_s: float  # measured time per workload and optimizer
    bandwidth_budget_s: float  # measured time per workload
    min_rounds: int
    max_rounds: int


PROFILES = {
    # 64x4M against 256x4M and 64x32M against 512x32M give the cost per tensor at a
    # fixed size; 64x4M against 64x32M gives the cost per parameter.
    "default": Profile(
        "8x1M,64x1M,64x4M,256x4M,512x32M,64x32M",
        step_budget_s=25.0,
        bandwidth_budget_s=4.0,
        # The 32M workloads fit under 20 rounds in the budget, too few on a shared
        # machine: their ratios moved by 0.1 between runs.
        min_rounds=50,
        max_rounds=400,
    ),
    # 8x4M shares its tensor count with 8x1M and its size with 64x4M, so that even the
    # quick run can fit both cost-vs-size figures.
    "quick": Profile(
        "8x1M,8x4M,64x4M", step_budget_s=1.5, bandwidth_budget_s=0.4, min_rounds=7, max_rounds=60
    ),
}

OPTIMIZERS = {
    "sgd": lambda params: paddle.optimizer.SGD(learning_rate=1e-3, parameters=params),
    "adamw": lambda params: paddle.optimizer.AdamW(
        learning_rate=1e-3, parameters=params, weight_decay=0.01
    ),
}

_SIZE_SUFFIXES = {"K": 10**3, "M": 10**6, "G": 10**9}


@dataclasses.dataclass(frozen=True)
class Workload:
    label: str
    tensors: int
    params: int

    def sizes(self) -> list:
        """Tensor sizes that add up to ``params``, as even as integers allow."""
        base, extra = divmod(self.params, self.tensors)
        return [base + 1 if index < extra else base for index in range(self.tensors)]


def parse_count(text: str) -> int:
    suffix = text[-1:].upper()
    multiplier = _SIZE_SUFFIXES.get(suffix, 1)
    number = text[:-1] if suffix in _SIZE_SUFFIXES else text
    return int(float(number) * multiplier)


def parse_workload(text: str) -> Workload:
    try:
        tensors, params = text.lower().split("x")
        workload = Workload(text, int(tensors), parse_count(params))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"workload {text!r} is not TENSORSxPARAMS, e.g. 64x4M"
        ) from None
    if not 1 <= workload.tensors <= workload.params:
        raise argparse.ArgumentTypeError(f"workload {text!r} needs 1 <= tensors <= params")
    return workload


def parse_workloads(text: str) -> list:
    return [parse_workload(item.strip()) for item in text.split(",") if item.strip()]


def parse_optimizers(text: str) -> list:
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(OPTIMIZERS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"optimizers must be a comma-separated list from {sorted(OPTIMIZERS)}, got {text!r}"
        )
    return names


def parse_rounds(text: str) -> int:
    rounds = int(text)
    if rounds < 2:
        raise argparse.ArgumentTypeError("--rounds must be at least 2 (a spread needs two)")
    return rounds


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small workloads and few rounds (under a minute)"
    )
    parser.add_argument(
        "--rounds",
        type=parse_rounds,
        help="rounds per measurement (default: sized to a time budget)",
    )
    parser.add_argument(
        "--workloads",
        type=parse_workloads,
        help="comma-separated TENSORSxPARAMS, e.g. 8x1M,64x4M "
        f"(default: {PROFILES['default'].workloads})",
    )
    parser.add_argument(
        "--optimizers",
        type=parse_optimizers,
        default=["sgd", "adamw"],
        help="comma-separated, from: " + ",".join(OPTIMIZERS),
    )
    parser.add_argument(
        "--backward",
        action="store_true",
        help="run a real forward and backward before each step instead of restoring the "
        f"gradients (target {OVERHEAD_RATIO_TARGET_BACKWARD} instead of {OVERHEAD_RATIO_TARGET})",
    )
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="a checkout of an earlier revision: its package is timed too, in the same rounds",
    )
    parser.add_argument("--json", metavar="PATH", help="write every result to PATH as JSON")
    parser.add_argument(
        "--figure",
        metavar="PATH",
        help="draw the overheads relative to Paddle's to PATH, e.g. overhead.png "
        "(needs matplotlib)",
    )
    parser.add_argument(
        "--growth-figure",
        metavar="PATH",
        help="draw the overheads against parameters and tensors to PATH (needs matplotlib)",
    )
    args = parser.parse_args(argv)
    args.profile = PROFILES["quick" if args.quick else "default"]
    if args.workloads is None:
        args.workloads = parse_workloads(args.profile.workloads)
    return args


# -- the scalers under test -------------------------------------------------------------


@contextlib.contextmanager
def paddle_scaler_believes_it_runs_fp16_on_gpu():
    """Paddle's scalers switch themselves off on CPU, and ``scale()`` switches off outside
    float16 autocast: show them a GPU place and a float16 autocast state while building."""
    gpu_place = types.SimpleNamespace(
        is_gpu_place=lambda: True, is_xpu_place=lambda: False, is_custom_place=lambda: False
    )
    gpu_tracer = types.SimpleNamespace(_expected_place=gpu_place)
    real_tracer = paddle_grad_scaler._dygraph_tracer
    autocast_state = amp_global_state()
    real_dtype = autocast_state.amp_dtype
    paddle_grad_scaler._dygraph_tracer = lambda: gpu_tracer
    autocast_state.amp_dtype = "float16"
    try:
        yield
    finally:
        paddle_grad_scaler._dygraph_tracer = real_tracer
        autocast_state.amp_dtype = real_dtype


def check_really_scales(scaler):
    # A disabled scaler costs nothing and would make every ratio look great.
    probe = paddle.to_tensor([1.0], dtype="float32")
    if not scaler.is_enable() or float(scaler.scale(probe).numpy()[0]) != SCALE:
        raise RuntimeError(
            f"{type(scaler).__module__}.{type(scaler).__name__} did not "
            f"enable itself: it would not scale, so timing it means nothing"
        )
    return scaler


def build_native(scaler_class):
    with paddle_scaler_believes_it_runs_fp16_on_gpu():
        return check_really_scales(scaler_class(**SCALER_ARGS))


def build_ours(scaler_class, **options):
    return check_really_scales(scaler_class(**SCALER_ARGS, **options))


# Ours with one option on at a time, against ours-step with every option at its default.
OPTIONS = {
    "max bound": {"max_loss_scaling": 2.0**30},
    "floor 0.5": {"min_loss_scaling": 0.5},
    "stuck": {"stuck_after": 100},
    "report": {"report_overflows": True},
    # Held at the start by its bound: the gradients restored between steps do not follow
    # the scale, as real ones do, and would let the policy grow without end (into
    # subnormal unscaled values, which the CPU computes slowly). The policy still
    # measures and decides at every step.
    "headroom": {"policy": "headroom", "max_loss_scaling": SCALE},
}


@contextlib.contextmanager
def statistics_not_counted():
    # What the always-on statistics cost: ours-step with their recording stubbed out.
    from paddle_amp_scaler import statistics

    counters = getattr(statistics, "RunStatistics", None) or statistics.RunCounters
    name = "record" if hasattr(counters, "record") else "record_"  # before: record_
    record = getattr(counters, name)
    setattr(counters, name, lambda self, found, counters: None)
    try:
        yield
    finally:
        setattr(counters, name, record)


def without_statistics(run):
    def run_uncounted():
        with statistics_not_counted():
            return run()

    return run_uncounted


def step_and_update(scaler, optimizer):
    def step():
        scaler.step(optimizer)
        scaler.update()

    return step


def minimize_with(scaler, optimizer):
    # Dygraph minimize only collects the grads that exist; it wants a loss all the same.
    unused_loss = paddle.to_tensor(0.0)
    return lambda: scaler.minimize(optimizer, unused_loss)


def floor_step(optimizer):
    """The least any scaler can do: multiply each grad by 1/scale, then step."""
    inverse_scale = 1.0 / SCALE
    params = optimizer._parameter_list

    def step():
        # A grad is a leaf that does not stop gradient: in-place ops on it need no_grad.
        with paddle.no_grad():
            for param in params:
                # Fetched per step, as a scaler must: clear_grad may replace the tensors.
                param._grad_ivar().scale_(inverse_scale)
        optimizer.step()

    return step


def unscale_paths() -> list:
    """The unscale paths ours can be switched between, if this version offers a choice."""
    list_paths = getattr(kernels, "unscale_paths", None)
    if list_paths is None or not hasattr(kernels, "using_unscale_path"):
        return []
    return list(list_paths())


def default_unscale_path() -> str:
    """The path ours takes by default; if the package cannot say, why, rather than no
    figures at all."""
    ask = getattr(kernels, "default_unscale_path", lambda: "paddle")
    try:
        return ask()
    except Exception as error:  # a bug to report, not a reason to measure nothing
        return f"unknown: default_unscale_path() raised {type(error).__name__}: {error}"


def on_unscale_path(path, make):
    """The function ``make()`` returns, built and run on unscale ``path``: since 0.3 a
    scaler keeps the path it was built on; before, the path was looked up at each call."""
    with kernels.using_unscale_path(path):
        run = make()

    def run_on_path():
        with kernels.using_unscale_path(path):
            return run()

    return run_on_path


def implementations() -> dict:
    """Name -> function of the optimizer that returns one training step, built fresh."""
    makers = {
        "none": lambda optimizer: optimizer.step,
        "native-step": lambda optimizer: step_and_update(
            build_native(paddle.amp.GradScaler), optimizer
        ),
        "native-minimize": lambda optimizer: minimize_with(
            build_native(paddle.amp.AmpScaler), optimizer
        ),
        "ours-step": lambda optimizer: step_and_update(
            build_ours(paddle_amp_scaler.GradScaler), optimizer
        ),
        "ours-minimize": lambda optimizer: minimize_with(
            build_ours(paddle_amp_scaler.AmpScaler), optimizer
        ),
        "floor": floor_step,
    }
    if before_package is not None:
        makers["before-step"] = lambda optimizer: step_and_update(
            build_ours(before_package.GradScaler), optimizer
        )
        makers["before-minimize"] = lambda optimizer: minimize_with(
            build_ours(before_package.AmpScaler), optimizer
        )
    for path in unscale_paths():
        makers[f"ours-step[{path}]"] = lambda optimizer, path=path: on_unscale_path(
            path, lambda: step_and_update(build_ours(paddle_amp_scaler.GradScaler), optimizer)
        )
    if hasattr(paddle_amp_scaler, "ScalerStats"):
        makers["ours-step[no stats]"] = lambda optimizer: without_statistics(
            step_and_update(build_ours(paddle_amp_scaler.GradScaler), optimizer)
        )
        for name, options in OPTIONS.items():
            makers[f"ours-step[{name}]"] = lambda optimizer, options=options: step_and_update(
                build_ours(paddle_amp_scaler.GradScaler, **options), optimizer
            )
    return makers


# -- the model and its gradients ------------------------------------------------------


def build_parameters(workload):
    paddle.seed(SEED)
    return [paddle.create_parameter([size], "float32") for size in workload.sizes()]


def give_scaled_gradients(params):
    """Give each parameter a gradient in [-SCALE, SCALE], as backward of a scaled loss would.

    Finite on purpose: Paddle's scaler crashes on its first overflow under NumPy 2
    (``float()`` of a shape-[1] tensor in its log message).
    """
    for param in params:
        weights = paddle.uniform(param.shape, min=-1.0, max=1.0) * SCALE
        (param * weights).sum().backward()


def gradients_of(params):
    return [param._grad_ivar() for param in params]


def snapshot(tensors):
    with paddle.no_grad():
        return [tensor.clone() for tensor in tensors]


def restore_gradients(params, saved):
    for grad, value in zip(gradients_of(params), saved):
        paddle.assign(value, output=grad)


def grad_bytes(params) -> int:
    return sum(grad.size * FLOAT32_BYTES for grad in gradients_of(params))


# -- timing -----------------------------------------------------------------------------


@contextlib.contextmanager
def gc_paused():
    # A collection during a timed call would land on one implementation only.
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def time_interleaved(calls, rounds, prepare, rng) -> dict:
    """Seconds taken by each call, once per round, in a fresh random order each round."""
    samples = {name: [] for name in calls}
    order = list(calls)
    with gc_paused():
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                prepare()
                start = time.perf_counter()
                calls[name]()
                samples[name].append(time.perf_counter() - start)
    return samples


def warm_up(calls, prepare, rng) -> float:
    """Run a few untimed rounds; return the wall time of the last, to size the real run.

    The first calls allocate optimizer state and fill caches that later calls reuse.
    """
    for _ in range(WARMUP_ROUNDS):
        start = time.perf_counter()
        time_interleaved(calls, 1, prepare, rng)
        round_s = time.perf_counter() - start
    return round_s


def rounds_within(budget_s, round_s, profile, fixed_rounds) -> int:
    if fixed_rounds:
        return fixed_rounds
    return max(profile.min_rounds, min(profile.max_rounds, int(budget_s / round_s)))


def paired_overhead_ms(seconds, baseline_seconds) -> float:
    """The median over rounds of a call's time minus the baseline's in the same round:
    a load that drifts between rounds hits both sides of each difference alike."""
    return median_ms([took - baseline for took, baseline in zip(seconds, baseline_seconds)])


def paired_overhead_iqr_ms(seconds, baseline_seconds) -> float:
    """The interquartile range of the same per-round differences: the overhead's spread."""
    return iqr_ms([took - baseline for took, baseline in zip(seconds, baseline_seconds)])


def median_ms(seconds) -> float:
    return statistics.median(seconds) * 1e3


def iqr_ms(seconds) -> float:
    lower, _, upper = statistics.quantiles(seconds, n=4)
    return (upper - lower) * 1e3


def count_host_reads(step, prepare) -> dict:
    prepare()
    counter = HostReadCounter()
    with counter.counting():
        step()
    return dict(counter.reads)


# -- measurements -------------------------------------------------------------------------


def measure_steps(workload, optimizer_name, params, saved, args, rng) -> dict:
    optimizer = OPTIMIZERS[optimizer_name](params)
    steps = {name: make(optimizer) for name, make in implementations().items()}
    weights = [grad.clone() for grad in saved] if args.backward else None

    def prepare():
        if weights is None:
            restore_gradients(params, saved)
        else:
            # What a training loop runs between two steps: the gradient of each
            # sum(param * weight) is its weight, the same scaled gradients every round.
            optimizer.clear_grad()
            paddle.add_n(
                [(param * weight).sum() for param, weight in zip(params, weights)]
            ).backward()
        # Paddle's scaler leaves its verdict on the optimizer; a step without a scaler
        # must not inherit it.
        optimizer._set_auxiliary_var("found_inf", None)

    round_s = warm_up(steps, prepare, rng)
    reads = {name: count_host_reads(step, prepare) for name, step in steps.items()}
    rounds = rounds_within(args.profile.step_budget_s, round_s, args.profile, args.rounds)
    samples = time_interleaved(steps, rounds, prepare, rng)
    impls = {
        name: {
            "median_ms": median_ms(samples[name]),
            "iqr_ms": iqr_ms(samples[name]),
            "overhead_ms": paired_overhead_ms(samples[name], samples["none"]),
            "overhead_iqr_ms": paired_overhead_iqr_ms(samples[name], samples["none"]),
            "host_reads": reads[name],
        }
        for name in steps
    }
    return {
        "workload": workload.label,
        "tensors": workload.tensors,
        "params": workload.params,
        "optimizer": optimizer_name,
        "rounds": rounds,
        "impls": impls,
        "ratios": {kind: overhead_ratio(impls, *pair) for kind, pair in ratio_pairs().items()},
    }


def ratio_pairs() -> dict:
    return {**RATIO_PAIRS, **(BEFORE_RATIO_PAIRS if before_package is not None else {})}


def overhead_ratio(impls, ours, native):
    native_overhead = impls[native]["overhead_ms"]
    if native_overhead <= 0:
        return None  # lost in the noise: no ratio to speak of
    return impls[ours]["overhead_ms"] / native_overhead


def copy_all(sources, destinations):
    for source, destination in zip(sources, destinations):
        paddle.assign(source, output=destination)


def numpy_view(tensor):
    """A NumPy array over a float32 CPU tensor's own memory (no copy)."""
    elements = math.prod(tensor.shape)
    return np.ctypeslib.as_array((ctypes.c_float * elements).from_address(tensor.data_ptr()))


def gradients_to_unscale(params):
    """The gradients as ``kernels.unscale_and_check_`` takes them: in parameter order, or
    grouped by dtype before paddle_amp_scaler 0.1's compiled module (for before/after
    runs against an earlier revision)."""
    group = getattr(kernels, "grads_by_dtype", None)
    if group is not None:
        return group(params)
    from paddle_amp_scaler import optimizers

    # optimizers.grads_of since the core was simplified, kernels.grads_of before.
    grads_of = getattr(optimizers, "grads_of", None) or kernels.grads_of
    return grads_of(params)


def ours_unscale(grads, scale, all_finite):
    """Ours' unscale-and-check on the path a scaler built here now takes: each scaler holds
    its path since 0.3 (the path of the place, or of using_unscale_path()); before, one
    module function looked the path up at every call."""
    by_name = getattr(kernels, "by_name", None)
    if by_name is None:
        return kernels.unscale_and_check_(grads, scale, all_finite)
    return by_name(kernels.default_unscale_path(scale.place)).unscale_and_check_(
        grads, scale, all_finite
    )


def multiply_in_place(arrays, factor):
    for array in arrays:
        np.multiply(array, factor, out=array)


def measure_unscale_bandwidth(workload, params, args, rng) -> dict:
    """GB/s of one unscale-and-check pass over all the grads, against a plain copy and
    NumPy's in-place multiply (which checks nothing).

    Each pass reads every byte once and writes it once, so all of them move 2x the bytes.
    Ours collects the gradients from the parameters, as a step must.
    """
    grads = gradients_of(params)
    arrays = [numpy_view(grad) for grad in grads]
    # Scale 1.0 leaves the values as they are: passes can repeat with no refill.
    unit_scale = paddle.to_tensor([1.0], dtype="float32")
    nothing_to_check = paddle.to_tensor([False])
    native_found = paddle.to_tensor([False])
    copies = [paddle.empty_like(grad) for grad in grads]
    passes = {
        "copy": lambda: copy_all(grads, copies),
        "numpy": lambda: multiply_in_place(arrays, np.float32(1.0)),
        "ours": lambda: ours_unscale(gradients_to_unscale(params), unit_scale, nothing_to_check),
        "native": lambda: _legacy_C_ops.check_finite_and_unscale(
            grads, unit_scale, grads, native_found
        ),
    }
    for path in unscale_paths():
        passes[f"ours[{path}]"] = on_unscale_path(path, lambda: passes["ours"])

    def prepare():
        pass  # nothing to restore: a pass at scale 1.0 changes no value

    round_s = warm_up(passes, prepare, rng)
    rounds = rounds_within(args.profile.bandwidth_budget_s, round_s, args.profile, args.rounds)
    samples = time_interleaved(passes, rounds, prepare, rng)
    moved_bytes = 2 * grad_bytes(params)
    results = {}
    for name, seconds in samples.items():
        median_s = statistics.median(seconds)
        results[name] = {"median_ms": median_s * 1e3, "gb_per_s": moved_bytes / median_s / 1e9}
    for result in results.values():
        result["vs_copy"] = result["gb_per_s"] / results["copy"]["gb_per_s"]
        result["vs_numpy"] = result["median_ms"] / results["numpy"]["median_ms"]
    return {
        "workload": workload.label,
        "tensors": workload.tensors,
        "params": workload.params,
        "grad_bytes": moved_bytes // 2,
        "rounds": rounds,
        "passes": results,
    }


def measure_workload(workload, args, rng):
    params = build_parameters(workload)
    give_scaled_gradients(params)
    saved = snapshot(gradients_of(params))
    runs = []
    for optimizer_name in args.optimizers:
        runs.append(measure_steps(workload, optimizer_name, params, saved, args, rng))
        print_run(runs[-1])
    bandwidth = measure_unscale_bandwidth(workload, params, args, rng)
    print_bandwidth(bandwidth)
    return runs, bandwidth


# -- cost against size ------------------------------------------------------------------


def least_squares_slope(xs, ys) -> float:
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


# The standard error of a median over n rounds is about 1.2533 sigma / sqrt(n) for normal
# noise, and such noise has sigma = IQR / 1.349: so 0.929 IQR / sqrt(n). The IQR is robust
# to the rare stalled round that a standard deviation would let dominate.
MEDIAN_STANDARD_ERROR_PER_IQR = 1.2533 / 1.349


def slope_noise(xs, runs, impl) -> float:
    """Twice the standard error of the least-squares slope through the runs' overheads.

    Each overhead is a median over rounds whose own spread (the IQR of its per-round
    differences) gives its standard error; the slope is a weighted sum of the overheads,
    with weights (x - mean x) / sum (x - mean x)^2, so its variance is the sum of theirs
    times the squared weights. A slope inside twice its error, where about 95 in 100
    slopes of a true zero fall, is within noise: printed as such rather than as a cost of
    either sign that nothing measured. Workloads run one after another, so a load that
    changes between them is not in this band.
    """
    mean_x = statistics.fmean(xs)
    spread = sum((x - mean_x) ** 2 for x in xs)
    variance = sum(
        ((x - mean_x) / spread) ** 2
        * (
            MEDIAN_STANDARD_ERROR_PER_IQR
            * run["impls"][impl]["overhead_iqr_ms"]
            / math.sqrt(run["rounds"])
        )
        ** 2
        for x, run in zip(xs, runs)
    )
    return 2 * math.sqrt(variance)


def slopes_within(runs, fixed, varied, unit) -> list:
    """Slope of ours' and native's step overhead against ``varied`` (per ``unit``), for
    each value of ``fixed`` that workloads with two or more values of ``varied`` share."""
    groups = defaultdict(list)
    for run in runs:
        groups[run[fixed]].append(run)
    fits = []
    for value, group in sorted(groups.items()):
        xs = [run[varied] / unit for run in group]
        if len(set(xs)) < 2:
            continue
        fit = {fixed: value, "workloads": [run["workload"] for run in group]}
        for who, impl in (("ours", "ours-step"), ("native", "native-step")):
            fit[who] = least_squares_slope(xs, [run["impls"][impl]["overhead_ms"] for run in group])
            fit[f"{who}_noise"] = slope_noise(xs, group, impl)
        fits.append(fit)
    return fits


def fit_cost_vs_size(runs) -> dict:
    fits = {}
    for optimizer_name in dict.fromkeys(run["optimizer"] for run in runs):
        mine = [run for run in runs if run["optimizer"] == optimizer_name]
        fits[optimizer_name] = {
            "ms_per_mparam": slopes_within(mine, "tensors", "params", 1e6),
            "ms_per_tensor": slopes_within(mine, "params", "tensors", 1),
        }
    return fits


# -- output ---------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_info() -> dict:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "paddle": paddle.__version__,
        "paddle_commit": paddle.version.commit,
        "numpy": importlib.metadata.version("numpy"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "threading_env_at_start": THREADING_ENV_AT_START,
        "threading_env_after_imports": threading_env(),
    }


def format_count(count) -> str:
    for suffix, multiplier in sorted(_SIZE_SUFFIXES.items(), key=lambda item: -item[1]):
        if count >= multiplier:
            return f"{count / multiplier:g}{suffix}"
    return str(count)


def load_average(info) -> str:
    loads = info["load_average"]
    return "unknown" if loads is None else " ".join(f"{load:.2f}" for load in loads)


def print_header(info, command, args):
    between = "a forward and backward" if args.backward else "gradients restored, no backward"
    print(f"Loss-scaler overhead per training step (CPU, float32 grads; between steps: {between})")
    print(f"command:  {command}")
    print(
        f"machine:  {info['cpu_count']} CPUs ({info['usable_cpus']} usable), "
        f"{info['cpu_model']}, {info['platform']}, load average {load_average(info)}"
    )
    print(
        f"versions: Python {info['python']}, Paddle {info['paddle']} "
        f"({info['paddle_commit'][:10]}), NumPy {info['numpy']}, "
        f"paddle_amp_scaler {paddle_amp_scaler.__version__}"
    )
    print(
        f"threads:  environment at start {info['threading_env_at_start']}, "
        f"after importing Paddle {info['threading_env_after_imports']}"
    )
    print(
        f"ours unscales on path {default_unscale_path()!r} by default; "
        f"paths to compare: {unscale_paths() or 'none offered'}"
    )
    print(
        f"scale {SCALE:g}; rounds {args.rounds or 'sized to a time budget'}; "
        f"medians over interleaved rounds; overhead = median over rounds of "
        f"(time - time of none in the same round)"
    )


def print_run(run):
    print(
        f"\n== {run['workload']}: {run['tensors']} tensors, {format_count(run['params'])} "
        f"params, {run['optimizer']}, {run['rounds']} rounds"
    )
    print(
        f"{'impl':<24}{'median ms':>11}{'iqr ms':>9}{'overhead ms':>13}"
        f"   host reads scaler/paddle/other"
    )
    for name, impl in run["impls"].items():
        overhead = "-" if name == "none" else f"{impl['overhead_ms']:.3f}"
        reads = "/".join(str(impl["host_reads"][origin]) for origin in READ_ORIGINS)
        print(f"{name:<24}{impl['median_ms']:>11.3f}{impl['iqr_ms']:>9.3f}{overhead:>13}   {reads}")
    for kind, (ours, native) in ratio_pairs().items():
        print(f"overhead {ours} / {native}: {ratio_verdict(run['ratios'][kind])}")


def ratio_verdict(ratio) -> str:
    if ratio is None:
        return "n/a (native overhead lost in the noise)"
    verdict = "PASS" if ratio <= ratio_target else "FAIL"
    return f"{ratio:.2f}  {verdict} (target <= {ratio_target})"


# The headroom policy's step against the interval rule's, in one interleaved run.
HEADROOM_COST_TARGET = 1.1

# The target of this run: OVERHEAD_RATIO_TARGET, or the --backward one.
ratio_target = OVERHEAD_RATIO_TARGET


def bandwidth_verdict(vs_copy) -> str:
    verdict = "PASS" if vs_copy >= BANDWIDTH_TARGET else "FAIL"
    return f"{verdict} (target >= {BANDWIDTH_TARGET})"


def numpy_verdict(vs_numpy) -> str:
    verdict = "PASS" if vs_numpy <= NUMPY_MULTIPLE_TARGET else "FAIL"
    return f"{verdict} (target <= {NUMPY_MULTIPLE_TARGET})"


def print_bandwidth(bandwidth):
    print(
        f"\n-- unscale pass over the {bandwidth['workload']} grads "
        f"({bandwidth['grad_bytes'] / 1e6:.1f} MB, read once and written once), "
        f"{bandwidth['rounds']} rounds"
    )
    print(f"{'pass':<24}{'median ms':>11}{'GB/s':>9}{'vs copy':>9}{'x numpy':>9}")
    for name, result in bandwidth["passes"].items():
        verdict = (
            f"   {bandwidth_verdict(result['vs_copy'])}, {numpy_verdict(result['vs_numpy'])}"
            if name == "ours"
            else ""
        )
        print(
            f"{name:<24}{result['median_ms']:>11.3f}{result['gb_per_s']:>9.2f}"
            f"{result['vs_copy']:>9.2f}{result['vs_numpy']:>9.2f}{verdict}"
        )


FEWER_PARAMS_COST_MORE = "the smaller workload cost more"
LARGER_TENSORS_COST_MORE = "the fewer, larger tensors cost more"


def slope_text(fit, who, negative_means) -> str:
    """The slope, or "within noise" with the band it fell in (``slope_noise``). A slope
    below zero beyond the noise is no cost but a measured difference, and is named so: the
    quick profile's 8 tensors of 500k against 64 of 62.5k come out that way for Paddle's
    SGD in most runs, whichever workload runs first."""
    slope, noise = fit[who], fit[f"{who}_noise"]
    if abs(slope) <= noise:
        return f"within noise (±{noise:.2g})"
    if slope < 0:
        return f"{slope:.4g} (beyond the noise, ±{noise:.2g}: {negative_means})"
    return f"{slope:.4g}"


def print_fits(fits):
    print("\n== cost against size (overhead of ours-step and native-step)")
    for optimizer_name, fit in fits.items():
        for slope in fit["ms_per_mparam"] or [None]:
            print(
                f"{optimizer_name}: "
                + (
                    "ms per M params: n/a (needs two workloads with the same tensor count)"
                    if slope is None
                    else f"ms per M params at {slope['tensors']} tensors: "
                    f"ours {slope_text(slope, 'ours', FEWER_PARAMS_COST_MORE)}, "
                    f"native {slope_text(slope, 'native', FEWER_PARAMS_COST_MORE)} "
                    f"({', '.join(slope['workloads'])})"
                )
            )
        for slope in fit["ms_per_tensor"] or [None]:
            print(
                f"{optimizer_name}: "
                + (
                    "ms per tensor: n/a (needs two workloads with the same size)"
                    if slope is None
                    else f"ms per tensor at {format_count(slope['params'])} params: ours "
                    f"{slope_text(slope, 'ours', LARGER_TENSORS_COST_MORE)}, "
                    f"native {slope_text(slope, 'native', LARGER_TENSORS_COST_MORE)} "
                    f"({', '.join(slope['workloads'])})"
                )
            )


def print_summary(runs, bandwidths):
    print("\n== summary")
    for run in runs:
        for kind, (ours, native) in ratio_pairs().items():
            print(
                f"{run['workload']:>10} {run['optimizer']:<6} {ours} / {native} overhead: "
                f"{ratio_verdict(run['ratios'][kind])}"
            )
    for run in runs:
        impls = run["impls"]
        if "ours-step[headroom]" in impls:
            ratio = impls["ours-step[headroom]"]["median_ms"] / impls["ours-step"]["median_ms"]
            verdict = "PASS" if ratio <= HEADROOM_COST_TARGET else "FAIL"
            print(
                f"{run['workload']:>10} {run['optimizer']:<6} ours-step[headroom] / ours-step "
                f"per-step time: {ratio:.2f}  {verdict} (target <= {HEADROOM_COST_TARGET}); "
                f"overheads {impls['ours-step[headroom]']['overhead_ms']:.3f} and "
                f"{impls['ours-step']['overhead_ms']:.3f} ms"
            )
    for bandwidth in bandwidths:
        passes = bandwidth["passes"]
        print(
            f"{bandwidth['workload']:>10} unscale pass vs copy: ours "
            f"{passes['ours']['vs_copy']:.2f} {bandwidth_verdict(passes['ours']['vs_copy'])}, "
            f"native {passes['native']['vs_copy']:.2f}; ours x numpy "
            f"{passes['ours']['vs_numpy']:.2f} {numpy_verdict(passes['ours']['vs_numpy'])}"
        )


def import_before(checkout):
    """The package of an earlier checkout, imported beside this one under another name
    (its imports are relative; its compiled module is built under a name of its own)."""
    global before_package
    source = os.path.join(os.path.abspath(checkout), "paddle_amp_scaler")
    if not os.path.isfile(os.path.join(source, "__init__.py")):
        raise SystemExit(f"--before {checkout}: no paddle_amp_scaler package there")
    copy = os.path.join(tempfile.mkdtemp(prefix="bench-before-"), "paddle_amp_scaler_before")
    shutil.copytree(source, copy)
    sys.path.insert(0, os.path.dirname(copy))
    before_package = importlib.import_module("paddle_amp_scaler_before")


def main(argv=None) -> int:
    global ratio_target
    args = parse_args(argv)
    paddle.set_device("cpu")
    if args.backward:
        ratio_target = OVERHEAD_RATIO_TARGET_BACKWARD
    if args.before:
        import_before(args.before)
    command = " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv])
    info = machine_info()
    print_header(info, command, args)
    rng = random.Random(SEED)
    started = time.perf_counter()
    runs, bandwidths = [], []
    for workload in args.workloads:
        workload_runs, bandwidth = measure_workload(workload, args, rng)
        runs.extend(workload_runs)
        bandwidths.append(bandwidth)
    fits = fit_cost_vs_size(runs)
    print_fits(fits)
    print_summary(runs, bandwidths)
    elapsed = time.perf_counter() - started
    print(f"\nmeasured in {elapsed:.1f} s")
    results = {
        "command": command,
        "machine": info,
        "quick": args.quick,
        "scale": SCALE,
        "backward": args.backward,
        "before": args.before,
        "default_unscale_path": default_unscale_path(),
        "unscale_paths": unscale_paths(),
        "targets": {
            "overhead_ratio_max": ratio_target,
            "bandwidth_vs_copy_min": BANDWIDTH_TARGET,
            "unscale_vs_numpy_max": NUMPY_MULTIPLE_TARGET,
        },
        "runs": runs,
        "bandwidth": bandwidths,
        "cost_vs_size": fits,
        "elapsed_s": elapsed,
    }
    if args.json:
        write_json(args.json, results)
    if args.figure:
        figures.draw_overheads(results, args.figure)
    if args.growth_figure:
        figures.draw_growth(results, args.growth_figure)
    return 0


def write_json(path, results):
    with open(path, "w") as output:
        json.dump(results, output, indent=2, allow_nan=False)
        output.write("\n")


if __name__ == "__main__":
    sys.exit(main())
