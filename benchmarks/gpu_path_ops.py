#!/usr/bin/env python
"""Paddle operations and host reads per training step, Paddle's own scaler against
paddle_amp_scaler: what a step costs on a GPU, counted on any machine.

On a GPU every Paddle operation is a kernel launch (or a few) and every host read a
device sync; both can be counted on a CPU, where the scaler runs the same Paddle kernels.
A step is ``scale(loss)`` then ``step`` for each optimizer and ``update()``; backward and
the optimizers' own update kernels are left out (the optimizers' parameter updates are
stubbed, so that float16 and bfloat16 parameters need no CPU kernel), but the optimizers
still read the found-inf flag as they would. The CPU build has no float16 or bfloat16
unscale kernel: for those dtype groups one float32 call stands in, as one launch would
run on a GPU.

    PYTHONPATH=. python benchmarks/gpu_path_ops.py
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="No ccache found")
# The stubbed optimizers hold float16 parameters on purpose; they update nothing.
warnings.filterwarnings("ignore", message="Accumulating with FP16")

# The tests' instruments (tests/counters.py), beside the benchmarks.
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)

import paddle  # noqa: E402
from counters import HostReadCounter, OperationCounter  # noqa: E402
from paddle.amp.auto_cast import amp_global_state  # noqa: E402

import paddle_amp_scaler  # noqa: E402
from paddle_amp_scaler.core import monitoring, rules  # noqa: E402

import bench_scaler  # noqa: E402  (beside this script)

DTYPES = ("float32", "float16", "bfloat16")
OPTIMIZER_KINDS = {
    "adamw": lambda params: paddle.optimizer.AdamW(learning_rate=1e-3, parameters=params),
    "sgd": lambda params: paddle.optimizer.SGD(learning_rate=1e-3, parameters=params),
}
# Iterations before the counted one: the first builds the optimizers' state.
WARMUP_ITERATIONS = 2
# The headroom policy's cost is averaged over a run's first this many iterations.
HEADROOM_ITERATIONS = 100
ONE_HALF = paddle.nn.initializer.Constant(0.5)


@dataclasses.dataclass(frozen=True)
class Case:
    optimizer: str  # a key of OPTIMIZER_KINDS
    dtype_groups: int  # the first this many of DTYPES
    optimizers: int


@dataclasses.dataclass(frozen=True)
class Count:
    operations: int
    reads: int
    names: dict


def cases() -> list[Case]:
    return [
        Case(kind, groups, optimizers)
        for kind in OPTIMIZER_KINDS
        for optimizers in (1, 2)
        for groups in (1, 2, 3)
    ]


@contextlib.contextmanager
def standing_in_for_kernels_a_cpu_lacks():
    """Float16 and bfloat16 unscale (and SGD skip) kernels, which Paddle's CPU build
    lacks: each call runs the float32 kernel once, on a stand-in, as the float16 call
    would run once on a GPU."""
    half = (paddle.float16, paddle.bfloat16)
    placeholder = [paddle.zeros([1], dtype="float32")]
    real_unscale = paddle._C_ops.check_finite_and_unscale_
    real_legacy_unscale = paddle._legacy_C_ops.check_finite_and_unscale
    real_update = paddle._C_ops.update_loss_scaling_

    def unscale(xs, scale):
        if xs[0].dtype in half:
            return xs, real_unscale(placeholder, scale)[1]
        return real_unscale(xs, scale)

    def legacy_unscale(xs, scale, outs, found):
        if xs[0].dtype in half:
            return real_legacy_unscale(placeholder, scale, placeholder, found)
        return real_legacy_unscale(xs, scale, outs, found)

    def update(xs, *args):
        return real_update(placeholder if xs[0].dtype in half else xs, *args)

    paddle._C_ops.check_finite_and_unscale_ = unscale
    paddle._legacy_C_ops.check_finite_and_unscale = legacy_unscale
    paddle._C_ops.update_loss_scaling_ = update
    try:
        yield
    finally:
        paddle._C_ops.check_finite_and_unscale_ = real_unscale
        paddle._legacy_C_ops.check_finite_and_unscale = real_legacy_unscale
        paddle._C_ops.update_loss_scaling_ = real_update


@contextlib.contextmanager
def float16_autocast_state():
    # Paddle's scale() multiplies only under float16 autocast; ours under any but bfloat16.
    state = amp_global_state()
    saved, state.amp_dtype = state.amp_dtype, "float16"
    try:
        yield
    finally:
        state.amp_dtype = saved


def build(kind: str, dtypes: tuple[str, ...], optimizers: int):
    """``optimizers`` optimizers of ``kind``, each over one [8] parameter per dtype; the
    parameters of all of them, and the optimizers."""
    paddle.seed(0)
    params_per_optimizer = [
        [paddle.create_parameter([8], dtype, default_initializer=ONE_HALF) for dtype in dtypes]
        for _ in range(optimizers)
    ]
    built = [OPTIMIZER_KINDS[kind](params) for params in params_per_optimizer]
    for optimizer in built:
        # The optimizer's own update kernels are not the scaler's, and the CPU build has
        # none for float16: the step runs (and reads the flag) but updates nothing.
        optimizer._append_optimize_op = lambda block, param_and_grad: None
    return [param for params in params_per_optimizer for param in params], built


def run(scaler, params, optimizers, iterations: int, counted) -> Count:
    """Train ``iterations`` iterations; count the operations and host reads of the
    scaler's calls in those for which ``counted(iteration)`` (1-based) holds."""
    operations, reads = OperationCounter(), HostReadCounter()
    for iteration in range(1, iterations + 1):
        loss = paddle.add_n([(param.astype("float32") * 1024.0).sum() for param in params])
        with counting(counted(iteration), operations, reads):
            scaled = scaler.scale(loss)
        scaled.backward()
        with counting(counted(iteration), operations, reads):
            for optimizer in optimizers:
                scaler.step(optimizer)
            scaler.update()
        for optimizer in optimizers:
            optimizer.clear_grad()
    return Count(operations.total(), reads.total(), dict(operations.operations))


