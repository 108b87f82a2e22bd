#!/usr/bin/env python
"""Loss-scale policies on fp16-emulated training runs: what each loses to underflow, how
often it skips, where the loss ends and what its step costs.

Each workload trains one model per policy, all from the same weights on the same batches,
in lockstep: every iteration runs each policy's forward, backward and step in a fresh
random order, so that a shared machine's noise hits all alike. Every matmul computes as
float16 would on a GPU under O1 (``paddle_amp_scaler.testing.round_linear_layers`` and
``round_through_float16``): its inputs, weight, bias and output rounded through float16,
and so their gradients, which overflow to inf above 65504 and flush to zero at or below
2**-25. An ``UnderflowCensus`` counts the nonzero scaled gradients reaching those
tensors, and those that float16 flushes or holds only as subnormals, in the iterations
whose step was taken. An fp32 run (no rounding, no scaler) gives the loss without fp16.
The workloads are ``policy_workloads.py``'s, the tables, targets and figure
``policy_report.py``'s; this module runs them.

    PYTHONPATH=. python benchmarks/policy_bench.py --quick      # under a minute
    PYTHONPATH=. python benchmarks/policy_bench.py              # about 17 minutes on 2 cores
    PYTHONPATH=. python benchmarks/policy_bench.py --periods 16,64,256   # headroom at each
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import warnings

# Paddle warns about a missing ccache on import; it says nothing about this benchmark.
warnings.filterwarnings("ignore", message="No ccache found")

# The workloads first: they import scikit-learn before Paddle (policy_workloads.py says why).
from policy_workloads import SEED, PROFILES, Profile, Workload, workloads_for  # noqa: E402  # isort: skip

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_amp_scaler  # noqa: E402
from paddle_amp_scaler import GradScaler  # noqa: E402
from paddle_amp_scaler.core.rules import HeadroomRule  # noqa: E402
from paddle_amp_scaler.core.validation import FLOAT16_MAX  # noqa: E402
from paddle_amp_scaler.testing import (  # noqa: E402
    UnderflowCensus,
)

# The policies, each through this package's GradScaler. PyTorch's GradScaler defaults
# (init 2**16, growth_interval 2000, backoff 0.5, growth 2) are Paddle's numbers exactly,
# so its rule is interval's: one run stands for both. DeepSpeed's (initial_scale_power
# 16, loss_scale_window 1000, hysteresis 2) as Paddle's arguments; DeepSpeed's own
# hysteresis counts overflows since the last growth, not in a row, unless
# consecutive_hysteresis is set.
POLICIES = {
    "interval": dict(
        init_loss_scaling=2.0**16,
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=2000,
        decr_every_n_nan_or_inf=1,
    ),
    "headroom": dict(policy="headroom"),
    "deepspeed": dict(
        init_loss_scaling=2.0**16,
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=1000,
        decr_every_n_nan_or_inf=2,
    ),
}
SAME_RUN_AS = {"pytorch": "interval"}
# The biased float32 exponent of 2**-25 and above, where float16 keeps a scaled gradient
# (2**-25 itself aside): float16 holds about 40 binades (2**-24 to 65504), and a gradient
# more than that below its iteration's largest flushes whatever the scale.
FLUSH_EXPONENT = 127 - 25


from policy_report import (  # noqa: E402
    check_targets,
    draw,
    period_policy,
    print_checks,
    print_details,
    print_periods_table,
    print_table,
    within_reach,
)


def policies_for(periods: list[int]) -> tuple[dict, dict]:
    """The runs' settings and the rows that are another's run: ``POLICIES`` and
    ``SAME_RUN_AS``, and the headroom policy at each of ``periods`` (``measure_every``);
    at its default period, headroom's own run is that row."""
    policies, same_run_as = dict(POLICIES), dict(SAME_RUN_AS)
    for period in periods:
        if period == HeadroomRule.measure_every:
            same_run_as[period_policy(period)] = "headroom"
        else:
            policies[period_policy(period)] = dict(policy="headroom", measure_every=period)
    return policies, same_run_as


