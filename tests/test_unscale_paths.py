"""Every unscale-and-check path gives Paddle's kernel's bits and verdict, and the scaler
keeps all its guarantees on each; the fused kernel's loader falls back safely."""

import math
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from paddle import _C_ops

from paddle_amp_scaler import GradScaler, kernels
from paddle_amp_scaler.core import fused_cpu, unscale_paths

from helpers import GradInjector, batches, make_model, optimizer_state_of, params_of, train_step

PATHS = kernels.unscale_paths()


@pytest.mark.compiled_helper
def test_the_fused_path_is_built_and_chosen_on_cpu():
    # A compiler is part of this project's machines; without one the scaler would
    # still work (Paddle's kernel), but this suite must notice the fused path missing.
    assert PATHS == ["paddle", "fused-cpu"]
    assert kernels.default_unscale_path(paddle.to_tensor([1.0]).place) == "fused-cpu"


def paddle_kernel(arrays, scale, dtype):
    grads = [paddle.to_tensor(a) for a in arrays]
    # Paddle 2.6's kernel refuses empty tensors; there is nothing in them to compute.
    nonempty = [g for g in grads if g.size]
    if not nonempty:
        return [g.numpy() for g in grads], False
    found = _C_ops.check_finite_and_unscale_(nonempty, paddle.to_tensor([scale], dtype=dtype))[1]
    return [g.numpy() for g in grads], bool(found.numpy()[0])


def through_path(path, arrays, scale, dtype):
    grads = [paddle.to_tensor(a) for a in arrays]
    found = (
        unscale_paths.by_name(path)
        .unscale_and_check_(
            grads, paddle.to_tensor([scale], dtype="float32"), paddle.to_tensor([False])
        )
        .flag
    )
    return [g.numpy() for g in grads], bool(found.numpy()[0])


def assert_same_as_paddle(arrays, scale, dtype):
    expected, expected_found = paddle_kernel(arrays, scale, dtype)
    for path in PATHS:
        got, found = through_path(path, arrays, scale, dtype)
        if scale >= 1:
            assert found == expected_found, path
        else:
            # Unscaling by a scale below 1 multiplies: Paddle's kernel checks its input
            # and lets an unscaled value that overflowed through; the fused kernel checks
            # the unscaled values, as API.md defines the verdict.
            overflowed = any(not np.isfinite(g).all() for g in got)
            assert found == (expected_found or (path == "fused-cpu" and overflowed)), path
        if not found:
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=path)


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


@pytest.mark.compiled_helper
def test_fused_kernel_flags_an_unscaled_value_that_overflows():
    arrays = [np.array([3e38, 1.0], "float32")]
    _, paddle_found = paddle_kernel(arrays, 0.5, "float32")
    got, fused_found = through_path("fused-cpu", arrays, 0.5, "float32")
    assert np.isinf(got[0][0]) and fused_found and not paddle_found


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


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_training_and_skipping_on_each_path(path, name):
    from test_training_equivalence import OPTIMIZERS

    def run(scaler):
        model = make_model()
        optimizer = OPTIMIZERS[name](model.parameters())
        injector = GradInjector(model[0].weight)
        for step, batch in enumerate(batches(steps=5)):
            before = params_of(model)
            inject = math.inf if step == 3 else None
            train_step(scaler, model, optimizer, batch, injector=injector, inject=inject)
            if inject is not None:
                for old, new in zip(before, params_of(model)):
                    np.testing.assert_array_equal(new, old)
        return params_of(model), optimizer_state_of(optimizer, model.parameters())

    reference = run(GradScaler(init_loss_scaling=2.0**10))
    with kernels.using_unscale_path(path):
        ours = run(GradScaler(init_loss_scaling=2.0**10))
    for a, b in zip(ours[0], reference[0]):
        np.testing.assert_array_equal(a, b)


def test_unknown_path_is_refused():
    with (
        pytest.raises(ValueError, match="not available"),
        kernels.using_unscale_path("cuda-graphs"),
    ):
        pass


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_in_subprocess(extension_dir, prelude="", **env):
    """Run the loader in a fresh process: Paddle refuses to register an op twice in one."""
    code = (
        prelude + "\nfrom paddle_amp_scaler import fused_cpu, kernels\n"
        "print(kernels.unscale_paths(), kernels.default_unscale_path())\n"
    )
    environment = dict(os.environ, PYTHONPATH=ROOT, PADDLE_EXTENSION_DIR=str(extension_dir), **env)
    return subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=600
    )


def markers(directory):
    return [
        os.path.join(folder, name)
        for folder, _, names in os.walk(directory)
        for name in names
        if name == fused_cpu._BUILT
    ]


def test_environment_switch_turns_the_fused_kernel_off(tmp_path):
    result = load_in_subprocess(tmp_path, PADDLE_AMP_SCALER_FUSED="0")
    assert result.stdout.strip() == "['paddle'] paddle"
    assert not markers(tmp_path)


@pytest.mark.compiled_helper
def test_a_failed_build_falls_back_with_a_warning(tmp_path):
    no_compiler = (
        "from paddle.utils import cpp_extension\n"
        "def load(**kwargs):\n"
        "    raise OSError('no C++ compiler found\\ng++: command not found\\nexit 127')\n"
        "cpp_extension.load = load\n"
    )
    result = load_in_subprocess(tmp_path, prelude=no_compiler)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['paddle'] paddle"
    # One line: the error's first, and what the user gets instead.
    (line,) = [line for line in result.stderr.splitlines() if "could not be built" in line]
    assert "no C++ compiler found" in line and "uses Paddle's kernels" in line
    assert "command not found" not in result.stderr
    assert not markers(tmp_path)


@pytest.mark.compiled_helper
def test_a_half_built_kernel_is_rebuilt_not_trusted(tmp_path):
    # What a build killed before it finished leaves: a folder of files and no marker.
    half_built = tmp_path / fused_cpu._build_name()
    half_built.mkdir()
    (half_built / "broken.so").write_bytes(b"not a library")

    result = load_in_subprocess(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['paddle', 'fused-cpu'] fused-cpu"
    assert not (half_built / "broken.so").exists()
    assert [os.path.dirname(m) for m in markers(tmp_path)] == [str(half_built)]
    # And a second process uses that build without building again.
    again = load_in_subprocess(tmp_path)
    assert again.stdout.strip() == "['paddle', 'fused-cpu'] fused-cpu"
    # Once built, a run says nothing: neither the build nor Paddle's builder's chatter.
    assert again.stderr.strip() == "", again.stderr
