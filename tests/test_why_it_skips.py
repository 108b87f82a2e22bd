"""The page "Why does my run skip?" (docs/why-it-skips.md), checked on every Paddle: its
two runs, a forward overflow and a gradient overflow, each with a default scaler, what
the scaler counts and says of each, and where ``locate_overflow`` finds each starts,
against a reference that walks the model without it."""

import importlib.util
import math
import os

import numpy as np
import paddle
import pytest

pytest.importorskip("sklearn")

EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "why_it_skips.py"
)


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("why_it_skips", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    features, labels = load_digits(return_X_y=True)
    return (features / 16.0).astype("float32"), labels.astype("int64")


def first_batch(example, digits):
    return next(example.batches(*digits, 1))


def test_a_forward_overflow_is_counted_and_said_as_the_loss_and_located(example, digits):
    stats, said, found = example.train("forward", 200, *digits)
    assert stats.iterations == stats.skipped == stats.nonfinite_loss == 200
    assert stats.scale == 1.0
    (warning,) = said
    assert issubclass(warning.category, RuntimeWarning)
    assert "the loss was already inf or nan before scaling" in str(warning.message)
    assert "No loss scale fixes that" in str(warning.message)

    # The reference: the layers run one by one, without hooks; the first whose output is
    # not finite. No step changed a weight (all were skipped), so the model is as built.
    model = example.classifier("forward")
    x, _ = first_batch(example, digits)
    outputs = []
    for layer in model:
        x = layer(x)
        outputs.append(x.numpy())
    index = next(i for i, output in enumerate(outputs) if not np.isfinite(output).all())
    first = found.first
    assert (first.layer, first.phase, first.kind) == (str(index), "forward", "inf")
    assert first.shape == outputs[index].shape and first.dtype == "float32"
    finite = np.abs(outputs[index])[np.isfinite(outputs[index])]
    assert first.largest == pytest.approx(float(finite.max()), rel=1e-6) == 65504.0


def test_a_gradient_overflow_is_counted_and_said_as_the_gradients_and_located(example, digits):
    stats, said, found = example.train("gradients", 200, *digits)
    assert (stats.iterations, stats.skipped, stats.nonfinite_loss) == (200, 200, 0)
    (warning,) = said
    assert "inf/nan gradients at every scale down to 1, with a finite loss" in str(warning.message)

    # The reference: the gradient with respect to the length layer's input, by
    # paddle.grad, is nan where its input (and the loss) is finite.
    model = example.classifier("gradients")
    x, y = first_batch(example, digits)
    hidden = model[1](model[0](x))
    loss = paddle.nn.functional.cross_entropy(model[3:](model[2](hidden)), y)
    (grad,) = paddle.grad(loss, hidden)
    assert math.isfinite(float(loss)) and np.isfinite(hidden.numpy()).all()
    assert np.isnan(grad.numpy()).any()

    first = found.first
    assert (first.layer, first.phase, first.kind) == ("2", "backward", "nan")
    assert first.shape == tuple(hidden.shape)
    assert type(model[int(first.layer)]).__name__ == "RowLength"
