#!/usr/bin/env python
"""Memory over a long run: the resident memory (RSS) of a training process under every
policy, option and face of the scaler, sampled at fixed iterations, so that anything the
scaler keeps from one iteration to the next shows as growth.

Each variant trains a 32x32 Linear with AdamW in a fresh Python process of its own,
reads ``stats()`` every 100 iterations and has an inf written into a gradient every
1000th iteration (a skip and a back-off each time; the interval rule grows after 500
finite iterations). RSS is read from /proc/self/statm after a garbage collection at
every twentieth of the run. The table gives RSS at a quarter, half and all of the run,
and the growth per 5,000 iterations after the first quarter (the warm-up: the
allocator's pools, Paddle's caches, AdamW's state). Device memory is sampled too where
Paddle has a CUDA device, and said to be skipped elsewhere. Nothing is asserted here;
``tests/test_memory.py`` holds the growth to a bound.

    PYTHONPATH=. python benchmarks/soak.py                 # 20,000 iterations each
    PYTHONPATH=. python benchmarks/soak.py --iterations 4000 --variants headroom
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings

# Paddle warns about a missing ccache on import; it says nothing about this benchmark.
warnings.filterwarnings("ignore", message="No ccache found")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_amp_scaler  # noqa: E402
from paddle_amp_scaler import GradScaler, LossScaleOptimizer  # noqa: E402
from paddle_amp_scaler.compat import mindspore as ms  # noqa: E402
from paddle_amp_scaler.compat import torch as pt  # noqa: E402

SEED = 2027
WIDTH = 32
BATCH = 16
INIT_SCALE = 2.0**16
GROWTH_EVERY = 500
INJECT_EVERY = 1000  # 8000 and 16000 among them: measured iterations of the headroom policy
STATS_EVERY = 100
SAMPLES = 20  # RSS samples over a run, at every twentieth
PER = 5000  # growth is reported per this many iterations
MIB = 2.0**20

VARIANTS = {
    "interval": "GradScaler(), step + update: the interval rule (default)",
    "headroom": 'GradScaler(policy="headroom")',
    "report": "GradScaler(report_overflows=True)",
    "stuck": "GradScaler(stuck_after=100)",
    "fixed": "GradScaler(use_dynamic_loss_scaling=False)",
    "torch": "compat.torch.GradScaler(growth_interval=500)",
    "keras": "LossScaleOptimizer(AdamW, dynamic_growth_steps=500).minimize(loss)",
    "mindspore": "compat.mindspore.DynamicLossScaler(2**16, 2, 500): paddle.grad, unscale, "
    "all_finite, adjust",
}


def resident_bytes() -> int:
    """The process's resident memory now: /proc/self/statm, else the peak from
    getrusage (which can only grow, so still shows a leak)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        # Linux reports KiB, macOS bytes.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def cuda_device() -> bool:
    return paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


