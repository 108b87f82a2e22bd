#!/usr/bin/env python
"""Where ours' overhead over the floor goes: the step timed as it is and with pieces of it
cut down to what the floor does, in the same interleaved rounds as ``bench_scaler.py``.

Each variant is a copy of the package with one thing replaced (a cut variant drops a
promise: wrappers, dist gradients, master gradients, ranks, records or statistics), so
none of it is a candidate for the package; it says how much of the excess each piece
carries. Prints each variant's overhead over ``bare-kernels``, one line per workload and
repeat.

    PYTHONPATH=. python benchmarks/floor_ablation.py --workloads 8x1M,64x1M --rounds 1000
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import shutil
import sys
import tempfile

import paddle

import paddle_amp_scaler

import bench_scaler as bench  # benchmarks/bench_scaler.py, beside this script

C_ops = paddle._C_ops
get_grads_lists = paddle.base.core.eager.get_grads_lists


def minimal_step(scaler, optimizer, verdict_type):
    # The floor's few lines, with the record the update reads.
    found = scaler._temp_found_inf_value_false
    for group in get_grads_lists(optimizer._parameter_list):
        if group:
            _, found = C_ops.check_finite_and_unscale_(group, scaler._scale)
    optimizer._set_auxiliary_var("found_inf", found)
    optimizer.step()
    left = optimizer._get_auxiliary_var("found_inf")
    optimizer._set_auxiliary_var("found_inf", None)
    step = scaler._optimizer_states[id(optimizer)]
    step.verdict = verdict_type(found, left)
    step.stage = paddle.amp.grad_scaler.OptimizerState.STEPPED


def minimal_step_of(pkg):
    verdict_type = pkg.core.step.Verdict
    return lambda scaler, optimizer: minimal_step(scaler, optimizer, verdict_type)


def minimal_update(scaler):
    # The rule's counters on the host from the one optimizer's verdict, nothing else.
    step = scaler._optimizer_states.popitem()[1]
    loss_scale = scaler._loss_scale
    counters = loss_scale.rule.count(*loss_scale.counters(), step.verdict.on_host)[:2]
    loss_scale.set_counters(*counters)


def one_launch_unscale(groups, scale, all_finite):
    for group in groups.values():
        _, all_finite = C_ops.check_finite_and_unscale_(group, scale)
    return all_finite


def unchecked_grouping(params):
    names = ("float16", "bfloat16", "float32")
    return {name: group for name, group in zip(names, get_grads_lists(params)) if group}, None


def cut(owner, name, replacement):
    # A piece renamed in the package must stop the run, not leave a variant uncut.
    if not hasattr(owner, name):
        raise AttributeError(f"{owner.__name__} has no {name} to cut: update floor_ablation.py")
    setattr(owner, name, replacement)


# Name -> what it does to the imported copy of the package.
VARIANTS = {
    "as is": lambda pkg: None,
    "no wrapper search": lambda pkg: cut(
        pkg.core.optimizers, "parameters_of", lambda optimizer: optimizer._parameter_list
    ),
    "no per-parameter check": lambda pkg: cut(
        pkg.core.optimizers, "grads_by_dtype", unchecked_grouping
    ),
    "no rank check": lambda pkg: cut(
        pkg.core.distributed.FoundInfSync, "agree", lambda self, flag, amax, mesh: (flag, amax)
    ),
    "one-launch unscale": lambda pkg: cut(
        pkg.core.kernels, "unscale_and_check_", one_launch_unscale
    ),
    "minimal update": lambda pkg: cut(pkg.GradScaler, "update", minimal_update),
    "minimal step": lambda pkg: cut(pkg.GradScaler, "step", minimal_step_of(pkg)),
    "minimal both": lambda pkg: (
        cut(pkg.GradScaler, "step", minimal_step_of(pkg)),
        cut(pkg.GradScaler, "update", minimal_update),
    ),
}


def variant_packages() -> dict:
    """Name -> a copy of this package, imported under its own name, with the variant's cut."""
    source = os.path.dirname(paddle_amp_scaler.__file__)
    root = tempfile.mkdtemp(prefix="floor-ablation-")
    sys.path.insert(0, root)
    packages = {}
    for index, (name, make_variant) in enumerate(VARIANTS.items()):
        shutil.copytree(source, os.path.join(root, f"ablation_{index}"))
        packages[name] = importlib.import_module(f"ablation_{index}")
        make_variant(packages[name])
    return packages


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="8x1M,64x1M")
    parser.add_argument("--optimizer", default="adamw", choices=sorted(bench.OPTIMIZERS))
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    paddle.set_device("cpu")
    packages = variant_packages()
    makers = {"none": lambda optimizer: optimizer.step, "bare-kernels": bench.bare_kernels}
    for name, package in packages.items():
        makers[name] = lambda optimizer, package=package: bench.step_and_update(
            bench.build_ours(package.GradScaler), optimizer
        )
    # The harness times what implementations() makes; the ratios are this script's own.
    bench.implementations = lambda: makers
    bench.ratio_pairs = dict
    rng = random.Random(bench.SEED)
    print(f"{args.optimizer}, {args.rounds} rounds; each variant's overhead / bare-kernels'")
    widths = {name: max(len(name), 5) for name in packages}
    print("workload  " + "  ".join(f"{name:>{widths[name]}}" for name in packages))
    for _ in range(args.repeats):
        for text in args.workloads.split(","):
            workload = bench.parse_workload(text)
            options = bench.parse_args(["--workloads", text, "--rounds", str(args.rounds)])
            params = bench.build_parameters(workload)
            run = bench.measure_steps(
                workload, args.optimizer, params, bench.scaled_weights(params), options, rng
            )
            floor = run["impls"]["bare-kernels"]["overhead_ms"]
            cells = (
                f"{run['impls'][name]['overhead_ms'] / floor:>{widths[name]}.3f}"
                for name in packages
            )
            print(f"{text:8s}  " + "  ".join(cells) + f"   (floor {floor * 1e3:.0f} µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
