"""One rank, so one stage, of the pipeline-parallel test, started by
test_pipeline_parallel.py through ``python -m paddle.distributed.launch --nproc_per_node 2``.

    pipeline_worker.py OUTPUT_DIR

fleet splits four Linear layers over two stages (pp_degree 2, dp 1); ``train_batch``
trains them with this package's GradScaler, then again with Paddle's own, then without a
scaler, leaving out the steps that overflow. Each run starts from the same seed.
What each stage saw (per step: skipped or not, scale, counters, statistics, loss; at the
end: its parameters) goes to OUTPUT_DIR/pipeline.rankR.npz; the test process compares.
"""

import contextlib
import math
import os
import sys
import types

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

from paddle_amp_scaler import GradScaler

from distributed_worker import record
from helpers import GradInjector, oracle_skipped

STEPS = 8
# As test_distributed.expected_log assumes.
SCALER_ARGS = {"init_loss_scaling": 2.0**10, "incr_every_n_steps": 3}
# Steps (0-based) that overflow: inf in the first stage's first weight gradient, where
# the last stage's gradients stay finite, and inf in the loss, on the last stage.
INF_IN_A_GRADIENT, INF_IN_THE_LOSS = 3, 5
MICRO_BATCHES, MICRO_BATCH_SIZE = 2, 4
LAST_STAGE = 1


class InjectableLoss(paddle.nn.Layer):
    """Mean squared error, times ``factor`` when one is set."""

    def __init__(self):
        super().__init__()
        self.factor = None

    def forward(self, output, label):
        loss = paddle.nn.functional.mse_loss(output, label)
        return loss if self.factor is None else loss * self.factor


def cpu_workarounds():
    """What fleet's pipeline needs on a CPU build of Paddle, and nowhere else."""
    # A CPU build's ParallelEnv never sets _device_id, which PipelineLayer reads.
    if not hasattr(dist.ParallelEnv(), "_device_id"):
        dist.ParallelEnv.device_id = property(lambda self: 0)
    # Gloo cannot send on the calculation stream, which batched p2p does.
    return {"use_batch_p2p_comm": False}


@contextlib.contextmanager
def paddle_scaler_enabled_on_cpu():
    """Paddle's GradScaler switches itself off unless the tracer reports a GPU place and
    the global AMP dtype is float16, and its back-off line calls float() on a shape-[1]
    tensor, which NumPy 2 refuses: tests/helpers.py's paddle_oracle, without pytest."""
    from paddle.amp import grad_scaler
    from paddle.amp.auto_cast import amp_global_state

    gpu_place = types.SimpleNamespace(
        is_gpu_place=lambda: True, is_xpu_place=lambda: False, is_custom_place=lambda: False
    )
    tracer, dtype, to_float = (
        grad_scaler._dygraph_tracer,
        amp_global_state().amp_dtype,
        paddle.Tensor.__float__,
    )
    grad_scaler._dygraph_tracer = lambda: types.SimpleNamespace(_expected_place=gpu_place)
    amp_global_state().amp_dtype = "float16"
    paddle.Tensor.__float__ = lambda t: to_float(t.reshape([])) if t.size == 1 else to_float(t)
    try:
        yield
    finally:
        grad_scaler._dygraph_tracer = tracer
        amp_global_state().amp_dtype = dtype
        paddle.Tensor.__float__ = to_float


def batches():
    rng = np.random.default_rng(0)
    size = MICRO_BATCHES * MICRO_BATCH_SIZE
    return [
        (
            paddle.to_tensor(rng.standard_normal((size, 8)).astype("float32")),
            paddle.to_tensor(rng.standard_normal((size, 4)).astype("float32")),
        )
        for _ in range(STEPS)
    ]


