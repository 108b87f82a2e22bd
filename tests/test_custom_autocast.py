"""custom_fwd / custom_bwd: the autocast mode a PyLayer's backward runs under, and cast_inputs.

Paddle's ``auto_cast`` refuses to enable on a CPU place. The ``amp_on_cpu`` fixture makes
it enable by showing only the ``paddle.amp.auto_cast`` module a tracer whose expected
place claims to be a GPU; the real tracer keeps its CPU place, so kernels still run on
the CPU (where Paddle computes every autocast op in float32). The tests therefore observe
autocast by reading the tracer's state from inside forward and backward, and observe
``cast_inputs`` through the dtypes forward receives.
"""

import collections
import contextlib
import importlib
import warnings

import numpy as np
import paddle
import pytest
from paddle.base import core
from paddle.base.framework import _dygraph_tracer

from paddle_amp_scaler import custom_bwd, custom_fwd

O0, O1, O2 = core.AmpLevel.O0, core.AmpLevel.O1, core.AmpLevel.O2
PADDLE_3 = int(paddle.__version__.split(".")[0]) >= 3


# --- making auto_cast enable on a CPU-only machine -----------------------------------------


class _PlaceClaimingGpu:
    """A place that says it is a GPU; everything else is the real place's."""

    def __init__(self, real):
        self._real = real

    def is_gpu_place(self):
        return True

    def is_xpu_place(self):
        return False

    def is_custom_place(self):
        return False

    def __getattr__(self, name):
        return getattr(self._real, name)


class _TracerOnClaimedGpu:
    """The real tracer, read and written through, except that its place claims a GPU."""

    def __init__(self, tracer):
        object.__setattr__(self, "_tracer", tracer)

    def __getattr__(self, name):
        value = getattr(self._tracer, name)
        return _PlaceClaimingGpu(value) if name == "_expected_place" else value

    def __setattr__(self, name, value):
        setattr(self._tracer, name, value)