# -- one training run per policy ---------------------------------------------------------


class Run:
    """One policy's model, optimizer, scaler and census, and what each iteration did."""

    def __init__(self, workload: Workload, policy: str, settings: dict | None):
        self.policy = policy
        self.emulated = settings is not None  # None: fp32, no rounding, no scaler
        self.census = UnderflowCensus(by_label=True, exponents=True) if self.emulated else None
        self.model, self.optimizer = workload.build(self.census)
        self.scaler = GradScaler(**settings) if self.emulated else None
        self.loss, self.scale, self.skipped, self.step_ms = [], [], [], []
        self.nonzero, self.flushed, self.subnormal, self.beyond = [], [], [], []
        # Where each skipped iteration's inf came from: the first rounded tensor whose
        # gradient overflowed in the backward pass (later ones get the inf passed on).
        self.overflow_origins: dict[str, int] = {}

    def iterate(self, workload: Workload, batch) -> None:
        if self.scaler is not None:
            self.scale.append(self.scaler.get_loss_scaling())
        loss = 0.0
        for micro_batch in zip(*(np.array_split(part, workload.accumulation) for part in batch)):
            micro_loss = workload.loss(self.model, micro_batch) / workload.accumulation
            (micro_loss if self.scaler is None else self.scaler.scale(micro_loss)).backward()
            loss += float(micro_loss)
        if self.scaler is None:
            started = time.perf_counter()
            self.optimizer.step()
            self.step_ms.append((time.perf_counter() - started) * 1e3)
        else:
            started = time.perf_counter()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.step_ms.append((time.perf_counter() - started) * 1e3)
            self.record_census(self.scaler.last_step_skipped())
        self.optimizer.clear_grad()
        self.loss.append(loss)

    def record_census(self, skipped: bool) -> None:
        counts = self.census.end_iteration(skipped=skipped)
        self.skipped.append(skipped)
        if skipped:
            origin = next(
                (label for label, c in self.census.last_by_label.items() if c.overflowed),
                "no rounded tensor (inf/nan from elsewhere)",
            )
            self.overflow_origins[origin] = self.overflow_origins.get(origin, 0) + 1
        self.nonzero.append(counts.nonzero)
        self.flushed.append(counts.flushed)
        self.subnormal.append(counts.subnormal)
        self.beyond.append(beyond_any_scale(self.census.last_exponents, self.census.last_amax))

    def summary(self, tail: int) -> dict:
        iterations = len(self.loss)
        result = {
            "policy": self.policy,
            "iterations": iterations,
            "final_loss": float(np.mean(self.loss[-tail:])),
            "step_ms_median": statistics.median(self.step_ms),
            "step_ms_iqr": iqr(self.step_ms),
        }
        if not self.emulated:
            return result
        kept = ~np.array(self.skipped)
        nonzero = int(np.array(self.nonzero)[kept].sum())
        flushed = int(np.array(self.flushed)[kept].sum())
        stats = self.scaler.stats()
        sources = sorted(self.census.kept_by_label.items(), key=lambda item: -item[1].flushed)
        result.update(
            skipped=int(sum(self.skipped)),
            skipped_per_1000=1000.0 * sum(self.skipped) / iterations,
            nonzero=nonzero,
            flushed=flushed,
            flushed_fraction=flushed / nonzero if nonzero else 0.0,
            subnormal_fraction=int(np.array(self.subnormal)[kept].sum()) / nonzero
            if nonzero
            else 0.0,
            beyond_any_scale_fraction=int(np.array(self.beyond)[kept].sum()) / nonzero
            if nonzero
            else 0.0,
            final_scale=stats.scale,
            growths=stats.growths,
            backoffs=stats.backoffs,
            headroom_bits=stats.headroom_bits,
            overflow_origins=self.overflow_origins,
            # The tensors whose gradients lost the most, as fractions of all nonzero.
            flushed_by_label={
                label: counts.flushed / nonzero for label, counts in sources[:4] if counts.flushed
            },
        )
        return result

    def traces(self, window: int) -> dict:
        if not self.emulated:
            return {"loss": self.loss}
        kept = ~np.array(self.skipped)
        nonzero = np.where(kept, self.nonzero, 0)

        def per_window(counts):
            counts = np.where(kept, counts, 0)
            fractions = []
            for start in range(0, len(counts), window):
                total = int(nonzero[start : start + window].sum())
                fractions.append(
                    int(counts[start : start + window].sum()) / total if total else None
                )
            return fractions

        return {
            "loss": self.loss,
            "scale": self.scale,
            "skipped_at": [int(i) for i in np.flatnonzero(self.skipped)],
            "flushed_fraction_per_window": per_window(self.flushed),
            "beyond_any_scale_fraction_per_window": per_window(self.beyond),
        }