@contextlib.contextmanager
def counting(measured, operations, reads):
    if not measured:
        yield
        return
    with operations.counting(), reads.counting():
        yield


def ours(**options):
    """Ours, with the benchmark's settings but where ``options`` say else. The stuck
    policy, on by default, is left off: its one read per 100 iterations would fold the
    statistics early and land in the counts of the hundredth (tests/test_statistics.py
    counts it)."""
    settings = {**bench_scaler.SCALER_ARGS, "stuck_after": None, **options}
    return paddle_amp_scaler.GradScaler(**settings)


def native():
    return bench_scaler.build_native(paddle.amp.GradScaler)


def count_case(case: Case) -> dict:
    """Ours' and Paddle's counts of one steady-state step (the rule does not act in it)."""
    last = WARMUP_ITERATIONS + 1
    counts = {}
    with standing_in_for_kernels_a_cpu_lacks(), float16_autocast_state():
        for who, scaler in (("ours", ours()), ("native", native())):
            params, optimizers = build(case.optimizer, DTYPES[: case.dtype_groups], case.optimizers)
            counts[who] = run(scaler, params, optimizers, last, lambda i: i == last)
    return counts


def count_growth(kind: str) -> dict:
    """Ours' and Paddle's counts of the iteration in which the rule grows the scale (one
    optimizer, float32 gradients, a growth every third finite iteration)."""
    counts = {}
    with float16_autocast_state():
        for who, scaler in (
            ("ours", ours(incr_every_n_steps=3)),
            ("native", bench_scaler.build_native(paddle.amp.GradScaler, incr_every_n_steps=3)),
        ):
            params, optimizers = build(kind, ("float32",), 1)
            counts[who] = run(scaler, params, optimizers, 6, lambda i: i == 6)
    return counts


