"""Why does my run skip? The two causes of a skipped step, what a default scaler says of
each, and ``locate_overflow`` finding where each starts: the page docs/why-it-skips.md.

Two runs of the digits classifier, fp16 emulated on a CPU (every ``Linear`` rounded
through float16, as O1 computes on a GPU), each with a default ``GradScaler()``:

- a forward overflow: a deep MLP initialised with unit-variance weights (not scaled by
  the fan-in), so that each layer makes the activations about elevenfold larger, until
  one passes float16's 65504 and the loss is inf before any scaling;
- a gradient overflow: an L2-norm layer meets the all-zero rows that pad every batch to
  64 examples. ``sqrt(0)`` is a finite 0, its derivative is infinite: the loss is finite,
  and the gradients are nan at every scale.

    python examples/why_it_skips.py [--steps 200]
"""

import warnings

warnings.filterwarnings("ignore", message="No ccache found")

import argparse
import textwrap

# scikit-learn before Paddle: Paddle 2.6 loads its own zlib.
from sklearn.datasets import load_digits  # isort: skip
import numpy as np
import paddle

import paddle_amp_scaler
from paddle_amp_scaler.testing import round_linear_layers


class RowLength(paddle.nn.Layer):
    """Each row with its length appended, ``sqrt(sum(x**2))``: a finite 0 for a row of
    zeros, whose derivative there is infinite."""

    def forward(self, x):
        return paddle.concat([x, paddle.sqrt((x * x).sum(axis=1, keepdim=True))], axis=1)


def classifier(cause):
    paddle.seed(0)
    if cause == "forward":
        # Unit-variance weights, not scaled by the fan-in: each layer multiplies the size
        # of the activations about elevenfold.
        unit = paddle.ParamAttr(initializer=paddle.nn.initializer.Normal(0.0, 1.0))
        widths = [64, 256, 256, 256, 256, 256]
        layers = []
        for fan_in, fan_out in zip(widths, widths[1:]):
            layers += [paddle.nn.Linear(fan_in, fan_out, weight_attr=unit), paddle.nn.ReLU()]
        model = paddle.nn.Sequential(*layers, paddle.nn.Linear(256, 10))
    else:
        # Without a bias, the padding rows stay all zeros up to the length.
        model = paddle.nn.Sequential(
            paddle.nn.Linear(64, 256, bias_attr=False),
            paddle.nn.ReLU(),
            RowLength(),
            paddle.nn.Linear(257, 128),
            paddle.nn.ReLU(),
            paddle.nn.Linear(128, 10),
        )
    round_linear_layers(model)
    return model


def batches(features, labels, steps):
    """Batches of 56 examples, padded with 8 all-zero rows (labelled 0) to 64."""
    order = np.random.default_rng(0)
    padding = np.zeros([8, 64], "float32"), np.zeros([8], "int64")
    for _ in range(steps):
        chosen = order.choice(len(features), 56, replace=False)
        x = np.concatenate([features[chosen], padding[0]])
        y = np.concatenate([labels[chosen], padding[1]])
        yield paddle.to_tensor(x), paddle.to_tensor(y)


def loss_of(model, batch):
    x, y = batch
    return paddle.nn.functional.cross_entropy(model(x), y)


def train(cause, steps, features, labels):
    """Train with a default scaler, then run one diagnostic iteration: returns the
    scaler's ``stats()``, the warnings it gave, and what ``locate_overflow`` found."""
    model = classifier(cause)
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    scaler = paddle_amp_scaler.GradScaler()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", RuntimeWarning)
        for batch in batches(features, labels, steps):
            scaler.scale(loss_of(model, batch)).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.clear_grad()

    # Where does it start? One more iteration, checked layer by layer.
    batch = next(batches(features, labels, 1))
    with paddle_amp_scaler.locate_overflow(model) as found:
        scaler.scale(loss_of(model, batch)).backward()
    optimizer.clear_grad()
    return scaler.stats(), said, found


def show(stats, said, found):
    print(
        f"  iterations {stats.iterations}  skipped {stats.skipped}  "
        f"nonfinite_loss {stats.nonfinite_loss}  scale {stats.scale:g}"
    )
    for warning in said:
        text = f"{warning.category.__name__}: {warning.message}"
        print(textwrap.fill(text, 88, initial_indent="  ", subsequent_indent="    "))
    print("  locate_overflow:")
    for line in str(found).splitlines():
        # Each finding on two lines, parted where no number varies.
        finding, _, shape = line.partition(", shape ")
        print(f"    {finding}" + (f"\n      shape {shape}" if shape else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="iterations per run (200)")
    steps = parser.parse_args().steps
    features, labels = load_digits(return_X_y=True)
    features, labels = (features / 16.0).astype("float32"), labels.astype("int64")

    print("a forward overflow (an MLP initialised with unit-variance weights):")
    show(*train("forward", steps, features, labels))
    print("a gradient overflow (the length sqrt(sum(x**2)) of all-zero padding rows):")
    show(*train("gradients", steps, features, labels))


if __name__ == "__main__":
    main()
