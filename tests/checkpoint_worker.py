"""A training run that checkpoints every few steps and resumes from its checkpoint.

Used by the kill -9 test: however often it is killed and restarted, it must end with
the parameters of a run that was never interrupted.

    python checkpoint_worker.py --dir DIR --steps 300 --every 5
"""

import argparse
import math
import os
import warnings

import numpy as np

# Before Paddle: Paddle 2.6 loads its own zlib, which breaks numpy.random's later import.
import numpy.random
import paddle

from paddle_amp_scaler import GradScaler, load_checkpoint, save_checkpoint
from paddle_amp_scaler.checkpoint import rng_state_survives_pickling

# Steps whose gradients overflow, so that the scaler's state matters on resume.
OVERFLOW_STEPS = {7, 23, 51, 140, 141, 250}


def build(policy):
    paddle.seed(0)
    # Dropout repeats after a resume only where Paddle can save its generator's position.
    dropout = 0.1 if rng_state_survives_pickling() else 0.0
    model = paddle.nn.Sequential(
        paddle.nn.Linear(64, 256),
        paddle.nn.ReLU(),
        paddle.nn.Dropout(dropout),
        paddle.nn.Linear(256, 64),
    )
    schedule = paddle.optimizer.lr.StepDecay(0.01, step_size=50, gamma=0.5)
    optimizer = paddle.optimizer.AdamW(learning_rate=schedule, parameters=model.parameters())
    scaler = GradScaler(init_loss_scaling=2.0**12, incr_every_n_steps=20, policy=policy)
    return model, optimizer, schedule, scaler


def batch_for(step):
    rng = np.random.default_rng(step)
    return (
        paddle.to_tensor(rng.standard_normal((32, 64)).astype("float32")),
        paddle.to_tensor(rng.standard_normal((32, 64)).astype("float32")),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--policy", default="interval")
    args = parser.parse_args()
    paddle.set_device("cpu")
    warnings.simplefilter("ignore")
    model, optimizer, schedule, scaler = build(args.policy)
    checkpoint = os.path.join(args.dir, "run.ckpt")
    start = 0
    if os.path.exists(checkpoint):
        start = load_checkpoint(checkpoint, model=model, optimizer=optimizer, scaler=scaler)
    print(f"training from step {start}", flush=True)
    for step in range(start, args.steps):
        x, y = batch_for(step)
        loss = paddle.nn.functional.mse_loss(model(x), y)
        if step in OVERFLOW_STEPS:
            loss = loss * math.inf
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        schedule.step()
        if (step + 1) % args.every == 0:
            save_checkpoint(
                checkpoint, model=model, optimizer=optimizer, scaler=scaler, step=step + 1
            )
    # The scale, and under the headroom policy its memory, must resume exactly too.
    memory = scaler.state_dict().get("headroom", {})
    final = np.concatenate(
        [p.numpy().ravel() for p in model.parameters()]
        + [np.array([scaler.get_loss_scaling(), *memory.values()], dtype="float32")]
    )
    # np.save, not np.savez: the zip writer would load zlib, which crashes beside Paddle 2.6.
    np.save(os.path.join(args.dir, "final.npy"), final)


if __name__ == "__main__":
    main()
