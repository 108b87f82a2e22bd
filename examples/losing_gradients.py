"""Is my run losing gradients? Measure it under the interval rule, then see what the
headroom policy would keep: the recipe of docs/monitoring.md, on a real run.

The digits classifier of ``train_digits.py``, from Paddle's default scale (2**16), with
``measure_every=50``: every 50th iteration the scaler measures the scaled gradients on
the device (no read), and ``losing_gradients()`` reports how far below float16's ceiling
they reach (``headroom_bits``), what share sits in float16's subnormal range, near its
floor, over the last measurements (``subnormal_fraction``), and the recipe's answer;
``underflow_report`` names the gradients that sit lowest. On a
CPU every matmul is rounded through float16 (``round_linear_layers``), so the run also
counts what float16 really flushed, which a GPU run cannot: the check on the recipe.

    python examples/losing_gradients.py [--steps 600]
"""

import warnings

warnings.filterwarnings("ignore", message="No ccache found")

import argparse

# scikit-learn before Paddle: Paddle 2.6 loads its own zlib.
from sklearn.datasets import load_digits  # isort: skip
import numpy as np
import paddle

from paddle_amp_scaler import GradScaler
from paddle_amp_scaler.testing import UnderflowCensus, round_linear_layers


def train(policy, steps, features, labels):
    """Train from the same weights on the same batches; every 200 steps print what the
    scaler reads and the mean of the losses since the last line; return the scaler, the
    model and the census."""
    paddle.seed(0)
    model = paddle.nn.Sequential(
        paddle.nn.Linear(64, 256),
        paddle.nn.ReLU(),
        paddle.nn.Linear(256, 128),
        paddle.nn.ReLU(),
        paddle.nn.Linear(128, 10),
    )
    census = UnderflowCensus()
    round_linear_layers(model, census)
    optimizer = paddle.optimizer.AdamW(learning_rate=2e-3, parameters=model.parameters())
    scaler = GradScaler(policy=policy, measure_every=50)
    order = np.random.default_rng(0)
    losses = paddle.zeros([])
    for step in range(1, steps + 1):
        batch = order.choice(len(features), 64, replace=False)
        logits = model(paddle.to_tensor(features[batch]))
        loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(labels[batch]))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        census.end_iteration(skipped=scaler.last_step_skipped())
        losses += loss.detach()
        if step % 200 == 0:
            # Over the last measurements: one measured iteration's share counts a handful
            # of gradient elements, and moves several-fold on another processor.
            reading = scaler.losing_gradients()
            print(
                f"  step {step:4d}  scale 2^{np.log2(scaler.stats().scale):.0f}  "
                f"headroom_bits {reading.headroom_bits:5.2f}  "
                f"subnormal_fraction {reading.subnormal_fraction:.2e}  "
                f"loss {float(losses) / 200:.4f}"
            )
            losses = paddle.zeros([])
    return scaler, model, census


def answer(scaler):
    """The recipe's answer as the scaler computes it, to its first colon (the numbers
    follow, as the lines above show them)."""
    return scaler.losing_gradients().verdict.split(":")[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="iterations per run (600)")
    steps = parser.parse_args().steps
    features, labels = load_digits(return_X_y=True)
    features, labels = (features / 16.0).astype("float32"), labels.astype("int64")

    print("interval, measure_every=50: what the scaler reports")
    scaler, model, interval = train("interval", steps, features, labels)
    print(f"  losing_gradients(): {answer(scaler)}")
    lowest = scaler.underflow_report(model)[0]
    print(
        f"  lowest gradient (underflow_report): {lowest.name}  "
        f"subnormal_fraction {lowest.subnormal_fraction:.2e}  "
        f"headroom_bits {lowest.headroom_bits:.1f}"
    )
    print("headroom, measure_every=50")
    _, _, headroom = train("headroom", steps, features, labels)
    print("what float16 flushed to zero (counted by the emulation, not by the scaler):")
    for name, census in (("interval", interval), ("headroom", headroom)):
        kept = census.kept
        print(
            f"  {name + ':':9s} flushed {kept.flushed_fraction:.3%} of nonzero gradient "
            f"elements, skipped {census.discarded_iterations} steps"
        )


if __name__ == "__main__":
    main()
