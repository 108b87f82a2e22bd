"""Tensor parallelism in Paddle 3's semi-automatic style, with the loss scaler in lockstep.

Run it with Paddle's launcher (two CPU processes here; GPUs work the same way):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        examples/semi_auto_parallel.py --steps 40

The model's two layers are split over a mesh of the ranks (the first by columns, the
second by rows) with ``dist.shard_layer``; ``dist.shard_optimizer`` and
``dist.shard_scaler`` do the rest, as Paddle's own scaler is used. Each rank checks its
own shards of the gradients, and the found-inf flag is agreed over the mesh before any
rank decides: every rank skips the same steps and keeps the same scale. fp16 gradients
are emulated on a CPU, with a scale far too large at the start, so that the first steps
overflow and the scale backs off. Paddle 3.0 or later.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle
import paddle.distributed as dist

from paddle_amp_scaler import GradScaler
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import mlp, parse_steps, toy_batches


def split_over(mesh):
    """Megatron's split of a two-layer MLP: the first layer by columns, the second by
    rows, so that the hidden activations never travel between ranks."""

    def shard(name, layer, mesh):
        if name == "0":
            layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(1)])
            layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Shard(0)])
        elif name == "2":
            layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(0)])
            layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Replicate()])

    return shard


def main():
    steps = parse_steps(__doc__, default=40)
    ranks = dist.get_world_size()
    mesh = dist.ProcessMesh(list(range(ranks)), dim_names=["mp"])

    paddle.seed(0)  # the same seed on every rank: the same initial weights, then split
    model = dist.shard_layer(mlp(), mesh, split_over(mesh))
    emulate_fp16_grads(model)
    optimizer = dist.shard_optimizer(
        paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    )
    scaler = dist.shard_scaler(GradScaler(init_loss_scaling=2.0**24, incr_every_n_steps=20))

    for x, y in toy_batches(steps):
        x = dist.shard_tensor(x, mesh, [dist.Replicate()])
        y = dist.shard_tensor(y, mesh, [dist.Replicate()])
        loss = paddle.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()

    scaler.check_consistency()  # raises, naming the ranks, if any rank disagrees
    if dist.get_rank() == 0:
        print(f"{ranks} ranks agree: {scaler.stats()}")
        print(f"last loss: {float(loss):.4f}")


if __name__ == "__main__":
    main()
