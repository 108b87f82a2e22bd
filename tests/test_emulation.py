"""fp16 emulation on a CPU (``paddle_amp_scaler.testing``): rounding through float16 in
both passes, and the census of what the rounding does to gradients, held to values
worked out by hand and to NumPy's float16."""

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import testing
from paddle_amp_scaler.testing import (
    CensusCounts,
    UnderflowCensus,
    count_float16_range,
    round_linear_layers,
    round_through_float16,
)

F32 = np.float32


def below(value):
    return np.nextafter(F32(value), F32(0))


def above(value):
    return np.nextafter(F32(value), F32(np.inf))


# (value, what float16 makes of it), each a boundary of float16's range or beside one.
KNOWN = [
    (2.0**-26, "flushed"),
    (below(2.0**-25), "flushed"),
    (2.0**-25, "flushed"),  # half the smallest subnormal: a tie, to the even zero
    (above(2.0**-25), "subnormal"),  # rounds up to 2**-24
    (below(2.0**-24), "subnormal"),
    (2.0**-24, "subnormal"),  # the smallest subnormal
    (above(2.0**-24), "subnormal"),
    (2.0**-15, "subnormal"),
    (2.0**-14 - 2.0**-24, "subnormal"),  # the largest subnormal
    (below(2.0**-14 - 2.0**-25), "subnormal"),
    (2.0**-14 - 2.0**-25, "normal"),  # a tie between the largest subnormal and 2**-14: even
    (below(2.0**-14), "normal"),
    (2.0**-14, "normal"),  # the smallest normal
    (1.0, "normal"),
    (65504.0, "normal"),  # the largest finite float16
    (below(65520.0), "normal"),  # rounds down to 65504
    (65520.0, "inf"),  # a tie between 65504 and 65536: to the even, which is inf
    (above(65520.0), "inf"),
    (1e30, "inf"),
]


def numpy_float16(values):
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=F32).astype(np.float16).astype(F32)


@pytest.mark.parametrize(("value", "fate"), KNOWN)
def test_each_boundary_value_is_counted_where_float16_puts_it(value, fate):
    for signed in (F32(value), -F32(value)):
        counts = count_float16_range(np.array([signed], dtype=F32))
        assert counts == CensusCounts(
            nonzero=1,
            flushed=int(fate == "flushed"),
            subnormal=int(fate == "subnormal"),
            overflowed=int(fate == "inf"),
        ), (signed, fate)
        # The table above is NumPy's rounding too, so the hand-made fates are right.
        rounded = numpy_float16([signed])[0]
        assert (rounded == 0) == (fate == "flushed")
        assert np.isinf(rounded) == (fate == "inf")
        assert (0 < abs(rounded) < 2.0**-14) == (fate == "subnormal")


def test_zeros_infs_and_nans_are_not_counted():
    values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-30, 3.0], dtype=F32)
    assert count_float16_range(values) == CensusCounts(nonzero=2, flushed=1)
    assert count_float16_range(paddle.to_tensor(values)) == CensusCounts(nonzero=2, flushed=1)


def test_counts_agree_with_numpy_rounding_across_float16s_whole_range():
    rng = np.random.default_rng(0)
    values = (rng.choice([-1, 1], 200_000) * np.exp2(rng.uniform(-30, 17, 200_000))).astype(F32)
    rounded = numpy_float16(values)
    counts = count_float16_range(values)
    assert counts.nonzero == values.size
    assert counts.flushed == np.count_nonzero(rounded == 0) > 0
    assert counts.subnormal == np.count_nonzero((rounded != 0) & (np.abs(rounded) < 2**-14)) > 0
    assert counts.overflowed == np.count_nonzero(np.isinf(rounded)) > 0


