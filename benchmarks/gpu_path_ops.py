#!/usr/bin/env python
"""Paddle operations and host reads per training step on the path a GPU takes: Paddle's
own scaler against paddle_amp_scaler.

No GPU is needed: on a GPU every Paddle operation is a kernel launch (or a few) and every
host read a device sync, and both can be counted on a CPU. Ours runs on Paddle's kernels
(``kernels.using_unscale_path("paddle")``), as it does on a GPU. A step is ``scale(loss)``
then ``step`` for each optimizer and ``update()``; backward and the optimizers' own
update kernels are left out (the optimizers' parameter updates are stubbed, so that
float16 and bfloat16 parameters need no CPU kernel), but the optimizers still read the
found-inf flag as they would. The CPU build has no float16 or bfloat16 unscale kernel:
for those dtype groups one float32 call stands in, as one launch would run on a GPU.

    PYTHONPATH=. python benchmarks/gpu_path_ops.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import warnings

warnings.filterwarnings("ignore", message="No ccache found")
# The stubbed optimizers hold float16 parameters on purpose; they update nothing.
warnings.filterwarnings("ignore", message="Accumulating with FP16")

import paddle  # noqa: E402
from paddle.amp.auto_cast import amp_global_state  # noqa: E402

import paddle_amp_scaler  # noqa: E402
from paddle_amp_scaler import kernels  # noqa: E402
from paddle_amp_scaler.testing import HostReadCounter, OperationCounter  # noqa: E402

import bench_scaler  # noqa: E402  (beside this script)

DTYPES = ("float32", "float16", "bfloat16")
OPTIMIZER_KINDS = {
    "adamw": lambda params: paddle.optimizer.AdamW(learning_rate=1e-3, parameters=params),
    "sgd": lambda params: paddle.optimizer.SGD(learning_rate=1e-3, parameters=params),
}
WARMUP_ITERATIONS = 2
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
    stand_in = [paddle.zeros([1], dtype="float32")]
    real_unscale = paddle._C_ops.check_finite_and_unscale_
    real_legacy_unscale = paddle._legacy_C_ops.check_finite_and_unscale
    real_update = paddle._C_ops.update_loss_scaling_

    def unscale(xs, scale):
        if xs[0].dtype in half:
            return xs, real_unscale(stand_in, scale)[1]
        return real_unscale(xs, scale)

    def legacy_unscale(xs, scale, outs, found):
        if xs[0].dtype in half:
            return real_legacy_unscale(stand_in, scale, stand_in, found)
        return real_legacy_unscale(xs, scale, outs, found)

    def update(xs, *args):
        return real_update(stand_in if xs[0].dtype in half else xs, *args)

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


def build(case: Case):
    groups = DTYPES[: case.dtype_groups]
    paddle.seed(0)
    params_per_optimizer = [
        [paddle.create_parameter([8], dtype, default_initializer=ONE_HALF) for dtype in groups]
        for _ in range(case.optimizers)
    ]
    optimizers = [OPTIMIZER_KINDS[case.optimizer](params) for params in params_per_optimizer]
    for optimizer in optimizers:
        # The optimizer's own update kernels are not the scaler's, and the CPU build has
        # none for float16: the step runs (and reads the flag) but updates nothing.
        optimizer._append_optimize_op = lambda block, param_and_grad: None
    return [param for params in params_per_optimizer for param in params], optimizers


def count_step(scaler, case: Case) -> Count:
    """Operations and host reads of one steady-state step of ``scaler`` in ``case``."""
    params, optimizers = build(case)
    operations, reads = OperationCounter(), HostReadCounter()
    for iteration in range(WARMUP_ITERATIONS + 1):
        loss = paddle.add_n([(param.astype("float32") * 1024.0).sum() for param in params])
        measured = iteration == WARMUP_ITERATIONS
        with counting(measured, operations, reads):
            scaled = scaler.scale(loss)
        scaled.backward()
        with counting(measured, operations, reads):
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


def ours():
    return paddle_amp_scaler.GradScaler(**bench_scaler.SCALER_ARGS)


def native():
    return bench_scaler.build_native(paddle.amp.GradScaler)


def count_case(case: Case) -> dict:
    with (
        standing_in_for_kernels_a_cpu_lacks(),
        float16_autocast_state(),
        kernels.using_unscale_path(kernels.PADDLE_PATH),
    ):
        return {"ours": count_step(ours(), case), "native": count_step(native(), case)}


@dataclasses.dataclass(frozen=True)
class PolicyCase:
    tensors: int  # float32 gradient tensors per optimizer
    optimizers: int


def policy_cases() -> list[PolicyCase]:
    return [PolicyCase(tensors, optimizers) for optimizers in (1, 2) for tensors in (1, 8, 64)]


def count_run(case: PolicyCase, policy: str, iterations: int = 100) -> Count:
    """Operations and host reads of ours over the first ``iterations`` iterations of a run
    (AdamW, float32 gradients), calibration included, with ``policy``."""
    paddle.seed(0)
    params = [
        [
            paddle.create_parameter([8], "float32", default_initializer=ONE_HALF)
            for _ in range(case.tensors)
        ]
        for _ in range(case.optimizers)
    ]
    optimizers = [OPTIMIZER_KINDS["adamw"](group) for group in params]
    every = [param for group in params for param in group]
    operations, reads = OperationCounter(), HostReadCounter()
    with kernels.using_unscale_path(kernels.PADDLE_PATH):
        scaler = paddle_amp_scaler.GradScaler(**bench_scaler.SCALER_ARGS, policy=policy)
    for _ in range(iterations):
        loss = paddle.add_n([(param * 1024.0).sum() for param in every])
        with operations.counting(), reads.counting():
            scaled = scaler.scale(loss)
        scaled.backward()
        with operations.counting(), reads.counting():
            for optimizer in optimizers:
                scaler.step(optimizer)
            scaler.update()
        for optimizer in optimizers:
            optimizer.clear_grad()
    return Count(operations.total(), reads.total(), dict(operations.operations))


def headroom_extra(case: PolicyCase, iterations: int = 100) -> tuple[float, Count, Count]:
    """The headroom policy's operations per iteration beyond the interval rule's, averaged
    over a run's first ``iterations``; and both runs' counts."""
    interval = count_run(case, "interval", iterations)
    headroom = count_run(case, "headroom", iterations)
    return (headroom.operations - interval.operations) / iterations, interval, headroom


def count_fold() -> Count:
    """What counting the statistics costs ours off the compiled path: one fold of the
    iterations it kept, here after each of 128 iterations had run."""
    case = Case("adamw", 1, 1)
    with kernels.using_unscale_path(kernels.PADDLE_PATH):
        params, optimizers = build(case)
        scaler = ours()
        for _ in range(127):
            scaler.scale(paddle.add_n([(param * 1024.0).sum() for param in params])).backward()
            scaler.step(optimizers[0])
            scaler.update()
            optimizers[0].clear_grad()
        operations, reads = OperationCounter(), HostReadCounter()
        scaler.scale(paddle.add_n([(param * 1024.0).sum() for param in params])).backward()
        with operations.counting(), reads.counting():
            scaler.step(optimizers[0])
            scaler.update()  # the 128th iteration: its count folds all of them
    return Count(operations.total(), reads.total(), dict(operations.operations))


def main() -> int:
    paddle.set_device("cpu")
    print(f"Paddle {paddle.__version__}: operations / host reads per step, path a GPU takes")
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
    fold = count_fold()
    print(
        f"\nours, the iteration that adds up 128 iterations' statistics: {fold.operations} "
        f"operations, {fold.reads} reads: {fold.names}"
    )
    print(
        "\nThe headroom policy against the interval rule, ours, AdamW, float32 gradients, "
        "the first 100 iterations of a run (calibration included)"
    )
    print(
        "| gradient tensors | optimizers | interval: operations per iteration | headroom | "
        "extra | budget (2 + tensors / 8) | host reads, both |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in policy_cases():
        extra, interval, headroom = headroom_extra(case)
        tensors = case.tensors * case.optimizers
        print(
            f"| {tensors} | {case.optimizers} | {interval.operations / 100:.2f} | "
            f"{headroom.operations / 100:.2f} | {extra:.2f} | {2 + tensors / 8:.3f} | "
            f"{interval.reads / 100:.0f}, {headroom.reads / 100:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
