"""A small mixed-precision training run with dynamic loss scaling, on CPU or GPU.

On a CPU, fp16 is emulated: every gradient is rounded through float16, so the first
steps overflow at the large initial scale and you can watch the scaler back off.

    python examples/quickstart.py --steps 300
"""

import argparse
import time

import numpy as np
import paddle

from paddle_amp_scaler import AmpScaler, auto_cast
from paddle_amp_scaler.testing import emulate_fp16_grads


def synthetic_regression(rng, samples, features=32):
    weights = rng.standard_normal((features, 1)).astype("float32")
    x = rng.standard_normal((samples, features)).astype("float32")
    y = np.tanh(x @ weights) + 0.05 * rng.standard_normal((samples, 1)).astype("float32")
    return paddle.to_tensor(x), paddle.to_tensor(y)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--init-scale", type=float, default=2.0**20,
                        help="initial loss scale (default 2**20, large enough to overflow)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1")

    on_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    paddle.set_device("gpu" if on_gpu else "cpu")
    paddle.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x, y = synthetic_regression(rng, samples=4096)

    model = paddle.nn.Sequential(paddle.nn.Linear(32, 128), paddle.nn.ReLU(),
                                 paddle.nn.Linear(128, 1))
    if not on_gpu:
        emulate_fp16_grads(model)
    optimizer = paddle.optimizer.AdamW(learning_rate=3e-3, parameters=model.parameters())
    scaler = AmpScaler(init_loss_scaling=args.init_scale, incr_every_n_steps=100)

    skipped, started = 0, time.perf_counter()
    for step in range(1, args.steps + 1):
        index = rng.integers(0, x.shape[0], args.batch_size)
        with auto_cast(enable=on_gpu):
            loss = paddle.nn.functional.mse_loss(model(x[index]), y[index])
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.minimize(optimizer, scaled)
        optimizer.clear_grad()
        # Reading the flag is a device sync: the example does it to report, the scaler never does.
        skipped += bool(scaler._cache_found_inf)
        if step == 1 or step % 50 == 0:
            print(f"step {step:4d}  loss {float(loss):.4f}  scale {scaler.get_loss_scaling():9.0f}"
                  f"  skipped {skipped}")

    with paddle.no_grad():
        final = float(paddle.nn.functional.mse_loss(model(x), y))
    print(f"done in {time.perf_counter() - started:.1f}s on {'GPU' if on_gpu else 'CPU'}: "
          f"mse {final:.4f}, {skipped} skipped steps, final scale {scaler.get_loss_scaling():.0f}")


if __name__ == "__main__":
    main()