def train(kind, stage, data):
    """``train_batch`` for STEPS steps with scaler ``kind`` ("ours", "paddle", or
    "none", which leaves out the steps that overflow); the scaler, the model, and per
    step the loss and the scaler's log."""
    paddle.seed(0)
    loss = InjectableLoss()
    descriptions = []
    for inputs, outputs in ((8, 16), (16, 16), (16, 16), (16, 4)):
        descriptions += [LayerDesc(paddle.nn.Linear, inputs, outputs), LayerDesc(paddle.nn.Tanh)]
    layers = PipelineLayer(
        layers=descriptions[:-1],
        topology=fleet.get_hybrid_communicate_group().topology(),
        loss_fn=loss,
        seg_method="layer:Linear",
    )
    model = fleet.distributed_model(layers)
    optimizer = fleet.distributed_optimizer(
        paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    )
    scaler = None
    if kind == "ours":
        scaler = fleet.distributed_scaler(GradScaler(**SCALER_ARGS))
    elif kind == "headroom":
        # fleet's unscale measures and counts nothing: the scaler looks before it.
        options = {"policy": "headroom", "report_overflows": True}
        scaler = fleet.distributed_scaler(GradScaler(**SCALER_ARGS, **options))
    elif kind == "paddle":
        scaler = fleet.distributed_scaler(paddle.amp.GradScaler(**SCALER_ARGS))
        if not scaler.is_enable():
            raise RuntimeError("could not enable Paddle's GradScaler on the CPU")
    injector = GradInjector(model.parameters()[0]) if stage == 0 else None
    losses, log = [], []
    for step, (x, y) in enumerate(data):
        if kind == "none" and step in (INF_IN_A_GRADIENT, INF_IN_THE_LOSS):
            continue
        in_gradient = injector is not None and step == INF_IN_A_GRADIENT
        loss.factor = math.inf if stage == LAST_STAGE and step == INF_IN_THE_LOSS else None
        with injector.inject(math.inf) if in_gradient else contextlib.nullcontext():
            losses.append(
                model.train_batch([x, y], optimizer, lr_scheduler=None, scaler=scaler).item()
            )
        if kind == "ours":
            record(scaler, log)
        elif kind == "headroom":
            stats = scaler.stats()
            reported = [entry.iteration for entry in scaler.overflow_report()]
            log.append([stats.scale, stats.headroom_bits or 0.0, max(reported, default=0)])
        elif kind == "paddle":
            log.append(
                [
                    oracle_skipped(scaler),
                    scaler._scale.numpy().item(),
                    scaler._incr_count,
                    scaler._decr_count,
                ]
            )
    return scaler, model, losses, log


def main():
    out = sys.argv[1]
    paddle.set_device("cpu")
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {
        "dp_degree": 1,
        "mp_degree": 1,
        "pp_degree": 2,
        "pp_configs": cpu_workarounds(),
    }
    strategy.pipeline_configs = {
        "accumulate_steps": MICRO_BATCHES,
        "micro_batch_size": MICRO_BATCH_SIZE,
    }
    fleet.init(is_collective=True, strategy=strategy)
    rank = dist.get_rank()
    stage = fleet.get_hybrid_communicate_group().get_stage_id()
    data = batches()
    results = {"stage": np.array(stage)}

    ours, model, losses, log = train("ours", stage, data)
    results.update(ours_log=np.array(log, "float64"), ours_loss=np.array(losses))
    results.update({f"ours_param{i}": p.numpy() for i, p in enumerate(model.parameters())})
    # fleet.distributed_scaler returns the scaler it was given, its _unscale replaced.
    try:
        ours.check_consistency()
        results["consistency"] = np.array("")
    except RuntimeError as error:
        results["consistency"] = np.array(str(error))

    _, _, _, log = train("headroom", stage, data)
    results["headroom_log"] = np.array(log, "float64")

    with paddle_scaler_enabled_on_cpu():
        _, model, losses, log = train("paddle", stage, data)
    results.update(paddle_log=np.array(log, "float64"), paddle_loss=np.array(losses))
    results.update({f"paddle_param{i}": p.numpy() for i, p in enumerate(model.parameters())})

    _, model, losses, _ = train("none", stage, data)
    results["unscaled_loss"] = np.array(losses)
    results.update({f"unscaled_param{i}": p.numpy() for i, p in enumerate(model.parameters())})
    np.savez(os.path.join(out, f"pipeline.rank{rank}.npz"), **results)


if __name__ == "__main__":
    main()
    # The results are written. Paddle 3.3's teardown at exit crashes now and then
    # (SIGSEGV, SIGABRT), which would fail a run that did its work: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