@pytest.fixture
def amp_on_cpu(monkeypatch):
    # `paddle.amp.auto_cast` is the function; the module holding the place check is this:
    module = importlib.import_module("paddle.amp.auto_cast")
    real_tracer = module._dygraph_tracer

    def tracer():
        found = real_tracer()
        return None if found is None else _TracerOnClaimedGpu(found)

    monkeypatch.setattr(module, "_dygraph_tracer", tracer)
    monkeypatch.setattr(module, "_is_gpu_float16_supported", lambda: True)
    monkeypatch.setattr(module, "_is_gpu_bfloat16_supported", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "amp_guard can only be enabled on ..." warning
        with paddle.amp.auto_cast(level="O2", dtype="bfloat16"):
            assert (tracer_state()["level"], tracer_state()["dtype"]) == (O2, "bfloat16")
    assert _dygraph_tracer()._expected_place.is_cpu_place()


@pytest.fixture(autouse=True)
def _tracer_state_comes_back():
    # A failing test must not leave autocast switched on for the next one.
    tracer = _dygraph_tracer()
    level, dtype, promote = tracer._amp_level, tracer._amp_dtype, tracer._use_promote
    white, black = tracer._get_amp_op_list()
    white, black = set(white), set(black)
    yield
    tracer._amp_level, tracer._amp_dtype, tracer._use_promote = level, dtype, promote
    tracer._set_amp_op_list(white, black)


# --- helpers ---------------------------------------------------------------------------------


def tracer_state():
    """Everything Paddle's autocast is, read straight from the dygraph tracer."""
    tracer = _dygraph_tracer()
    white, black = tracer._get_amp_op_list()
    return {
        "level": tracer._amp_level,
        "dtype": tracer._amp_dtype,
        "white": frozenset(white),
        "black": frozenset(black),
        "promote": tracer._use_promote,
    }


def dtype_of(tensor):
    return str(tensor.dtype).replace("paddle.", "")


def tensor(values, dtype="float32", grad=True):
    """A leaf tensor of ``dtype``; it gets a gradient when ``grad``."""
    leaf = paddle.to_tensor(np.array(values, dtype="float32")).astype(dtype)
    leaf.stop_gradient = not grad
    return leaf


def numpy32(value):
    return value.astype("float32").numpy()


# Exactly representable in bfloat16, and so are their pairwise and triple products.
X = [1.5, -2.0, 3.0]
Y = [4.0, 0.5, -1.25]
H = [0.5, 2.0, -1.0]
W = [1.0, 2.0, -3.0]  # the upstream gradient, so that no gradient is trivially ones


def record_and_multiply(decorate_forward=custom_fwd, decorate_backward=custom_bwd):
    """A PyLayer computing x * y that records, in ``seen``, the autocast mode of both passes."""
    seen = {}

    class Multiply(paddle.autograd.PyLayer):
        @staticmethod
        @decorate_forward
        def forward(ctx, x, y):
            seen["forward"] = tracer_state()
            seen["forward dtypes"] = (dtype_of(x), dtype_of(y))
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        @decorate_backward
        def backward(ctx, grad):
            seen["backward"] = tracer_state()
            x, y = ctx.saved_tensor()
            return grad * y, grad * x

    return Multiply, seen


def backward_of(out, weights=W):
    """``sum(out * weights)``'s backward, so out's gradient is ``weights``."""
    (out.astype("float32") * tensor(weights, grad=False)).sum().backward()


def assert_product_gradients(x, y, h):
    """Gradients of ``sum(x * y * h * W)``: analytic values, each in its input's dtype."""
    assert (dtype_of(x.grad), dtype_of(y.grad), dtype_of(h.grad)) == (
        "float32",
        "float32",
        "float16",
    )
    x_, y_, h_, w_ = (np.array(v) for v in (X, Y, H, W))
    np.testing.assert_allclose(numpy32(x.grad), w_ * y_ * h_, rtol=1e-2)
    np.testing.assert_allclose(numpy32(y.grad), w_ * x_ * h_, rtol=1e-2)
    np.testing.assert_allclose(numpy32(h.grad), w_ * x_ * y_, rtol=1e-2)


def no_decoration(function):
    return function


# --- 1, 2: custom_fwd records, custom_bwd restores ---------------------------------------


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_backward_outside_autocast_runs_under_forwards_autocast(amp_on_cpu, level):
    before = tracer_state()
    Multiply, seen = record_and_multiply()
    x, y = tensor(X), tensor(Y)
    with paddle.amp.auto_cast(
        level=level,
        dtype="bfloat16",
        custom_white_list={"exp"},
        custom_black_list={"tanh"},
        use_promote=False,
    ):
        expected = tracer_state()
        out = Multiply.apply(x, y)
        assert tracer_state() == expected
    # The autocast this test asked for, read without the code under test:
    assert expected["level"] == getattr(core.AmpLevel, level)
    assert expected["dtype"] == "bfloat16"
    assert "exp" in expected["white"] and "tanh" in expected["black"]
    assert tracer_state() == before and before["level"] == O0 and before["dtype"] == "float32"

    backward_of(out)

    assert seen["forward"] == expected
    assert seen["backward"] == expected
    assert tracer_state() == before
    np.testing.assert_allclose(x.grad.numpy(), np.multiply(W, Y))
    np.testing.assert_allclose(y.grad.numpy(), np.multiply(W, X))
    assert dtype_of(x.grad) == dtype_of(y.grad) == "float32"


def test_without_the_decorators_backward_runs_under_no_autocast(amp_on_cpu):
    Multiply, seen = record_and_multiply(no_decoration, no_decoration)
    with paddle.amp.auto_cast(level="O2", dtype="bfloat16", custom_white_list={"exp"}):
        out = Multiply.apply(tensor(X), tensor(Y))
    backward_of(out)
    assert (seen["forward"]["level"], seen["forward"]["dtype"]) == (O2, "bfloat16")
    assert (seen["backward"]["level"], seen["backward"]["dtype"]) == (O0, "float32")
    assert "exp" not in seen["backward"]["white"]


def test_forward_outside_autocast_backward_inside_runs_backward_without_autocast(amp_on_cpu):
    Multiply, seen = record_and_multiply()
    x, y = tensor(X), tensor(Y)
    expected = tracer_state()
    out = Multiply.apply(x, y)
    with paddle.amp.auto_cast(level="O2", dtype="float16", custom_white_list={"exp"}):
        inside = tracer_state()
        backward_of(out)
        assert tracer_state() == inside  # backward's state came back to the caller's
    assert (inside["level"], inside["dtype"]) == (O2, "float16") and "exp" in inside["white"]
    assert (expected["level"], expected["dtype"]) == (O0, "float32")
    assert seen["forward"] == expected
    assert seen["backward"] == expected
    assert tracer_state() == expected
    np.testing.assert_allclose(x.grad.numpy(), np.multiply(W, Y))


def test_contrast_without_the_decorators_backward_takes_the_callers_autocast(amp_on_cpu):
    Multiply, seen = record_and_multiply(no_decoration, no_decoration)
    out = Multiply.apply(tensor(X), tensor(Y))
    with paddle.amp.auto_cast(level="O2", dtype="float16"):
        backward_of(out)
    assert (seen["backward"]["level"], seen["backward"]["dtype"]) == (O2, "float16")


# --- 3: the spellings of custom_fwd ------------------------------------------------------------


@pytest.mark.parametrize(
    "decorator",
    [
        custom_fwd,
        custom_fwd(),
        custom_fwd(cast_inputs=None),
        custom_fwd(device_type="cuda"),
        custom_fwd(device_type="cpu", cast_inputs=None),
    ],
    ids=["bare", "called", "cast_inputs=None", "device_type=cuda", "device_type=cpu"],
)
def test_every_spelling_of_custom_fwd_records_without_casting(amp_on_cpu, decorator):
    Multiply, seen = record_and_multiply(decorator)
    x, y = tensor(X), tensor(Y)
    with paddle.amp.auto_cast(level="O1", dtype="bfloat16", custom_white_list={"exp"}):
        expected = tracer_state()
        out = Multiply.apply(x, y)
    backward_of(out)
    assert expected["level"] == O1 and "exp" in expected["white"]
    assert seen["forward dtypes"] == ("float32", "float32")
    assert seen["forward"] == seen["backward"] == expected
    assert dtype_of(out) == "float32"  # CPU autocast computes in float32; nothing was cast
    np.testing.assert_allclose(x.grad.numpy(), np.multiply(W, Y))
    np.testing.assert_allclose(y.grad.numpy(), np.multiply(W, X))


def test_forward_keeps_its_name_and_docstring():
    def forward(ctx, x):
        """Forward's docstring."""
        return x

    for decorated in (custom_fwd(forward), custom_fwd(cast_inputs=paddle.float16)(forward)):
        assert decorated.__name__ == "forward" and decorated.__doc__ == "Forward's docstring."
    assert custom_bwd(forward).__name__ == "forward"


# --- 4, 5: cast_inputs ---------------------------------------------------------------------------


def casting_layer(cast_inputs):
    """A PyLayer of x * y * h that records what its forward and backward see.

    It also takes a float64 and an int64 tensor, which it only records.
    """
    seen = {}

    class Product(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(cast_inputs=cast_inputs)
        def forward(ctx, x, y, h, d64, i64):
            seen["forward"] = tracer_state()
            seen["forward dtypes"] = tuple(dtype_of(t) for t in (x, y, h, d64, i64))
            seen["float64 values"] = d64.numpy()
            seen["int64 values"] = i64.numpy()
            ctx.save_for_backward(x, y, h)
            return x * y * h

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            seen["backward"] = tracer_state()
            seen["grad dtype"] = dtype_of(grad)
            x, y, h = ctx.saved_tensor()
            return grad * y * h, grad * x * h, grad * x * y, None, None

    return Product, seen


def float64_and_int64():
    return (
        paddle.to_tensor([0.1, 0.2, 0.3], dtype="float64"),
        paddle.to_tensor([7, 8, 9], dtype="int64"),
    )


@pytest.mark.parametrize("backward_inside", [False, True], ids=["backward-outside", "inside"])
@pytest.mark.parametrize("cast_inputs", [paddle.bfloat16, "bfloat16"])
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_cast_inputs_inside_autocast_casts_and_runs_both_passes_without_autocast(
    amp_on_cpu, level, cast_inputs, backward_inside
):
    Product, seen = casting_layer(cast_inputs)
    x, y, h = tensor(X), tensor(Y), tensor(H, "float16")
    d64, i64 = float64_and_int64()
    # float16 autocast, so that bfloat16 inside forward can only come from cast_inputs
    with paddle.amp.auto_cast(level=level, dtype="float16", custom_white_list={"exp"}):
        inside = tracer_state()
        out = Product.apply(x, y, h, d64, i64)
        assert tracer_state() == inside  # forward's autocast-off came back to the caller's
        with (
            paddle.amp.auto_cast(level="O2", dtype="float16")
            if backward_inside
            else (contextlib.nullcontext())
        ):
            backward_of(out)
    assert (inside["level"], inside["dtype"]) == (getattr(core.AmpLevel, level), "float16")

    assert seen["forward dtypes"] == ("bfloat16", "bfloat16", "bfloat16", "float64", "int64")
    np.testing.assert_array_equal(seen["float64 values"], [0.1, 0.2, 0.3])
    np.testing.assert_array_equal(seen["int64 values"], [7, 8, 9])
    assert (seen["forward"]["level"], seen["forward"]["dtype"]) == (O0, "float32")
    assert (seen["backward"]["level"], seen["backward"]["dtype"]) == (O0, "float32")
    assert dtype_of(out) == "bfloat16"
    assert seen["grad dtype"] == "bfloat16"
    # Each gradient has its input's dtype, and the values d(x*y*h) by hand:
    x_, y_, h_, w_ = (np.array(v, dtype="float64") for v in (X, Y, H, W))
    assert (dtype_of(x.grad), dtype_of(y.grad), dtype_of(h.grad)) == (
        "float32",
        "float32",
        "float16",
    )
    np.testing.assert_allclose(numpy32(x.grad), w_ * y_ * h_, rtol=1e-2)
    np.testing.assert_allclose(numpy32(y.grad), w_ * x_ * h_, rtol=1e-2)
    np.testing.assert_allclose(numpy32(h.grad), w_ * x_ * y_, rtol=1e-2)
    assert d64.grad is None and i64.grad is None


def test_cast_inputs_float16_with_a_sum_body(amp_on_cpu):
    # float16 has a CPU sum kernel (and its backward goes through scale), no multiply.
    seen = {}

    class Total(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(cast_inputs=paddle.float16)
        def forward(ctx, x):
            seen["forward"] = (dtype_of(x), tracer_state()["level"])
            ctx.shape = x.shape
            return paddle.sum(x)

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            seen["backward"] = (dtype_of(grad), tracer_state()["level"])
            return paddle.scale(paddle.ones(ctx.shape, dtype="float16"), 3.0) * 1

    x = tensor(X)
    with paddle.amp.auto_cast(dtype="float16"):
        out = Total.apply(x)
    out.astype("float32").backward()
    assert seen["forward"] == ("float16", O0) and dtype_of(out) == "float16"
    assert seen["backward"] == ("float16", O0)
    assert dtype_of(x.grad) == "float32"
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0, 3.0])
    np.testing.assert_allclose(float(out.astype("float32")), sum(X))


def test_cast_inputs_gives_keyword_tensors_their_gradients_in_their_dtypes(amp_on_cpu):
    # Paddle hands backward's results to positional tensors, then to keyword tensors in
    # the order of the call: here x, z, y.
    seen = {}

    class Product(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(cast_inputs=paddle.bfloat16)
        def forward(ctx, x, y, z):
            seen["dtypes"] = (dtype_of(x), dtype_of(y), dtype_of(z))
            ctx.save_for_backward(x, y, z)
            return x * y * z

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            x, y, z = ctx.saved_tensor()
            return grad * y * z, grad * x * y, grad * x * z

    x, y, z = tensor(X), tensor(Y), tensor(H, "float16")
    with paddle.amp.auto_cast(dtype="float16"):
        out = Product.apply(x, z=z, y=y)
    backward_of(out)
    assert seen["dtypes"] == ("bfloat16", "bfloat16", "bfloat16")
    assert_product_gradients(x, y, z)


@pytest.mark.parametrize(
    ("cast_inputs", "cast_to", "y_dtype"),
    [
        # PyTorch's usual use: a layer that must run in float32 inside float16 autocast.
        (paddle.float32, "float32", "float16"),
        # Any floating dtype, as in PyTorch: a layer that must run in double precision.
        (paddle.float64, "float64", "float32"),
        ("float64", "float64", "float32"),
        ("double", "float64", "float32"),
        (np.float64, "float64", "float32"),
    ],
    ids=["float32", "float64", "'float64'", "'double'", "np.float64"],
)
def test_cast_inputs_lifts_inputs_and_gives_gradients_in_their_dtypes(
    amp_on_cpu, cast_inputs, cast_to, y_dtype
):
    Multiply, seen = record_and_multiply(custom_fwd(cast_inputs=cast_inputs))
    x, y = tensor(X, "float16"), tensor(Y, y_dtype)
    with paddle.amp.auto_cast(level="O2", dtype="float16"):
        out = Multiply.apply(x, y)
    backward_of(out)
    assert seen["forward dtypes"] == (cast_to, cast_to)
    assert seen["forward"]["level"] == seen["backward"]["level"] == O0
    assert dtype_of(out) == cast_to
    assert (dtype_of(x.grad), dtype_of(y.grad)) == ("float16", y_dtype)
    np.testing.assert_allclose(numpy32(x.grad), np.multiply(W, Y), rtol=1e-3)
    np.testing.assert_allclose(numpy32(y.grad), np.multiply(W, X), rtol=1e-3)


def test_cast_inputs_gives_a_float64_input_a_float64_gradient(amp_on_cpu):
    # float64 is not cast, but backward may compute its gradient in bfloat16.
    seen = {}

    class Product(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(cast_inputs=paddle.bfloat16)
        def forward(ctx, x, d):
            seen["dtypes"] = (dtype_of(x), dtype_of(d))
            ctx.save_for_backward(x, d)
            return x * d.astype("bfloat16")

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            x, d = ctx.saved_tensor()
            return grad * d.astype("bfloat16"), grad * x

    x, d = tensor(X), tensor(Y, "float64")
    with paddle.amp.auto_cast(dtype="bfloat16"):
        out = Product.apply(x, d)
    backward_of(out)
    assert seen["dtypes"] == ("bfloat16", "float64")
    assert (dtype_of(x.grad), dtype_of(d.grad)) == ("float32", "float64")
    np.testing.assert_allclose(x.grad.numpy(), np.multiply(W, Y), rtol=1e-2)
    np.testing.assert_allclose(d.grad.numpy(), np.multiply(W, X), rtol=1e-2)


def refused_on_cpu():
    # Paddle's own auto_cast on this CPU machine, without the fixture: it stays off.
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(paddle.amp.auto_cast(dtype="bfloat16"))
    return stack


@pytest.mark.parametrize(
    "outside",
    [
        contextlib.nullcontext,
        lambda: paddle.amp.auto_cast(enable=False, dtype="bfloat16"),
        lambda: paddle.amp.auto_cast(level="O0", dtype="bfloat16"),
        refused_on_cpu,
    ],
    ids=["no-auto_cast", "enable=False", "level=O0", "refused-on-cpu"],
)
def test_cast_inputs_outside_autocast_casts_nothing(outside, request):
    if outside is not refused_on_cpu:
        request.getfixturevalue("amp_on_cpu")
    Multiply, seen = record_and_multiply(custom_fwd(cast_inputs=paddle.bfloat16))
    x, y = tensor(X), tensor(Y)
    with outside():
        expected = tracer_state()
        out = Multiply.apply(x, y)
    # (level O0 with dtype bfloat16 is what Paddle itself sets for auto_cast(level="O0"))
    assert expected["level"] == O0
    if outside is not refused_on_cpu:
        # backward under an enabled autocast still runs under forward's, off
        with paddle.amp.auto_cast(level="O2", dtype="bfloat16"):
            backward_of(out)
    else:
        backward_of(out)
    assert seen["forward dtypes"] == ("float32", "float32")
    assert dtype_of(out) == "float32"
    assert seen["forward"] == seen["backward"] == expected
    assert dtype_of(x.grad) == "float32"
    np.testing.assert_allclose(x.grad.numpy(), np.multiply(W, Y))
    np.testing.assert_allclose(y.grad.numpy(), np.multiply(W, X))


# --- 6: tensors inside lists, tuples and dicts ---------------------------------------------

Pair = collections.namedtuple("Pair", ["first", "second"])


def describe(value):
    """The structure of ``value`` with each Tensor replaced by its dtype's name."""
    if isinstance(value, paddle.Tensor):
        return dtype_of(value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [describe(item) for item in value])
    if isinstance(value, dict):
        return ("dict", {key: describe(item) for key, item in value.items()})
    return value


@pytest.mark.parametrize("inside_autocast", [True, False], ids=["inside", "outside"])
def test_cast_inputs_casts_floating_tensors_inside_lists_tuples_and_dicts(
    amp_on_cpu, inside_autocast
):
    seen = {}

    class Doubled(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(cast_inputs=paddle.bfloat16)
        def forward(ctx, x, sequence, mapping):
            seen["x"] = dtype_of(x)
            seen["sequence"] = describe(sequence)
            seen["mapping"] = describe(mapping)
            seen["values"] = (numpy32(sequence[0]), numpy32(mapping["inner"]["t"]))
            return x * 2.0

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            return grad * 2.0, None

    x = tensor(X)
    a32, h16 = tensor(X, grad=False), tensor(H, "float16", grad=False)
    d64, i64 = float64_and_int64()
    sequence = [a32, h16, d64, i64, "text", 7]
    mapping = {
        "a": a32,
        "i": i64,
        "inner": {"t": a32, "d": d64},
        "tuple": (h16, None),
        "pair": Pair(a32, i64),
        "list": [d64, h16],
    }
    with paddle.amp.auto_cast(dtype="float16") if inside_autocast else contextlib.nullcontext():
        out = Doubled.apply(x, sequence, mapping)
    backward_of(out)

    f32, f16 = ("bfloat16", "bfloat16") if inside_autocast else ("float32", "float16")
    assert seen["x"] == f32
    assert seen["sequence"] == ("list", [f32, f16, "float64", "int64", "text", 7])
    assert seen["mapping"] == (
        "dict",
        {
            "a": f32,
            "i": "int64",
            "inner": ("dict", {"t": f32, "d": "float64"}),
            "tuple": ("tuple", [f16, None]),
            "pair": ("Pair", [f32, "int64"]),
            "list": ("list", ["float64", f16]),
        },
    )
    np.testing.assert_allclose(seen["values"][0], X)
    np.testing.assert_allclose(seen["values"][1], X)
    # The caller's containers are the caller's, unchanged.
    assert sequence[0] is a32 and mapping["inner"]["t"] is a32 and dtype_of(a32) == "float32"
    assert describe(sequence) == ("list", ["float32", "float16", "float64", "int64", "text", 7])
    assert dtype_of(x.grad) == "float32"
    np.testing.assert_allclose(x.grad.numpy(), np.multiply(W, 2.0))


@pytest.mark.skipif(not PADDLE_3, reason="Paddle 2.6 misroutes gradients of tensors in lists")
def test_cast_inputs_gives_tensors_in_a_list_their_gradients_in_their_dtypes(amp_on_cpu):
    # A list is one gradient slot in Paddle 3, for which backward returns a list.
    seen = {}

    class Product(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(cast_inputs=paddle.bfloat16)
        def forward(ctx, x, pair):
            seen["dtypes"] = describe(pair)
            ctx.save_for_backward(x, *pair)
            return x * pair[0] * pair[1]

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            x, y, h = ctx.saved_tensor()
            return grad * y * h, [grad * x * h, grad * x * y]

    x, y, h = tensor(X), tensor(Y), tensor(H, "float16")
    with paddle.amp.auto_cast(dtype="float16"):
        out = Product.apply(x, [y, h])
    backward_of(out)
    assert seen["dtypes"] == ("list", ["bfloat16", "bfloat16"])
    assert_product_gradients(x, y, h)


# --- 7: custom_bwd without custom_fwd ---------------------------------------------------------


def test_custom_bwd_without_custom_fwd_says_to_add_custom_fwd(amp_on_cpu):
    class Undecorated(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            return grad * 2.0

    class Context:
        pass

    with pytest.raises(RuntimeError, match="custom_fwd"):
        Undecorated.backward(Context(), tensor(X))

    with paddle.amp.auto_cast(level="O2", dtype="bfloat16"):
        out = Undecorated.apply(tensor(X))
    before = tracer_state()
    # Paddle re-raises what a PyLayer's backward raises as its own error type.
    with pytest.raises(Exception, match="add @custom_fwd"):
        out.sum().backward()
    assert tracer_state() == before


# --- 8: argument errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cast_inputs",
    [paddle.int32, paddle.int64, "int8", "uint16", "fp16", "complex64", 3, True, paddle.bool],
    ids=str,
)
def test_cast_inputs_must_be_a_floating_dtype(cast_inputs):
    with pytest.raises(ValueError, match="cast_inputs"):
        custom_fwd(cast_inputs=cast_inputs)

    def forward(ctx, x):
        return x

    with pytest.raises(ValueError, match="cast_inputs"):
        custom_fwd(forward, cast_inputs=cast_inputs)


@pytest.mark.parametrize(
    "cast_inputs", [paddle.float16, paddle.bfloat16, paddle.float32, "float16", "float32"]
)
def test_floating_cast_inputs_are_accepted(cast_inputs):
    assert callable(custom_fwd(cast_inputs=cast_inputs))


@pytest.mark.parametrize("not_a_function", [42, "forward"])
def test_decorating_a_non_callable_is_a_type_error(not_a_function):
    with pytest.raises(TypeError, match="custom_fwd"):
        custom_fwd(not_a_function)
    with pytest.raises(TypeError, match="custom_bwd"):
        custom_bwd(not_a_function)


def test_called_forms_with_pytorchs_device_type():
    # torch.amp writes @custom_fwd(device_type="cuda") and @custom_bwd(device_type="cuda").
    class Doubled(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(device_type="cuda")
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        @custom_bwd(device_type="cuda")
        def backward(ctx, grad):
            return grad * 2.0

    x = tensor(X)
    Doubled.apply(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_each_gradient_gets_its_inputs_dtype_without_cast_inputs():
    # A forward that computes in bfloat16 itself, and a backward returning bfloat16
    # gradients: PyTorch's engine casts them to the inputs' dtypes, Paddle 2.6 does not.
    class Product(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd
        def forward(ctx, x, y):
            x, y = x.astype("bfloat16"), y.astype("bfloat16")
            ctx.save_for_backward(x, y)
            return x * y

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            x, y = ctx.saved_tensor()
            return grad * y, grad * x

    x, y = tensor(X), tensor(Y)
    backward_of(Product.apply(x, y))
    assert (dtype_of(x.grad), dtype_of(y.grad)) == ("float32", "float32")
    np.testing.assert_allclose(x.grad.numpy(), np.multiply(W, Y), rtol=1e-2)
    np.testing.assert_allclose(y.grad.numpy(), np.multiply(W, X), rtol=1e-2)


@pytest.mark.parametrize("device_type", [0, paddle.CPUPlace(), ["gpu"]], ids=str)
def test_device_type_must_be_a_string(device_type):
    with pytest.raises(TypeError, match="device_type"):
        custom_fwd(device_type=device_type)
    with pytest.raises(TypeError, match="device_type"):
        custom_fwd(lambda ctx, x: x, device_type=device_type)


# --- 9: the state comes back when a pass raises ---------------------------------------------


class Boom(Exception):
    pass


@pytest.mark.parametrize("caller", ["no-autocast", "autocast-O1"])
def test_state_comes_back_when_backward_raises(amp_on_cpu, caller):
    seen = {}

    class Failing(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            seen["backward"] = tracer_state()
            raise Boom("backward-failed-on-purpose")

    with paddle.amp.auto_cast(
        level="O2", dtype="bfloat16", custom_white_list={"exp"}, use_promote=False
    ):
        recorded = tracer_state()
        out = Failing.apply(tensor(X))
    calling = (
        paddle.amp.auto_cast(level="O1", dtype="float16", custom_black_list={"tanh"})
        if caller == "autocast-O1"
        else contextlib.nullcontext()
    )
    with calling:
        before = tracer_state()
        with pytest.raises(Exception, match="backward-failed-on-purpose"):
            out.sum().backward()
        assert tracer_state() == before
    assert seen["backward"] == recorded and recorded["level"] == O2
    assert before != recorded


def test_state_comes_back_when_a_casting_forward_raises(amp_on_cpu):
    class Failing(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd(cast_inputs=paddle.bfloat16)
        def forward(ctx, x):
            assert tracer_state()["level"] == O0
            raise Boom("forward-failed-on-purpose")

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            return grad

    with paddle.amp.auto_cast(level="O2", dtype="float16", custom_white_list={"exp"}):
        before = tracer_state()
        with pytest.raises(Boom, match="forward-failed-on-purpose"):
            Failing.apply(tensor(X))
        assert tracer_state() == before
    assert before["level"] == O2


# --- static graphs ----------------------------------------------------------------------------


@pytest.mark.skipif(not PADDLE_3, reason="Paddle 2.6 crashes on a PyLayer under to_static")
def test_decorated_pylayer_works_under_to_static():
    class Doubled(paddle.autograd.PyLayer):
        @staticmethod
        @custom_fwd
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            return grad * 2.0

    @paddle.jit.to_static(full_graph=True)
    def double(x):
        return Doubled.apply(x)

    x = tensor(X)
    out = double(x)
    out.sum().backward()
    np.testing.assert_allclose(out.numpy(), np.multiply(X, 2.0))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 2.0])
