#!/usr/bin/env python
"""What a loss scaler adds to a training step: Paddle's own against paddle_amp_scaler.

Both run Paddle's kernels, the path every device takes, here on a CPU. The model is N
float32 parameter tensors; before every timed step a real forward and backward (untimed)
give them the same scaled gradients, as a training loop does, and leave the caches as a
loop leaves them. A timed step is the optimizer step and whatever the scaler adds to it
(``step`` + ``update``, or ``minimize``). Implementations run interleaved, round by round
in a fresh random order, so that noise on a shared machine hits them all alike; an
overhead is the median over rounds of a step's time minus the time of the same step
without a scaler (``none``) in the same round. ``--before DIR`` also times the package of
an earlier checkout, on Paddle's kernels, in the same rounds.

    PYTHONPATH=. python benchmarks/bench_scaler.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import importlib.metadata
import json
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

# Paddle warns about a missing ccache on import; it says nothing about this benchmark.
warnings.filterwarnings("ignore", message="No ccache found")


def threading_env() -> dict:
    # OpenMP settings change how kernels that spawn threads behave on a busy machine.
    names = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "MKL_NUM_THREADS")
    return {name: os.environ[name] for name in names if name in os.environ}


# Taken before importing Paddle, which sets OMP_NUM_THREADS=1 when it is unset.
THREADING_ENV_AT_START = threading_env()

# The tests' instruments (tests/counters.py), beside the benchmarks.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import paddle  # noqa: E402
from counters import HostReadCounter  # noqa: E402
from paddle.amp import grad_scaler as paddle_grad_scaler  # noqa: E402
from paddle.amp.auto_cast import amp_global_state  # noqa: E402

import paddle_amp_scaler  # noqa: E402
from paddle_amp_scaler.core.monitoring import RunStatistics  # noqa: E402

import figures  # noqa: E402  (benchmarks/figures.py, beside this script)

SCALE = 2.0**10
# The gradients are scaled by SCALE whatever the scale, so the scale must never grow.
NEVER = 2**31 - 1
SCALER_ARGS = {"init_loss_scaling": SCALE, "incr_every_n_steps": NEVER}

# Ours' overhead may be at most this multiple of Paddle's own, step and minimize alike.
OVERHEAD_RATIO_TARGET = 1.0
# The headroom policy's whole step against the interval rule's, in the same rounds.
HEADROOM_COST_TARGET = 1.1
# Ours' overhead over the floor's: the bare kernels, with nothing of a scaler around them.
BARE_KERNELS_TARGET = 1.1
SEED = 2024
WARMUP_ROUNDS = 3

# The pair of implementations each ratio compares: like with like, step with step.
RATIO_PAIRS = {
    "step": ("ours-step", "native-step"),
    "minimize": ("ours-minimize", "native-minimize"),
}
# Each scaler's step against the floor: Paddle's two kernels and the optimizer's step.
FLOOR_RATIO_PAIRS = {
    "step over the floor": ("ours-step", "bare-kernels"),
    "Paddle's step over the floor": ("native-step", "bare-kernels"),
}
# With --before: the earlier checkout's package, as "before-step" and "before-minimize".
BEFORE_RATIO_PAIRS = {
    "before step": ("before-step", "native-step"),
    "before minimize": ("before-minimize", "native-minimize"),
}
# The earlier checkout's package, imported as paddle_amp_scaler_before by --before.
before_package = None
READ_ORIGINS = ("scaler", "paddle", "other")
# The implementation column of a run's table: the longest name, ours-step[measure every step].
IMPL_WIDTH = 31


@dataclasses.dataclass(frozen=True)
class Profile:
    workloads: str
    step_budget_s: float  # measured time per workload and optimizer
    min_rounds: int
    max_rounds: int


PROFILES = {
    # Few and many tensors at one size (8x1M, 64x1M; 64x4M, 256x4M; 64x32M, 512x32M) and
    # one tensor count at three sizes (64x1M, 64x4M, 64x32M).
    "default": Profile(
        "8x1M,64x1M,64x4M,256x4M,512x32M,64x32M",
        step_budget_s=25.0,
        # The 32M workloads fit under 20 rounds in the budget, too few on a shared
        # machine: their ratios moved by 0.1 between runs.
        min_rounds=50,
        max_rounds=400,
    ),
    "quick": Profile("8x1M,64x1M", step_budget_s=1.5, min_rounds=7, max_rounds=60),
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
        "--before",
        metavar="DIR",
        help="a checkout of an earlier revision: its package is timed too, on Paddle's "
        "kernels, in the same rounds",
    )
    parser.add_argument("--json", metavar="PATH", help="write every result to PATH as JSON")
    parser.add_argument(
        "--figure",
        metavar="PATH",
        help="draw the overheads relative to Paddle's to PATH, e.g. overhead.png "
        "(needs matplotlib)",
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


def check_really_scales(scaler, scale):
    # A disabled scaler costs nothing and would make every ratio look great.
    probe = paddle.to_tensor([1.0], dtype="float32")
    if not scaler.is_enable() or float(scaler.scale(probe).numpy()[0]) != scale:
        raise RuntimeError(
            f"{type(scaler).__module__}.{type(scaler).__name__} did not "
            f"enable itself: it would not scale, so timing it means nothing"
        )
    return scaler


def build_native(scaler_class, **settings):
    """Paddle's scaler, enabled on a CPU; SCALER_ARGS but where ``settings`` say else."""
    settings = {**SCALER_ARGS, **settings}
    with paddle_scaler_believes_it_runs_fp16_on_gpu():
        return check_really_scales(scaler_class(**settings), settings["init_loss_scaling"])


