"""Data-parallel training on several ranks with one loss scaler per rank, in lockstep.

Run it with Paddle's launcher (two CPU processes here; GPUs work the same way):

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        examples/distributed_data_parallel.py --steps 40

Each rank builds the same model and the same scaler, trains on its share of every
batch, and the scaler reduces its found-inf flag over the ranks before any of them
decides: all ranks skip the same steps and keep the same scale. fp16 gradients are
emulated on a CPU, with a scale far too large at the start, so that the first steps
overflow and the scale backs off. At the end every rank checks that it agrees with
the others (``check_consistency``), rank 0 prints what happened and saves a checkpoint,
and every rank resumes from it.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import argparse
import os
import tempfile

import paddle
import paddle.distributed as dist

from paddle_amp_scaler import GradScaler, load_checkpoint, save_checkpoint
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import mlp, toy_batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--ckpt-dir", help="folder for the checkpoint (default: a temporary one)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    dist.init_parallel_env()
    rank, ranks = dist.get_rank(), dist.get_world_size()

    paddle.seed(0)  # the same seed on every rank: the same initial weights, the same run
    model = mlp()
    emulate_fp16_grads(model)
    model = paddle.DataParallel(model)
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    # Found-inf flags are reduced over every rank by default (sync_found_inf=True).
    scaler = GradScaler(init_loss_scaling=2.0**24, incr_every_n_steps=20)

    for x, y in toy_batches(args.steps, batch=32 * ranks):
        share = slice(rank * 32, rank * 32 + 32)
        loss = paddle.nn.functional.mse_loss(model(x[share]), y[share])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()

    scaler.check_consistency()  # raises, naming the ranks, if any rank disagrees
    if rank == 0:
        print(f"{ranks} ranks agree: {scaler.stats()}")
        print(f"last loss on rank 0: {float(loss):.4f}")

    # Everything is identical on every rank: one checkpoint, saved by rank 0, resumes all.
    folder = args.ckpt_dir or tempfile.mkdtemp(prefix="ddp-ckpt-")
    folder = broadcast_path(folder)
    path = os.path.join(folder, "ckpt.pdckpt")
    parts = dict(model=model, optimizer=optimizer, scaler=scaler)
    if dist.get_rank() == 0:
        save_checkpoint(path, step=args.steps, **parts)
    dist.barrier()
    step = load_checkpoint(path, **parts)
    if rank == 0:
        print(f"every rank resumed from step {step} of {path}")


def broadcast_path(path):
    """Rank 0's folder, on every rank (a temporary folder differs per process)."""
    paths = []
    dist.all_gather_object(paths, path)
    return paths[0]


if __name__ == "__main__":
    main()