class Run:
    """One variant's training loop: ``iteration(index, inject)`` trains one iteration,
    with an inf in the weight's gradient where ``inject``; ``scaler`` is the scaler
    whose ``stats()`` the run reads (a face's inner one)."""

    def __init__(self, variant: str) -> None:
        paddle.seed(SEED)
        self.model = paddle.nn.Linear(WIDTH, WIDTH)
        self.params = list(self.model.parameters())
        self.optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=self.params)
        rng = np.random.default_rng(SEED)
        self.batches = [
            (
                paddle.to_tensor(rng.standard_normal((BATCH, WIDTH)).astype("float32")),
                paddle.to_tensor(rng.standard_normal((BATCH, WIDTH)).astype("float32")),
            )
            for _ in range(8)
        ]
        self.injecting = False
        self.model.weight.register_hook(self._hook)
        self.iteration = getattr(self, f"_{variant}")()

    def _hook(self, grad: paddle.Tensor) -> paddle.Tensor | None:
        return paddle.full_like(grad, math.inf) if self.injecting else None

    def loss(self, index: int) -> paddle.Tensor:
        x, y = self.batches[index % len(self.batches)]
        return paddle.nn.functional.mse_loss(self.model(x), y)

    def _step_update(self, scaler):
        self.scaler = scaler

        def iteration(index: int, inject: bool) -> None:
            self.injecting = inject
            scaler.scale(self.loss(index)).backward()
            self.injecting = False
            scaler.step(self.optimizer)
            scaler.update()
            self.optimizer.clear_grad()

        return iteration

    def _core(self, **options):
        return self._step_update(
            GradScaler(init_loss_scaling=INIT_SCALE, incr_every_n_steps=GROWTH_EVERY, **options)
        )

    def _interval(self):
        return self._core()

    def _headroom(self):
        return self._core(policy="headroom")

    def _report(self):
        return self._core(report_overflows=True)

    def _stuck(self):
        return self._core(stuck_after=100)

    def _fixed(self):
        return self._step_update(
            GradScaler(init_loss_scaling=INIT_SCALE, use_dynamic_loss_scaling=False)
        )

    def _torch(self):
        return self._step_update(pt.GradScaler(init_scale=INIT_SCALE, growth_interval=GROWTH_EVERY))

    def _keras(self):
        wrapped = LossScaleOptimizer(
            self.optimizer, initial_scale=INIT_SCALE, dynamic_growth_steps=GROWTH_EVERY
        )
        self.scaler = wrapped.scaler

        def iteration(index: int, inject: bool) -> None:
            # minimize runs the backward itself: the hook is armed around it.
            self.injecting = inject
            wrapped.minimize(self.loss(index))
            self.injecting = False
            wrapped.clear_grad()

        return iteration

    def _mindspore(self):
        loss_scaler = ms.DynamicLossScaler(
            scale_value=INIT_SCALE, scale_factor=2, scale_window=GROWTH_EVERY
        )
        self.scaler = loss_scaler._scaler  # the face's inner scaler, for stats()

        def iteration(index: int, inject: bool) -> None:
            grads = paddle.grad(loss_scaler.scale(self.loss(index)), self.params)
            if inject:
                # paddle.grad runs no hooks of a leaf: the inf goes into what it returned.
                grads = [paddle.full_like(grads[0], math.inf), *grads[1:]]
            grads = loss_scaler.unscale(grads)
            finite = ms.all_finite(grads)
            if finite:  # the caller's read, as in MindSpore's documented loop
                self.optimizer.apply_gradients(list(zip(self.params, grads)))
            loss_scaler.adjust(finite)

        return iteration


def sample_points(iterations: int) -> list[int]:
    return sorted({round(iterations * k / SAMPLES) for k in range(1, SAMPLES + 1)})


def soak(variant: str, iterations: int) -> dict:
    """Train ``variant`` for ``iterations`` iterations in this process; RSS (and device
    memory, where there is a CUDA device) at ``sample_points``, and the final stats."""
    run = Run(variant)
    points = set(sample_points(iterations))
    on_device = cuda_device()
    gc.collect()
    rss = {0: resident_bytes()}
    device: dict[int, int] = {}
    started = time.perf_counter()
    for index in range(1, iterations + 1):
        run.iteration(index, index % INJECT_EVERY == 0)
        if index % STATS_EVERY == 0:
            run.scaler.stats()
        if index in points:
            gc.collect()
            rss[index] = resident_bytes()
            if on_device:
                device[index] = paddle.device.cuda.memory_allocated()
    elapsed = time.perf_counter() - started
    stats = run.scaler.stats()
    result = {
        "variant": variant,
        "iterations": iterations,
        "rss": rss,
        "elapsed_s": elapsed,
        "stats": {
            "skipped": stats.skipped,
            "growths": stats.growths,
            "backoffs": stats.backoffs,
            "scale": stats.scale,
        },
    }
    if device:
        result["device"] = device
        result["device_peak"] = paddle.device.cuda.max_memory_allocated()
    return result


def in_subprocess(variant: str, iterations: int) -> dict:
    """``soak`` in a fresh Python process, so that no variant's memory is another's."""
    completed = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            variant,
            "--iterations",
            str(iterations),
        ],
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-4000:])
        raise RuntimeError(f"{variant}: the soak's process failed ({completed.returncode})")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    # JSON keys are strings.
    for key in ("rss", "device"):
        if key in result:
            result[key] = {int(point): value for point, value in result[key].items()}
    return result