def build_ours(scaler_class, **options):
    return check_really_scales(scaler_class(**SCALER_ARGS, **options), SCALE)


# Ours with one option on at a time, against ours-step with every option at its default.
OPTIONS = {
    "max bound": {"max_loss_scaling": 2.0**30},
    "floor 0.5": {"min_loss_scaling": 0.5},
    "stuck": {"stuck_after": 100},
    "report": {"report_overflows": True},
    # Held at the start by its bound: the gradients here are scaled by SCALE whatever
    # the scale, and would let the policy grow without end (into subnormal unscaled
    # values, which the CPU computes slowly). It still measures and decides on its
    # schedule.
    "headroom": {"policy": "headroom", "max_loss_scaling": SCALE},
    # Every iteration measured (the amax, subnormal and nonzero counts of each scaled
    # gradient, on the device): what a measured iteration costs. One in measure_every
    # pays it; the interval rule measures nothing unless it is given.
    "measure every step": {"measure_every": 1},
}


@contextlib.contextmanager
def statistics_not_counted():
    # What the always-on statistics cost: ours-step with their recording stubbed out.
    end_iteration = RunStatistics.end_iteration
    RunStatistics.end_iteration = lambda self, end: None
    try:
        yield
    finally:
        RunStatistics.end_iteration = end_iteration


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


def bare_kernels(optimizer):
    """The floor of a step with loss scaling, as a loop of a few lines would run it: the
    gradients in one C++ call, one unscale and check, the flag handed to the optimizer,
    its step, and the rule's update on the device. A scaler can only add to it."""
    params = optimizer._parameter_list
    scale = paddle.to_tensor([2.0**15])
    good, bad = paddle.zeros([1], dtype="int32"), paddle.zeros([1], dtype="int32")
    all_grads = paddle.base.core.eager.get_all_grads
    C_ops = paddle._C_ops

    def step():
        grads = all_grads(params)
        _, found = C_ops.check_finite_and_unscale_(grads, scale)
        optimizer._set_auxiliary_var("found_inf", found)
        optimizer.step()
        optimizer._set_auxiliary_var("found_inf", None)
        C_ops.update_loss_scaling_(grads, found, scale, good, bad, 2000, 1, 2.0, 0.5, False)

    return step


def implementations() -> dict:
    """Name -> function of the optimizer that returns one training step, built fresh."""

    def ours_step(optimizer, **options):
        return step_and_update(build_ours(paddle_amp_scaler.GradScaler, **options), optimizer)

    makers = {
        "none": lambda optimizer: optimizer.step,
        "bare-kernels": bare_kernels,
        "native-step": lambda optimizer: step_and_update(
            build_native(paddle.amp.GradScaler), optimizer
        ),
        "native-minimize": lambda optimizer: minimize_with(
            build_native(paddle.amp.AmpScaler), optimizer
        ),
        "ours-step": ours_step,
        "ours-minimize": lambda optimizer: minimize_with(
            build_ours(paddle_amp_scaler.AmpScaler), optimizer
        ),
    }
    if before_package is not None:
        makers["before-step"] = lambda optimizer: step_and_update(
            build_ours(before_package.GradScaler), optimizer
        )
        makers["before-minimize"] = lambda optimizer: minimize_with(
            build_ours(before_package.AmpScaler), optimizer
        )
    makers["ours-step[no stats]"] = lambda optimizer: without_statistics(ours_step(optimizer))
    for name, options in OPTIONS.items():
        makers[f"ours-step[{name}]"] = lambda optimizer, options=options: ours_step(
            optimizer, **options
        )
    return makers