def beyond_any_scale(exponents: np.ndarray | None, amax: float) -> int:
    """How many of an iteration's nonzero gradient elements float16 flushes even at the
    best scale for that iteration, the largest power of two that keeps its largest
    element ``amax`` finite: flushed by any scale a policy could have chosen."""
    if exponents is None or not amax > 0:
        return 0
    best = math.floor(math.log2(FLOAT16_MAX / amax))  # the scale 2**best
    # Elements of biased exponent b lie below 2**(b - 126); scaled, at most 2**-25 flushes
    # (the boundary itself, a tie that flushes, is left out).
    return int(exponents[: max(FLUSH_EXPONENT - best, 0)].sum())


def iqr(values) -> float:
    low, high = np.percentile(values, [25, 75])
    return float(high - low)


def run_workload(
    workload: Workload, profile: Profile, log, settings: dict, same_run_as: dict
) -> dict:
    """Train ``workload`` under each of ``settings`` (policy -> GradScaler's arguments) and
    in fp32, in lockstep; a row of ``same_run_as`` repeats another policy's."""
    policies = [*settings, "fp32"]
    runs = {policy: Run(workload, policy, settings.get(policy)) for policy in policies}
    order_rng = np.random.default_rng((SEED, 3))
    started = time.perf_counter()
    for iteration in range(workload.iterations):
        batch = workload.batch(iteration)
        for index in order_rng.permutation(len(policies)):
            runs[policies[index]].iterate(workload, batch)
        done = iteration + 1
        if done % max(workload.iterations // 10, 1) == 0:
            elapsed = time.perf_counter() - started
            scales = " ".join(
                f"{name} 2^{math.log2(run.scale[-1]):.0f}"
                for name, run in runs.items()
                if run.emulated
            )
            log(f"  {workload.name}: {done}/{workload.iterations} in {elapsed:.0f} s; {scales}")
    summaries = {policy: run.summary(profile.tail) for policy, run in runs.items()}
    for alias, same in same_run_as.items():
        summaries[alias] = dict(summaries[same], policy=alias, same_run_as=same)
    return {
        "name": workload.name,
        "description": workload.description,
        "iterations": workload.iterations,
        "outliers": list(workload.outliers),
        "summaries": summaries,
        "traces": {policy: run.traces(profile.window) for policy, run in runs.items()},
        "seconds": time.perf_counter() - started,
    }


# -- running -----------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few hundred iterations each (under a minute)"
    )
    parser.add_argument(
        "--workloads",
        help="comma-separated subset of: digits-mlp, copy-lm, outlier-batches, fine-tuning, "
        "recurrent (default: all)",
    )
    parser.add_argument(
        "--periods",
        type=parse_periods,
        default=[],
        help="comma-separated measure_every values, e.g. 16,64,256: the headroom policy "
        "at each, beside the default runs (default: none)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every result to PATH as JSON")
    parser.add_argument(
        "--figure",
        metavar="PATH",
        help="draw each workload's scale and flushed fraction over time (needs matplotlib)",
    )
    parser.add_argument(
        "--replot",
        metavar="RESULTS",
        help="train nothing: draw --figure again from the results --json wrote",
    )
    args = parser.parse_args(argv)
    if args.replot and not args.figure:
        parser.error("--replot needs --figure")
    return args