def count_fold(kind: str) -> Count:
    """Ours' iteration that adds up the statistics of the last ``monitoring._FOLD_EVERY``
    iterations (one optimizer, float32 gradients): its step, and the fold."""
    every = monitoring._FOLD_EVERY
    params, optimizers = build(kind, ("float32",), 1)
    return run(ours(), params, optimizers, every, lambda i: i == every)


@dataclasses.dataclass(frozen=True)
class PolicyCase:
    tensors: int  # float32 gradient tensors per optimizer
    optimizers: int


def policy_cases() -> list[PolicyCase]:
    return [PolicyCase(tensors, optimizers) for optimizers in (1, 2) for tensors in (1, 8, 64)]


def measured_iterations(iterations: int = HEADROOM_ITERATIONS) -> list[int]:
    """The iterations, of a run's first ``iterations``, in which the headroom policy
    measures the amax and runs its rule on the device."""
    rule = rules.HeadroomRule()
    return [iteration for iteration in range(1, iterations + 1) if rule.measures(iteration)]


def count_run(case: PolicyCase, policy: str, iterations: int = HEADROOM_ITERATIONS) -> Count:
    """Operations and host reads of ours over the first ``iterations`` iterations of a run
    (AdamW, float32 gradients), calibration included, with ``policy``."""
    params, optimizers = build("adamw", ("float32",) * case.tensors, case.optimizers)
    # One step without a scaler first: AdamW makes its accumulators in its first step,
    # which is not the scaler's cost.
    paddle.add_n([param.sum() for param in params]).backward()
    for optimizer in optimizers:
        optimizer.step()
        optimizer.clear_grad()
    return run(ours(policy=policy), params, optimizers, iterations, lambda i: True)


def headroom_extra(case: PolicyCase, iterations: int = HEADROOM_ITERATIONS):
    """The headroom policy's operations beyond the interval rule's over a run's first
    ``iterations``; and both runs' counts."""
    interval = count_run(case, "interval", iterations)
    policy = count_run(case, "headroom", iterations)
    return policy.operations - interval.operations, interval, policy


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    paddle.set_device("cpu")
    print(f"Paddle {paddle.__version__}: operations / host reads per step")
    print(
        "| optimizer | dtype groups | optimizers | Paddle's: operations | ours | "
        "Paddle's: host reads | ours |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in cases():
        counts = count_case(case)
        print(
            f"| {case.optimizer} | {case.dtype_groups} | {case.optimizers} | "
            f"{counts['native'].operations} | {counts['ours'].operations} | "
            f"{counts['native'].reads} | {counts['ours'].reads} |"
        )
    print("\nThe iteration in which the rule grows the scale (one optimizer, float32):")
    for kind in OPTIMIZER_KINDS:
        counts = count_growth(kind)
        print(
            f"  {kind}: Paddle's {counts['native'].operations} operations, ours "
            f"{counts['ours'].operations}: {counts['ours'].names}"
        )
    print(f"\nThe iteration that adds up {monitoring._FOLD_EVERY} iterations' statistics:")
    for kind in OPTIMIZER_KINDS:
        fold = count_fold(kind)
        print(f"  {kind}: {fold.operations} operations, {fold.reads} reads: {fold.names}")
    measured = measured_iterations()
    print(
        f"\nThe headroom policy against the interval rule, ours, AdamW, float32 gradients, "
        f"the first {HEADROOM_ITERATIONS} iterations of a run (measured: {measured})"
    )
    print(
        "| gradient tensors | optimizers | interval: operations | headroom | extra | "
        "extra per measured iteration | host reads, each |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in policy_cases():
        extra, interval, policy = headroom_extra(case)
        print(
            f"| {case.tensors * case.optimizers} | {case.optimizers} | {interval.operations} | "
            f"{policy.operations} | {extra} | {extra / len(measured):g} | "
            f"{interval.reads}, {policy.reads} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