# -- the model and its gradients ------------------------------------------------------


def build_parameters(workload):
    paddle.seed(SEED)
    return [paddle.create_parameter([size], "float32") for size in workload.sizes()]


def scaled_weights(params):
    """One weight per parameter, in [-SCALE, SCALE]: the gradient of sum(param * weight)
    is the weight, a finite gradient as backward of a loss scaled by SCALE gives.

    Finite on purpose: Paddle's scaler crashes on its first overflow under NumPy 2
    (``float()`` of a shape-[1] tensor in its log message).
    """
    return [paddle.uniform(param.shape, min=-1.0, max=1.0) * SCALE for param in params]


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


def measure_steps(workload, optimizer_name, params, weights, args, rng) -> dict:
    optimizer = OPTIMIZERS[optimizer_name](params)
    steps = {name: make(optimizer) for name, make in implementations().items()}

    def prepare():
        # What a training loop runs between two steps: the gradient of each
        # sum(param * weight) is its weight, the same scaled gradients every round.
        optimizer.clear_grad()
        paddle.add_n([(param * weight).sum() for param, weight in zip(params, weights)]).backward()
        # Paddle's scaler leaves its verdict on the optimizer; a step without a scaler
        # must not inherit it.
        optimizer._set_auxiliary_var("found_inf", None)

    round_s = warm_up(steps, prepare, rng)
    reads = {name: count_host_reads(step, prepare) for name, step in steps.items()}
    rounds = rounds_within(args.profile.step_budget_s, round_s, args.profile, args.rounds)
    samples = time_interleaved(steps, rounds, prepare, rng)
    impls = {}
    for name in steps:
        # Each round's difference to the step without a scaler: a load that drifts
        # between rounds hits both sides of it alike.
        differences = [took - none for took, none in zip(samples[name], samples["none"])]
        impls[name] = {
            "median_ms": median_ms(samples[name]),
            "iqr_ms": iqr_ms(samples[name]),
            "overhead_ms": median_ms(differences),
            "overhead_iqr_ms": iqr_ms(differences),
            "host_reads": reads[name],
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
    before = BEFORE_RATIO_PAIRS if before_package is not None else {}
    return {**RATIO_PAIRS, **FLOOR_RATIO_PAIRS, **before}


def overhead_ratio(impls, ours, native):
    native_overhead = impls[native]["overhead_ms"]
    if native_overhead <= 0:
        return None  # lost in the noise: no ratio to speak of
    return impls[ours]["overhead_ms"] / native_overhead


def headroom_cost(run):
    """ours-step[headroom]'s whole step over ours-step's (their medians)."""
    impls = run["impls"]
    return impls["ours-step[headroom]"]["median_ms"] / impls["ours-step"]["median_ms"]


def measure_workload(workload, args, rng):
    params = build_parameters(workload)
    weights = scaled_weights(params)
    runs = []
    for optimizer_name in args.optimizers:
        runs.append(measure_steps(workload, optimizer_name, params, weights, args, rng))
        print_run(runs[-1])
    return runs


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


def print_header(info, command, args):
    print(
        "Loss-scaler overhead per training step (Paddle's kernels on CPU, float32 grads; "
        "a forward and backward before each step, untimed)"
    )
    print(f"command:  {command}")
    loads = info["load_average"]
    print(
        f"machine:  {info['cpu_count']} CPUs ({info['usable_cpus']} usable), "
        f"{info['cpu_model']}, {info['platform']}, load average "
        + ("unknown" if loads is None else " ".join(f"{load:.2f}" for load in loads))
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
    if args.before:
        print(
            f"before:   {args.before} (version {before_package.__version__}), on Paddle's "
            "kernels (PADDLE_AMP_SCALER_FUSED=0); reads its own code makes count as 'other'"
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
        f"{'impl':<{IMPL_WIDTH}}{'median ms':>11}{'iqr ms':>9}{'overhead ms':>13}"
        f"   host reads scaler/paddle/other"
    )
    for name, impl in run["impls"].items():
        overhead = "-" if name == "none" else f"{impl['overhead_ms']:.3f}"
        reads = "/".join(str(impl["host_reads"][origin]) for origin in READ_ORIGINS)
        print(
            f"{name:<{IMPL_WIDTH}}{impl['median_ms']:>11.3f}{impl['iqr_ms']:>9.3f}"
            f"{overhead:>13}   {reads}"
        )
    for kind, (ours, native) in ratio_pairs().items():
        print(f"overhead {ours} / {native}: {ratio_verdict(run['ratios'][kind], kind)}")


def ratio_verdict(ratio, kind) -> str:
    if ratio is None:
        return "n/a (the reference's overhead lost in the noise)"
    target = dict.fromkeys(RATIO_PAIRS, OVERHEAD_RATIO_TARGET)
    target["step over the floor"] = BARE_KERNELS_TARGET
    if kind not in target:
        return f"{ratio:.2f}"  # for comparison, no target
    verdict = "PASS" if ratio <= target[kind] else "FAIL"
    return f"{ratio:.2f}  {verdict} (target <= {target[kind]})"


def print_summary(runs):
    print("\n== summary")
    for run in runs:
        for kind, (ours, native) in ratio_pairs().items():
            print(
                f"{run['workload']:>10} {run['optimizer']:<6} {ours} / {native} overhead: "
                f"{ratio_verdict(run['ratios'][kind], kind)}"
            )
    for run in runs:
        ratio = headroom_cost(run)
        verdict = "PASS" if ratio <= HEADROOM_COST_TARGET else "FAIL"
        impls = run["impls"]
        print(
            f"{run['workload']:>10} {run['optimizer']:<6} ours-step[headroom] / ours-step "
            f"per-step time: {ratio:.2f}  {verdict} (target <= {HEADROOM_COST_TARGET}); "
            f"overheads {impls['ours-step[headroom]']['overhead_ms']:.3f} and "
            f"{impls['ours-step']['overhead_ms']:.3f} ms"
        )


def import_before(checkout):
    """The package of an earlier checkout, imported beside this one under another name
    (its imports are relative), on Paddle's kernels: up to 0.2.0 the package ran a
    compiled CPU helper unless PADDLE_AMP_SCALER_FUSED=0."""
    global before_package
    source = os.path.join(os.path.abspath(checkout), "paddle_amp_scaler")
    if not os.path.isfile(os.path.join(source, "__init__.py")):
        raise SystemExit(f"--before {checkout}: no paddle_amp_scaler package there")
    copy = os.path.join(tempfile.mkdtemp(prefix="bench-before-"), "paddle_amp_scaler_before")
    shutil.copytree(source, copy)
    sys.path.insert(0, os.path.dirname(copy))
    os.environ["PADDLE_AMP_SCALER_FUSED"] = "0"
    before_package = importlib.import_module("paddle_amp_scaler_before")


def main(argv=None) -> int:
    args = parse_args(argv)
    paddle.set_device("cpu")
    if args.before:
        import_before(args.before)
    command = " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv])
    info = machine_info()
    print_header(info, command, args)
    rng = random.Random(SEED)
    started = time.perf_counter()
    runs = []
    for workload in args.workloads:
        runs.extend(measure_workload(workload, args, rng))
    print_summary(runs)
    elapsed = time.perf_counter() - started
    print(f"\nmeasured in {elapsed:.1f} s")
    results = {
        "command": command,
        "machine": info,
        "quick": args.quick,
        "scale": SCALE,
        "before": args.before,
        "targets": {
            "overhead_ratio_max": OVERHEAD_RATIO_TARGET,
            "headroom_step_ratio_max": HEADROOM_COST_TARGET,
            "floor_ratio_max": BARE_KERNELS_TARGET,
        },
        "runs": runs,
        "elapsed_s": elapsed,
    }
    if args.json:
        with open(args.json, "w") as output:
            json.dump(results, output, indent=2, allow_nan=False)
            output.write("\n")
    if args.figure:
        figures.draw_overheads(results, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