def parse_periods(text: str) -> list[int]:
    try:
        periods = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        periods = []
    if not periods or min(periods) < 1:
        raise argparse.ArgumentTypeError(
            f"--periods wants positive integers, e.g. 16,64,256: {text!r}"
        )
    return list(dict.fromkeys(periods))


def machine_info() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "paddle": paddle.__version__,
        "numpy": importlib.metadata.version("numpy"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        with open(args.replot) as saved:
            draw(json.load(saved)["results"], args.figure)
        return 0
    paddle.set_device("cpu")
    profile = PROFILES["quick" if args.quick else "default"]
    workloads = workloads_for(profile)
    if args.workloads:
        chosen = [name.strip() for name in args.workloads.split(",") if name.strip()]
        unknown = sorted(set(chosen) - {w.name for w in workloads})
        if unknown:
            sys.exit(f"--workloads: unknown {unknown}")
        workloads = [w for w in workloads if w.name in chosen]
    command = " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv])
    info = machine_info()
    measure_every = HeadroomRule.measure_every
    settings, same_run_as = policies_for(args.periods)
    print("Loss-scale policies on fp16-emulated training (every matmul rounded through float16)")
    print(f"command:  {command}")
    print(
        f"machine:  {info['cpu_count']} CPUs, {info['platform']}, load average "
        + " ".join(f"{load:.2f}" for load in info["load_average"] or [])
    )
    print(
        f"versions: Python {info['python']}, Paddle {info['paddle']}, NumPy {info['numpy']}, "
        f"paddle_amp_scaler {paddle_amp_scaler.__version__}"
    )
    rule = HeadroomRule()
    print(
        f"measures: headroom measures the amax in the first {rule.calibration_iterations} "
        f"iterations and every {measure_every}th"
    )
    print(
        f"headroom: margin {rule.margin} (calibration_margin {rule.calibration_margin}), "
        f"peak_half_life {rule.peak_half_life}, calibration {rule.calibration_iterations} x "
        f"{rule.calibration_stride}"
    )
    for period in args.periods:
        half_life = HeadroomRule(measure_every=period).peak_half_life
        print(
            f"period:   {period_policy(period)}: measures in the first "
            f"{rule.calibration_iterations} iterations and every {period}th, peak_half_life "
            f"{half_life}"
            + (" (headroom's own run)" if period_policy(period) in same_run_as else "")
        )
    for workload in workloads:
        print(
            f"workload: {workload.name}, {workload.iterations} iterations: {workload.description}"
        )
    print(
        f"counted:  nonzero scaled gradients reaching the rounded tensors, in iterations whose "
        f"step was taken; final loss = mean of the last {profile.tail} iterations' training "
        f"loss; step+update = median time of scaler.step(optimizer) + scaler.update() per "
        f"iteration (AdamW's own step included; fp32: optimizer.step() alone)"
    )

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.perf_counter()
    results = []
    for workload in workloads:
        result = run_workload(workload, profile, log, settings, same_run_as)
        result["window"] = profile.window
        results.append(result)
    elapsed = time.perf_counter() - started
    print()
    print_table(results)
    print()
    if args.periods:
        print_periods_table(results, args.periods)
        print()
    reach = within_reach(results)
    checks = check_targets(results, reach)
    print_checks(checks)
    print_details(results)
    print(f"\nmeasured in {elapsed:.0f} s")
    if args.json:
        with open(args.json, "w") as output:
            json.dump(
                {
                    "command": command,
                    "machine": info,
                    "quick": args.quick,
                    "measure_every": measure_every,
                    "periods": args.periods,
                    "policies": {**settings, **{k: f"= {v}" for k, v in same_run_as.items()}},
                    "results": results,
                    "checks": checks,
                    "within_reach": reach,
                    "elapsed_s": elapsed,
                },
                output,
                allow_nan=False,
            )
            output.write("\n")
    if args.figure:
        draw(results, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
