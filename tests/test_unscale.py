"""The scaler's unscale-and-check gives the bits and the verdict of Paddle's kernel, over
dtypes, empty tensors and missing gradients grouped as the kernel takes them."""

import numpy as np
import paddle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from paddle import _C_ops

from paddle_amp_scaler.core import kernels


def paddle_kernel(arrays, scale, dtype):
    grads = [paddle.to_tensor(a) for a in arrays]
    # Paddle 2.6's kernel refuses empty tensors; there is nothing in them to compute.
    nonempty = [g for g in grads if g.size]
    if not nonempty:
        return [g.numpy() for g in grads], False
    found = _C_ops.check_finite_and_unscale_(nonempty, paddle.to_tensor([scale], dtype=dtype))[1]
    return [g.numpy() for g in grads], bool(found.numpy()[0])


def through_the_scaler(arrays, scale):
    # A missing gradient (None) among them, as a parameter without one gives.
    grads = [paddle.to_tensor(a) for a in arrays]
    groups = kernels.grads_by_dtype_of([None, *grads])
    found = kernels.unscale_and_check_(
        groups, paddle.to_tensor([scale], dtype="float32"), paddle.to_tensor([False])
    )
    return [g.numpy() for g in grads], bool(found.numpy()[0])


def assert_same_as_paddle(arrays, scale, dtype):
    expected, expected_found = paddle_kernel(arrays, scale, dtype)
    got, found = through_the_scaler(arrays, scale)
    assert found == expected_found
    if not found:
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


EDGE_CASES = {
    "signed zeros and subnormals": [np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40], "float32")],
    "finite values whose sum overflows": [np.full(1000, 3e38, "float32")],
    "largest finite": [np.array([3.4028235e38, -3.4028235e38], "float32")],
    "inf alone": [np.array([1.0, np.inf], "float32")],
    "minus inf in a later tensor": [np.ones(5, "float32"), np.array([-np.inf], "float32")],
    "nan in a big tensor": [
        np.where(np.arange(200_000) == 123_457 % 200_000, np.nan, 1.0).astype("float32")
    ],
    "empty tensor": [np.zeros(0, "float32"), np.ones(3, "float32")],
    "float64 values": [np.array([1e300, -1e-300, 5e-324], "float64")],
    "float64 inf": [np.array([1.0, np.inf], "float64")],
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("scale", [1.0, 2.0**15, 3.0, 0.5])
def test_edge_cases_match_paddles_kernel(case, scale):
    arrays = EDGE_CASES[case]
    assert_same_as_paddle(arrays, scale, arrays[0].dtype.name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrays=st.lists(
        hnp.arrays(
            "float32",
            st.integers(0, 300),
            elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
        ),
        min_size=1,
        max_size=4,
    ),
    scale=st.sampled_from([1.0, 2.0**-3, 2.0**10, 7.0, 1e30]),
)
def test_random_gradients_match_paddles_kernel(arrays, scale):
    assert_same_as_paddle(arrays, scale, "float32")


def parameters_with_grads(shapes_and_dtypes):
    params = [paddle.create_parameter(shape, dtype) for shape, dtype in shapes_and_dtypes]
    for index, param in enumerate(params):
        (param * (index + 1.0)).sum().backward()
    return params


def groups_as_arrays(groups):
    return {str(dtype): [grad.numpy() for grad in group] for dtype, group in groups.items()}


PLAIN = [([3, 2], "float32"), ([4], "float32"), ([5], "float32")]
if kernels.TAKES_EMPTY:  # Paddle 2.6 makes no parameter without elements
    PLAIN.insert(2, ([0, 2], "float32"))


@pytest.mark.parametrize(
    "change",
    ["none", "frozen with a gradient", "no gradient", "float64", "master gradient"],
)
def test_grads_by_dtype_groups_the_gradients_of_each_parameter(change):
    # One C++ call groups them where it can; each case it cannot must fall back to the
    # loop over grads_of, whose groups are the reference.
    from paddle_amp_scaler.core import optimizers

    specs = [*PLAIN, ([2], "float64")] if change == "float64" else PLAIN
    params = parameters_with_grads(specs)
    if change == "frozen with a gradient":
        params[1].stop_gradient = True
    elif change == "no gradient":
        params.append(paddle.create_parameter([2], "float32"))
    elif change == "master gradient":
        params[0].main_grad = paddle.full([3, 2], 7.0)
    expected = kernels.grads_by_dtype_of(optimizers.grads_of(params))
    got, mesh = optimizers.grads_by_dtype(params)
    assert mesh is None  # no dist tensor among them
    assert list(got) == list(expected)
    for dtype in expected:
        assert [g.numpy().tolist() for g in got[dtype]] == [
            g.numpy().tolist() for g in expected[dtype]
        ]
    # The groups are the gradients themselves: the unscale writes what the optimizer reads.
    before = [None if g is None else g.numpy() for g in optimizers.grads_of(params)]
    kernels.unscale_and_check_(got, paddle.to_tensor([2.0]), paddle.to_tensor([False]))
    after = [None if g is None else g.numpy() for g in optimizers.grads_of(params)]
    for old, new in zip(before, after):
        assert (old is None and new is None) or np.array_equal(new, old / 2)