def growth(result: dict, key: str = "rss") -> dict:
    """The memory at a quarter, half and all of the run, and the growth per ``PER``
    iterations from the quarter on."""
    samples, total = result[key], result["iterations"]
    quarter, half = (
        min(samples, key=lambda point: abs(point - at)) for at in (total / 4, total / 2)
    )
    per = (samples[total] - samples[quarter]) / (total - quarter) * PER
    return {
        "at": (quarter, half, total),
        "values": (samples[quarter], samples[half], samples[total]),
        "per": per,
    }


def table(results: list[dict]) -> list[str]:
    """The Markdown table of RSS per variant; and of device memory, where sampled."""
    quarter, half, total = growth(results[0])["at"]
    memory_columns = f"at {quarter:,} (MiB) | at {half:,} | at {total:,} | growth per {PER:,}"
    lines = [
        f"| variant | RSS {memory_columns} after {quarter:,} (MiB) | skipped | growths | "
        "back-offs | final scale | time (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        grown, stats = growth(result), result["stats"]
        values = " | ".join(f"{value / MIB:.1f}" for value in grown["values"])
        lines.append(
            f"| {result['variant']} | {values} | {grown['per'] / MIB:+.2f} | "
            f"{stats['skipped']} | {stats['growths']} | {stats['backoffs']} | "
            f"{stats['scale']:g} | {result['elapsed_s']:.0f} |"
        )
    if not all("device" in result for result in results):
        return lines
    lines += [
        "",
        f"| variant | device memory {memory_columns} | peak (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        grown = growth(result, "device")
        values = " | ".join(f"{value / MIB:.2f}" for value in grown["values"])
        lines.append(
            f"| {result['variant']} | {values} | {grown['per'] / MIB:+.3f} | "
            f"{result['device_peak'] / MIB:.2f} |"
        )
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--iterations",
        type=int,
        default=20_000,
        help="iterations per variant (default 20000; at least 400)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, from: " + ", ".join(VARIANTS) + " (default: all)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every sample to PATH")
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="also append the report to PATH (benchmarks/results-soak.txt holds the recorded ones)",
    )
    parser.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.iterations < 400:
        parser.error("--iterations must be at least 400")
    args.variants = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(soak(args.child, args.iterations)))
        return 0
    command = " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv])
    report = [
        f"Memory over a long run: {args.iterations:,} iterations per variant, each variant "
        "in a fresh process",
        f"command:  {command}",
        f"machine:  {os.cpu_count()} CPUs, {platform.platform()}, load average "
        + " ".join(f"{load:.2f}" for load in os.getloadavg()),
        f"versions: Python {platform.python_version()}, Paddle {paddle.__version__}, "
        f"paddle_amp_scaler {paddle_amp_scaler.__version__} "
        f"({os.path.dirname(os.path.abspath(paddle_amp_scaler.__file__))})",
        f"training: Linear {WIDTH}x{WIDTH}, AdamW 1e-3, batch {BATCH}; stats() every "
        f"{STATS_EVERY}; an inf in the weight's gradient every {INJECT_EVERY}th iteration; "
        f"init scale 2^16, growth every {GROWTH_EVERY} finite iterations (fixed: none)",
    ]
    report.append(
        "device:   CUDA memory sampled beside RSS"
        if cuda_device()
        else "device:   not measured (Paddle built without CUDA, or no GPU): RSS only"
    )
    report += [f"variant:  {name}: {VARIANTS[name]}" for name in args.variants]
    print("\n".join(report), flush=True)
    results = []
    for variant in args.variants:
        print(f"  {variant} ...", file=sys.stderr, flush=True)
        results.append(in_subprocess(variant, args.iterations))
    lines = ["", *table(results)]
    print("\n".join(lines))
    if args.output:
        with open(args.output, "a") as output:
            output.write("\n".join([*report, *lines]) + "\n\n")
    if args.json:
        with open(args.json, "w") as output:
            json.dump({"command": command, "results": results}, output)
            output.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