def test_rounding_rounds_the_forward_value_and_the_gradient():
    forward = np.array([1 / 3, 1e5, 2.0**-26, 70000.0, -2.5], dtype=F32)
    upstream = np.array([1e5, 2.0**-25, above(2.0**-25), 1 / 3, 2.0**-20], dtype=F32)
    x = paddle.to_tensor(forward, stop_gradient=False)
    census = UnderflowCensus()
    rounded = round_through_float16(x, census)
    np.testing.assert_array_equal(rounded.numpy(), numpy_float16(forward))
    (rounded * paddle.to_tensor(upstream)).sum().backward()
    # The gradient arrives rounded: 1e5 is inf, 2**-25 is zero, just above it 2**-24.
    np.testing.assert_array_equal(x.grad.numpy(), numpy_float16(upstream))
    assert np.isinf(x.grad.numpy()[0]) and x.grad.numpy()[1] == 0
    assert x.grad.numpy()[2] == F32(2.0**-24)
    # The census saw it before the rounding.
    assert census.end_iteration() == CensusCounts(nonzero=5, flushed=1, subnormal=2, overflowed=1)


def test_a_tensor_that_stops_gradient_is_rounded_and_not_hooked():
    census = UnderflowCensus()
    rounded = round_through_float16(paddle.to_tensor([1 / 3]), census)
    assert rounded.stop_gradient
    assert rounded.numpy()[0] == numpy_float16([1 / 3])[0] != F32(1 / 3)
    assert census.end_iteration() == CensusCounts()


def test_a_skipped_iteration_is_discarded_and_a_kept_one_added():
    census = UnderflowCensus(by_label=True)
    census.observe(paddle.to_tensor([2.0**-30, 1.0]), "a")
    first = census.end_iteration(skipped=True)
    assert first == CensusCounts(nonzero=2, flushed=1)
    assert census.kept == CensusCounts() and census.kept_by_label == {}
    assert census.last_by_label == {"a": first}
    census.observe(paddle.to_tensor([2.0**-20, 1.0]), "a")
    census.observe(paddle.to_tensor([70000.0]), "b")
    census.end_iteration()
    census.observe(paddle.to_tensor([2.0**-30]), "b")
    census.end_iteration()
    assert (census.kept_iterations, census.discarded_iterations) == (2, 1)
    assert census.kept == CensusCounts(nonzero=4, flushed=1, subnormal=1, overflowed=1)
    assert census.kept_by_label == {
        "a": CensusCounts(nonzero=2, subnormal=1),
        "b": CensusCounts(nonzero=2, flushed=1, overflowed=1),
    }
    assert census.kept.flushed_fraction == 0.25 and census.kept.subnormal_fraction == 0.25
    assert CensusCounts().flushed_fraction == 0.0


def test_exponents_count_the_nonzero_elements_by_binade():
    census = UnderflowCensus(exponents=True)
    tiny = np.array([1e-40], dtype=F32)  # a float32 subnormal: biased exponent 0
    values = np.concatenate([[1.0, 1.5, -1.75, 2.0, 0.0, np.inf, 2.0**-126], tiny]).astype(F32)
    census.observe(paddle.to_tensor(values))
    census.end_iteration()
    expected = np.zeros(256, dtype=np.int64)
    expected[[127, 128, 1, 0]] = [3, 1, 1, 1]
    np.testing.assert_array_equal(census.last_exponents, expected)
    assert census.last_amax == 2.0
    census.end_iteration()
    assert not census.last_exponents.any() and census.last_amax == 0.0


