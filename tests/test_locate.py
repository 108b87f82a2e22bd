"""locate_overflow(model): the layer and the phase where an overflow starts, forward or
backward, on models built so that the answer is known; its hooks gone afterwards."""

import math

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import GradScaler, OverflowOrigin, locate_overflow


def model_whose_layer_overflows(layer_index):
    """Linear, ReLU, Linear, ReLU, Linear; the weights of Linear ``layer_index`` made so
    large that its output passes 65504, finite in float32."""
    paddle.seed(0)
    model = paddle.nn.Sequential(
        paddle.nn.Linear(4, 8),
        paddle.nn.ReLU(),
        paddle.nn.Linear(8, 8),
        paddle.nn.ReLU(),
        paddle.nn.Linear(8, 1),
    )
    weight = model[layer_index].weight
    weight.set_value(paddle.full(weight.shape, 1e5))
    return model


def test_a_forward_overflow_is_named_by_its_layer_and_phase():
    model = model_whose_layer_overflows(2)
    x = paddle.ones([2, 4])
    with locate_overflow(model) as found:
        loss = model(x).mean()
        GradScaler().scale(loss).backward()
    first = found.first
    assert isinstance(first, OverflowOrigin)
    assert (first.layer, first.phase, first.kind) == ("2", "forward", "beyond float16")
    expected = float(np.abs(model[2](model[1](model[0](x))).numpy()).max())
    assert first.largest == pytest.approx(expected)
    assert (first.shape, first.dtype) == ((2, 8), "float32")
    # What follows it is found too, in order: the next layers and the model itself.
    forward = [origin.layer for origin in found.origins if origin.phase == "forward"]
    assert forward[0] == "2" and "" in forward and "0" not in forward
    report = str(found)
    assert report.startswith("first overflow: the forward output of layer '2' (Linear) is ")
    assert "beyond float16 (largest" in report.splitlines()[0]


def test_an_input_with_inf_is_named_at_the_first_layer():
    model = model_whose_layer_overflows(4)
    x = paddle.to_tensor([[1.0, math.inf, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    with locate_overflow(model) as found:
        model(x)
    assert (found.first.layer, found.first.phase) == ("0", "forward")
    assert found.first.kind in ("inf", "nan")


class Exploding(paddle.autograd.PyLayer):
    """The identity forward; its backward multiplies the gradient by 1e30."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return grad * 1e30


class Boom(paddle.nn.Layer):
    def forward(self, x):
        return Exploding.apply(x)


def test_a_backward_that_explodes_is_named_by_the_layer_whose_backward_made_it():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), Boom(), paddle.nn.Linear(8, 1))
    with locate_overflow(model) as found:
        model(paddle.ones([2, 4])).mean().backward()
    assert [origin.phase for origin in found.origins][:1] == ["backward"]
    assert (found.first.layer, found.first.phase, found.first.kind) == (
        "1",
        "backward",
        "beyond float16",
    )
    # The first layer's weight gradient is made from it, and overflows too: later.
    assert any(o.layer == "0" and o.phase == "backward" for o in found.origins[1:])
    assert "a gradient made by the backward of layer '1' (Boom)" in str(found)


def test_a_healthy_iteration_finds_nothing_and_says_so():
    model = model_whose_layer_overflows(0)
    model[0].weight.set_value(paddle.full(model[0].weight.shape, 0.1))
    with locate_overflow(model) as found:
        model(paddle.ones([2, 4])).mean().backward()
    assert found.first is None and found.origins == []
    assert str(found).startswith("no overflow")


def test_the_hooks_go_when_the_context_ends_even_on_an_exception():
    model = model_whose_layer_overflows(2)
    with pytest.raises(RuntimeError, match="planted"), locate_overflow(model):
        model(paddle.ones([2, 4])).mean().backward()
        raise RuntimeError("planted")
    for layer in [model, *model.sublayers()]:
        assert not layer._forward_post_hooks
    # After it, the same iteration finds nothing more: no hook is left to call.
    with locate_overflow(model) as found:
        pass
    model(paddle.ones([2, 4])).mean().backward()
    assert found.origins == []


def test_the_ceiling_sets_what_counts_as_beyond_float16():
    model = model_whose_layer_overflows(2)
    with locate_overflow(model, ceiling=1e30) as found:
        model(paddle.ones([2, 4]))
    assert found.origins == []


@pytest.mark.parametrize(("model", "ceiling"), [("a model", 1.0), (None, 1.0)])
def test_what_is_no_model_is_refused(model, ceiling):
    with pytest.raises(TypeError, match="paddle.nn.Layer"), locate_overflow(model, ceiling=ceiling):
        pass


def test_a_ceiling_that_is_no_positive_number_is_refused():
    refused = pytest.raises((TypeError, ValueError), match="ceiling")
    with refused, locate_overflow(paddle.nn.Linear(2, 2), ceiling=-1.0):
        pass
