"""Shared by the pattern examples: a toy regression problem and a step-count flag."""

import argparse

import paddle


def parse_steps(docstring, default=20):
    """``--steps``, with the example's docstring's first paragraph as ``--help`` says it."""
    parser = argparse.ArgumentParser(description=docstring.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=default, help=f"training steps (default {default})"
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    paddle.set_device("gpu" if gpu_available() else "cpu")
    return args.steps


def gpu_available():
    # A CUDA build on a machine without a GPU must still run, on the CPU.
    return paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


def toy_batches(steps, batch=32, features=16, seed=0):
    paddle.seed(seed)
    weights = paddle.randn([features, 1])
    for _ in range(steps):
        x = paddle.randn([batch, features])
        yield x, paddle.tanh(x @ weights)


def mlp(features=16, hidden=64, outputs=1):
    return paddle.nn.Sequential(
        paddle.nn.Linear(features, hidden), paddle.nn.ReLU(), paddle.nn.Linear(hidden, outputs)
    )
