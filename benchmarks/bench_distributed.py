#!/usr/bin/env python
"""What the found-inf reduction costs a step on two ranks: the same scaler with
sync_found_inf=True and False, interleaved round by round, on every rank.

    python -m paddle.distributed.launch --nproc_per_node 2 \\
        benchmarks/bench_distributed.py [--rounds 300] [--workload 8x1M]

Each rank trains on its own gradients (no gradient all-reduce, as under sharding), so
the difference between the two is the reduction itself: an all-reduce of one int32
and two casts, plus the wait for the slower rank. Rank 0 prints medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import paddle
import paddle.distributed as dist

from paddle_amp_scaler import GradScaler

SCALE = 2.0**10
NEVER = 2**31 - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds (default 300)")
    parser.add_argument(
        "--workload", default="8x1M", help="TENSORSxPARAMS, e.g. 8x1M (default) or 64x4M"
    )
    args = parser.parse_args()
    tensors, params_text = args.workload.lower().split("x")
    total = int(float(params_text.rstrip("mk")) * (10**6 if params_text.endswith("m") else 10**3))
    dist.init_parallel_env()
    paddle.seed(dist.get_rank())
    params = [
        paddle.create_parameter([total // int(tensors)], "float32") for _ in range(int(tensors))
    ]
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=params)
    saved = [paddle.uniform(p.shape, min=-1.0, max=1.0) * SCALE for p in params]
    scalers = {
        "sync": GradScaler(init_loss_scaling=SCALE, incr_every_n_steps=NEVER),
        "no sync": GradScaler(
            init_loss_scaling=SCALE, incr_every_n_steps=NEVER, sync_found_inf=False
        ),
    }

    def step(scaler: GradScaler) -> float:
        for param, grad in zip(params, saved):
            param.grad = grad.clone()
        start = time.perf_counter()
        scaler.step(optimizer)
        scaler.update()
        return time.perf_counter() - start

    # The same order on every rank: each collective must meet its partner.
    order = random.Random(0)
    samples: dict[str, list[float]] = {name: [] for name in scalers}
    names = list(scalers)
    for round_index in range(args.rounds + 5):
        order.shuffle(names)
        for name in names:
            elapsed = step(scalers[name])
            if round_index >= 5:  # warm-up rounds
                samples[name].append(elapsed)
    if dist.get_rank() == 0:
        medians = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
        print(
            f"{dist.get_world_size()} ranks, {args.workload} SGD, {args.rounds} rounds, "
            f"Paddle {paddle.__version__}"
        )
        for name, median in medians.items():
            print(f"  step+update with {name:8s} {median:.3f} ms (median)")
        print(f"  the reduction: {medians['sync'] - medians['no sync']:+.3f} ms per step")


if __name__ == "__main__":
    main()
