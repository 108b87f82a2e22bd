"""One rank of a distributed test, started by test_distributed.py through
``python -m paddle.distributed.launch --nproc_per_node 2``.

    distributed_worker.py SCENARIO OUTPUT_DIR

Each scenario trains on the CPU and writes what it saw (per step: skipped or not, scale,
counters, statistics; at the end: the parameters) to OUTPUT_DIR/SCENARIO.rankR.npz;
the test process compares ranks with each other and with references it computes alone.
"""

import math
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

from paddle_amp_scaler import GradScaler, load_checkpoint, save_checkpoint

from helpers import GradInjector, batches, loss_of, make_model

STEPS = 8
# Steps (0-based) on which each rank writes inf into one of its gradients.
INJECTED = {0: {5}, 1: {1, 2}}
SCALER_ARGS = {"init_loss_scaling": 2.0**10, "incr_every_n_steps": 3}


def record(scaler, log):
    stats = scaler.stats()
    log.append(
        [
            scaler.last_step_skipped(),
            stats.scale,
            scaler.get_incr_count(),
            scaler.get_decr_count(),
            stats.iterations,
            stats.skipped,
            stats.skip_streak,
            stats.growths,
            stats.backoffs,
        ]
    )


def train(scaler, model, optimizer, data, injected, log, steps=range(STEPS)):
    # A data-parallel wrapper keeps the model in _layers.
    injector = GradInjector(getattr(model, "_layers", model)[0].weight)
    for step in steps:
        with injector.inject(math.inf if step in injected else None):
            scaler.scale(loss_of(model, data[step])).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        record(scaler, log)


def independent_ranks(rank, out):
    """No gradient all-reduce: each rank trains on its own data; only the flag is shared."""
    results = {}
    group = dist.new_group([0, 1])
    for name, options in (
        ("sync", {}),
        ("group", {"group": group}),
        ("nosync", {"sync_found_inf": False}),
        # Different gradients on each rank: different amaxes, agreed with the verdict.
        ("headroom", {"policy": "headroom"}),
    ):
        model = make_model(seed=0)
        optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        scaler = GradScaler(**SCALER_ARGS, **options)
        log = []
        train(scaler, model, optimizer, batches(seed=rank, steps=STEPS), INJECTED[rank], log)
        results[f"{name}_log"] = np.array(log, dtype="float64")
        for index, param in enumerate(model.parameters()):
            results[f"{name}_param{index}"] = param.numpy()
        if name == "sync":
            scaler.check_consistency()  # agrees: must not raise
            if rank == 1:
                scaler.set_init_loss_scaling(3.0)
            try:
                scaler.check_consistency()
                results["inconsistency"] = np.array("")
            except RuntimeError as error:
                results["inconsistency"] = np.array(str(error))
    np.savez(os.path.join(out, f"independent.rank{rank}.npz"), **results)


