"""Pipeline-parallel training with fleet, one loss scaler per stage, in lockstep.

Run it with Paddle's launcher, one process per stage (two CPU processes here; two GPUs
work the same way):

    python -m paddle.distributed.launch --nproc_per_node 2 examples/pipeline_parallel.py

fleet splits four Linear layers into two stages, one per rank, and ``train_batch``
runs each batch through them in micro-batches. Each stage's scaler checks only its own
stage's gradients; with ``fleet.distributed_scaler`` every stage learns whether any
stage found inf/nan before it steps, so all skip the same steps and keep the same scale.
fp16 gradients are emulated on a CPU, with a scale far too large at the start, so that
the first steps overflow and the scale backs off. At the end the stages check that
they agree (``check_consistency``) and rank 0 prints what happened.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not. fleet warns that no weights are shared between stages:
# none are meant to be.
warnings.filterwarnings("ignore", message="No ccache found")
warnings.filterwarnings("ignore", message="No shared comm will be constructed")

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer

from paddle_amp_scaler import GradScaler
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import parse_steps, toy_batches

MICRO_BATCHES, MICRO_BATCH_SIZE = 4, 8


def main():
    steps = parse_steps(__doc__, default=40)
    stages = dist.get_world_size()
    if stages != 2:
        raise SystemExit("run it with Paddle's launcher on 2 processes, one per stage")
    hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": stages}
    if paddle.device.get_device() == "cpu":
        cpu_build_workarounds(hybrid_configs)
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = hybrid_configs
    strategy.pipeline_configs = {
        "accumulate_steps": MICRO_BATCHES,
        "micro_batch_size": MICRO_BATCH_SIZE,
    }
    fleet.init(is_collective=True, strategy=strategy)

    paddle.seed(0)  # the same seed on every rank: the same run every time
    layers = []
    for inputs, outputs in ((16, 64), (64, 64), (64, 64), (64, 1)):
        layers += [LayerDesc(paddle.nn.Linear, inputs, outputs), LayerDesc(paddle.nn.ReLU)]
    # This rank builds its own stage's layers alone.
    stage = PipelineLayer(
        layers=layers[:-1],
        topology=fleet.get_hybrid_communicate_group().topology(),
        loss_fn=paddle.nn.MSELoss(),
        seg_method="layer:Linear",
    )
    emulate_fp16_grads(stage)
    model = fleet.distributed_model(stage)
    optimizer = fleet.distributed_optimizer(
        paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    )
    # fleet has every stage agree on the found-inf flag before any of them steps.
    scaler = fleet.distributed_scaler(GradScaler(init_loss_scaling=2.0**24, incr_every_n_steps=20))

    # Every rank reads the same batches: the first stage takes x, the last y.
    for x, y in toy_batches(steps, batch=MICRO_BATCHES * MICRO_BATCH_SIZE):
        loss = model.train_batch([x, y], optimizer, lr_scheduler=None, scaler=scaler)

    scaler.check_consistency()  # raises, naming the ranks, if any stage disagrees
    if dist.get_rank() == 0:
        stats = scaler.stats()
        print(f"{stages} stages agree: {stats}")
        print(f"skipped {stats.skipped} of {stats.iterations} steps; final scale {stats.scale:g}")
        # train_batch gives every stage the last stage's loss.
        print(f"last loss: {loss.item():.4f}")


def cpu_build_workarounds(hybrid_configs):
    """What fleet's pipeline needs on a CPU build of Paddle, where the ranks talk over
    gloo; not needed, and left out, on GPUs."""
    # PipelineLayer reads ParallelEnv().device_id, which a CPU build never sets.
    if not hasattr(dist.ParallelEnv(), "_device_id"):
        dist.ParallelEnv.device_id = property(lambda self: 0)
    # Batched p2p sends on the calculation stream, which gloo cannot do.
    hybrid_configs["pp_configs"] = {"use_batch_p2p_comm": False}


if __name__ == "__main__":
    main()