def test_a_linear_layer_rounds_all_four_as_numpy_says():
    paddle.seed(0)
    layer = paddle.nn.Linear(3, 2)
    weight = np.array([[0.1, 1 / 3], [2.0, -0.7], [1e-3, 0.5]], dtype=F32)
    bias = np.array([1 / 7, -3.3], dtype=F32)
    layer.weight.set_value(weight)
    layer.bias.set_value(bias)
    census = UnderflowCensus(by_label=True)
    handles = round_linear_layers(layer, census)
    inputs = np.array([[0.3, -1.1, 2.2], [1 / 9, 4.0, -0.01]], dtype=F32)
    x = paddle.to_tensor(inputs, stop_gradient=False)
    output = layer(x)
    expected = numpy_float16(numpy_float16(inputs) @ numpy_float16(weight) + numpy_float16(bias))
    np.testing.assert_allclose(output.numpy(), expected, rtol=1e-3)
    assert np.array_equal(output.numpy(), numpy_float16(output.numpy()))

    # Upstream gradients at float16's edges: one overflows, one flushes, one is subnormal.
    upstream = np.array([[1e5, 2.0**-26], [2.0**-20, 0.5]], dtype=F32)
    (output * paddle.to_tensor(upstream)).sum().backward()
    g = numpy_float16(upstream)
    w, xr = numpy_float16(weight), numpy_float16(inputs)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(x.grad.numpy(), numpy_float16(g @ w.T))
        np.testing.assert_array_equal(layer.weight.grad.numpy(), numpy_float16(xr.T @ g))
    np.testing.assert_array_equal(layer.bias.grad.numpy(), numpy_float16(g.sum(axis=0)))
    assert np.isinf(layer.weight.grad.numpy()).any()

    name = layer.full_name()
    seen = census.end_iteration()
    # The backward pass reaches the output first; the other three in Paddle's order.
    labels = list(census.last_by_label)
    assert labels[0] == f"{name}.output"
    assert sorted(labels[1:]) == [f"{name}.{part}" for part in ("bias", "input", "weight")]
    assert census.last_by_label[f"{name}.output"] == count_float16_range(upstream)
    assert census.last_by_label[f"{name}.output"] == CensusCounts(4, 1, 1, 1)
    assert seen.overflowed >= 1 and seen.flushed >= 1

    for handle in handles:
        handle.remove()
    np.testing.assert_allclose(layer(x).numpy(), inputs @ weight + bias, rtol=1e-6)
    assert not np.array_equal(layer(x).numpy(), output.numpy())


def test_a_linear_layer_without_bias_and_a_model_of_several():
    paddle.seed(1)
    model = paddle.nn.Sequential(
        paddle.nn.Linear(4, 8, bias_attr=False), paddle.nn.ReLU(), paddle.nn.Linear(8, 2)
    )
    census = UnderflowCensus(by_label=True)
    assert len(round_linear_layers(model, census)) == 2
    # A loss so small that float16 flushes part of each gradient.
    (model(paddle.randn([16, 4])).sum() * 2.0**-22).backward()
    census.end_iteration()
    # Labelled by each layer's path in the model; the data needs no gradient.
    assert set(census.kept_by_label) == {
        "0.weight",
        "0.output",
        "2.input",
        "2.weight",
        "2.bias",
        "2.output",
    }
    assert census.kept.flushed > 0
    # The parameters' gradients are float16 values: every one survives the round trip.
    for param in model.parameters():
        grad = param.grad.numpy()
        np.testing.assert_array_equal(grad, numpy_float16(grad))


def test_round_linear_layers_wants_a_layer():
    with pytest.raises(TypeError, match="paddle.nn.Layer"):
        round_linear_layers(lambda x: x)


def float16_rounding_values():
    """Every boundary above, both signs, ties at every binade, and random magnitudes
    from far below float16's floor to beyond its ceiling."""
    generator = np.random.default_rng(0)
    binades = 2.0 ** np.arange(-24, 16, dtype=np.float64)
    ties = np.concatenate([binades * (1 + k * 2.0**-11) for k in (1, 3, 5, 2045, 2047)])
    ties = ties[ties < 65536]
    random = np.exp2(generator.uniform(-30, 17, 20000)) * generator.uniform(1, 2, 20000)
    magnitudes = np.concatenate([[value for value, _ in KNOWN], ties, random, [0.0, np.inf]])
    magnitudes = magnitudes.astype(F32)
    return np.concatenate([magnitudes, -magnitudes, [np.nan]]).astype(F32)


@pytest.mark.parametrize("cast", ["Paddle's cast", "float arithmetic"])
def test_rounding_is_float16s_by_either_route_in_both_passes(cast, monkeypatch):
    # Paddle 2.6's CPU cast truncates, so there the emulation rounds in float arithmetic;
    # held to NumPy's float16 on every Paddle, that route too.
    if cast == "float arithmetic":
        monkeypatch.setattr(testing, "_cast_rounds_to_nearest", lambda: False)
    elif not testing._cast_rounds_to_nearest():
        pytest.skip("this Paddle's cast to float16 truncates on a CPU (Paddle 2.6)")
    values = float16_rounding_values()
    x = paddle.to_tensor(values, stop_gradient=False)
    rounded = round_through_float16(x)
    np.testing.assert_array_equal(rounded.numpy(), numpy_float16(values))
    (rounded * paddle.to_tensor(values)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), numpy_float16(values))