def logs_from_rank_zero(rank, out):
    """An overflow report and a stuck warning on both ranks: heard from rank 0 only."""
    import logging
    import warnings

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("paddle_amp_scaler").addHandler(handler)
    model = make_model(seed=0)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = GradScaler(**SCALER_ARGS, report_overflows=True, stuck_after=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(scaler, model, optimizer, batches(seed=rank, steps=STEPS), INJECTED[rank], [])
    np.savez(
        os.path.join(out, f"logs.rank{rank}.npz"),
        records=np.array([record.getMessage() for record in records] or [""]),
        warnings=np.array([str(warning.message) for warning in caught] or [""]),
    )


def branch_not_taken(rank, out):
    """Two optimizers; on rank 1 the second model is left out of the loss on some steps,
    so that its optimizer has no gradients there. No rank may wait for another."""
    first, second = make_model(seed=0), make_model(seed=1)
    optimizers = [
        paddle.optimizer.SGD(learning_rate=0.1, parameters=first.parameters()),
        paddle.optimizer.Adam(learning_rate=0.01, parameters=second.parameters()),
    ]
    scaler = GradScaler(**SCALER_ARGS)
    data = batches(seed=rank, steps=STEPS)
    log = []
    injector = GradInjector(first[0].weight)
    for step in range(STEPS):
        with injector.inject(math.inf if step in INJECTED[rank] else None):
            loss = loss_of(first, data[step])
            if not (rank == 1 and step % 2):
                loss = loss + loss_of(second, data[step])
            scaler.scale(loss).backward()
        for optimizer in optimizers:
            scaler.step(optimizer)
        scaler.update()
        for optimizer in optimizers:
            optimizer.clear_grad(set_to_zero=False)
        record(scaler, log)
    np.savez(os.path.join(out, f"branch.rank{rank}.npz"), log=np.array(log, dtype="float64"))


def data_parallel(rank, out):
    """paddle.DataParallel: each rank takes its half of a global batch."""
    model = paddle.DataParallel(make_model(seed=0))
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = GradScaler(**SCALER_ARGS)
    data = [(x[rank * 8 : rank * 8 + 8], y[rank * 8 : rank * 8 + 8]) for x, y in batches(seed=7)]
    log = []
    # One rank's inf reaches both through the gradient all-reduce.
    train(scaler, model, optimizer, data, {2} if rank == 1 else set(), log, range(len(data)))
    params = {f"param{i}": p.numpy() for i, p in enumerate(model.parameters())}
    np.savez(os.path.join(out, f"dp.rank{rank}.npz"), log=np.array(log, dtype="float64"), **params)


def resume(rank, out, scenario, phase):
    """Phase "first": an uninterrupted run, and one that saves a checkpoint part-way;
    phase "second", in new processes: load it and finish.

    "resume": independent ranks (Adam, each on its own data), one file per rank, saved
    after step 4. "dp_resume": DataParallel, every rank identical, one file saved by
    rank 0 alone after step 3 and loaded by every rank.
    """
    if scenario == "resume":
        data, injected, wrap = batches(seed=rank, steps=STEPS), INJECTED[rank], None
        path, stop, saves = os.path.join(out, f"checkpoint.rank{rank}.pdckpt"), 4, True
    else:
        data = [
            (x[rank * 8 : rank * 8 + 8], y[rank * 8 : rank * 8 + 8]) for x, y in batches(seed=7)
        ]
        injected, wrap = ({1, 4} if rank == 1 else set()), paddle.DataParallel
        path, stop, saves = os.path.join(out, "rank0.pdckpt"), 3, rank == 0

    def build():
        model = make_model(seed=0)
        model = wrap(model) if wrap else model
        optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
        return model, optimizer, GradScaler(**SCALER_ARGS)

    def keep(name, model, log):
        results[f"{name}_log"] = np.array(log, dtype="float64")
        results.update({f"{name}_param{i}": p.numpy() for i, p in enumerate(model.parameters())})

    results = {}
    if phase == "first":
        model, optimizer, scaler = build()
        log = []
        train(scaler, model, optimizer, data, injected, log, range(len(data)))
        keep("whole", model, log)
        model, optimizer, scaler = build()
        train(scaler, model, optimizer, data, injected, [], range(stop))
        if saves:
            save_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler, step=stop)
        dist.barrier()
    else:
        model, optimizer, scaler = build()
        step = load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler)
        log = []
        train(scaler, model, optimizer, data, injected, log, range(step, len(data)))
        keep("resumed", model, log)
    np.savez(os.path.join(out, f"{scenario}_{phase}.rank{rank}.npz"), **results)


def fleet_run(rank, out, degree):
    """fleet with its distributed optimizer and scaler, over gloo on the CPU: pure data
    parallelism (dp) or tensor-parallel groups (mp), where fleet replaces _unscale."""
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {
        "dp_degree": 2 if degree == "dp" else 1,
        "mp_degree": 2 if degree == "mp" else 1,
        "pp_degree": 1,
    }
    fleet.init(is_collective=True, strategy=strategy)
    model = make_model(seed=0)
    if degree == "dp":
        model = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(
        paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    )
    scaler = fleet.distributed_scaler(GradScaler(**SCALER_ARGS))
    log = []
    train(scaler, model, optimizer, batches(seed=rank, steps=STEPS), INJECTED[rank], log)
    np.savez(os.path.join(out, f"fleet_{degree}.rank{rank}.npz"), log=np.array(log, "float64"))


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    paddle.set_device("cpu")
    if not scenario.startswith("fleet"):
        dist.init_parallel_env()
    rank = dist.get_rank()
    if scenario == "independent":
        independent_ranks(rank, out)
    elif scenario == "branch":
        branch_not_taken(rank, out)
    elif scenario == "logs":
        logs_from_rank_zero(rank, out)
    elif scenario == "dp":
        data_parallel(rank, out)
    elif scenario.startswith(("resume_", "dp_resume_")):
        resume(rank, out, *scenario.rsplit("_", 1))
    elif scenario in ("fleet_dp", "fleet_mp"):
        fleet_run(rank, out, scenario.split("_")[1])
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
    # The results are written. Paddle 3.3's teardown at exit crashes now and then
    # (SIGSEGV, SIGABRT), which would fail a run that did its work: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
