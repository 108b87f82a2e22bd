"""Every unscale-and-check path gives Paddle's kernel's bits and verdict, and the scaler
keeps all its guarantees on each; the fused kernel's loader falls back safely."""

import functools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import sysconfig

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


# What Paddle's log handler (set up when Paddle is imported) puts before a message.
LOG_PREFIX = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[ *%s\] fused_cpu\.py:\d+ - "


def log_line(level, message):
    return LOG_PREFIX % level + re.escape(message)


def not_built_warning(reason, build_directory):
    return log_line(
        "WARNING",
        f"the compiled CPU helper could not be built ({reason}; build log: "
        f"{os.path.join(build_directory, 'build.log')}); the scaler uses Paddle's kernels on "
        "CPU, with the same results, a few times slower, and tries the build again only "
        "when the compiler or Paddle changes. PADDLE_AMP_SCALER_FUSED=0 turns the helper "
        "off and this warning with it",
    )


def building_line(build_directory):
    """The line that announces a build, where the process shows INFO (Paddle 3's import
    sets the root logger to INFO, Paddle 2.6's leaves it at WARNING); else nothing."""
    if not info_is_shown():
        return ""
    return (
        log_line(
            "INFO",
            "building the compiled CPU helper once for this Paddle, about 15 s, into "
            + str(build_directory),
        )
        + "\n"
    )


@functools.cache
def info_is_shown():
    code = (
        "import logging, paddle_amp_scaler\n"
        "print(logging.getLogger('paddle_amp_scaler').isEnabledFor(logging.INFO))\n"
    )
    environment = dict(os.environ, PYTHONPATH=ROOT)
    shown = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True
    )
    return shown.stdout.strip() == "True"


@pytest.mark.compiled_helper
def test_a_failed_build_falls_back_with_a_warning(tmp_path):
    no_compiler = (
        "import paddle_amp_scaler  # first: Paddle's import warns of no ccache otherwise\n"
        "from paddle.utils import cpp_extension\n"
        "def load(**kwargs):\n"
        "    raise OSError('no C++ compiler found\\ng++: command not found\\nexit 127')\n"
        "cpp_extension.load = load\n"
    )
    result = load_in_subprocess(tmp_path, prelude=no_compiler)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['paddle'] paddle"
    # The announced build, then one line: the error's first, the log that holds the
    # rest, what the user gets instead and how to be rid of it.
    build = tmp_path / fused_cpu._build_name()
    assert re.fullmatch(
        building_line(build) + not_built_warning("no C++ compiler found", build) + "\n",
        result.stderr,
    ), result.stderr
    assert "g++: command not found" in (build / "build.log").read_text()
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


# Every program on this PATH but the compilers, as in a slim container; Python's own
# (sysconfig's) C and C++ compilers are the ones setuptools runs for Paddle's builder.
COMPILER_NAMES = re.compile(r"(^|-)(c\+\+|g\+\+|gcc|cc|clang(\+\+)?|c89|c99)(-[\d.]+)?$")
PYTHONS_CXX = shlex.split(sysconfig.get_config_var("CXX") or "c++")[0]
PYTHONS_CC = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]

# A quiet run: trains a few steps, one of them skipped, and keeps what build_status()
# says in a file; anything it prints is the package's.
TRAIN = """
import dataclasses, json, sys
import paddle_amp_scaler
import paddle
from paddle_amp_scaler import GradScaler, kernels
from paddle_amp_scaler.core import fused_cpu

paddle.seed(0)
model = paddle.nn.Linear(4, 1)
optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
scaler = GradScaler(init_loss_scaling=1024.0)
for step in range(4):
    loss = model(paddle.ones([2, 4])).mean() * (float("inf") if step == 1 else 1.0)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
stats = scaler.stats()
assert (stats.iterations, stats.skipped, stats.backoffs) == (4, 1, 1), stats
assert kernels.default_unscale_path() == sys.argv[1], kernels.default_unscale_path()
with open(sys.argv[2], "w") as status:
    json.dump(dataclasses.asdict(fused_cpu.build_status()), status)
"""


def path_without_a_compiler(folder):
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            target = os.path.join(directory, name)
            link = folder / name
            if COMPILER_NAMES.search(name) or link.is_symlink() or link.exists():
                continue
            if os.path.isfile(target) and os.access(target, os.X_OK):
                link.symlink_to(target)
    return str(folder)


def stand_in_compilers(folder, version):
    """Programs named as Python's compilers that answer Paddle's version checks and fail
    to compile anything."""
    folder.mkdir(exist_ok=True)
    for name in (PYTHONS_CXX, PYTHONS_CC):
        program = folder / name
        program.write_text(
            "#!/bin/sh\n"
            'case "$1" in\n'
            f"  --version) echo 'stand-in compiler {version}' ;;\n"
            "  -dumpfullversion) echo 12.2.0 ;;\n"
            "  *) echo 'stand-in: fatal error: compiles nothing' >&2; exit 1 ;;\n"
            "esac\n"
        )
        program.chmod(0o755)
    return str(folder)


def train_in_subprocess(tmp_path, path, expected_path="paddle", **env):
    """Run TRAIN with PATH ``path`` and no $CXX or $CC but those in ``env``; the result
    and what build_status() said."""
    environment = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC")}
    environment.update(
        PATH=path, PYTHONPATH=ROOT, PADDLE_EXTENSION_DIR=str(tmp_path / "extensions"), **env
    )
    status_file = tmp_path / "status.json"
    result = subprocess.run(
        [sys.executable, "-c", TRAIN, expected_path, str(status_file)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return result, json.loads(status_file.read_text())


def build_directory(tmp_path):
    return tmp_path / "extensions" / fused_cpu._build_name()


NO_CXX = f"no C++ compiler: {PYTHONS_CXX} is not on PATH; install one, or name it in CXX"


@pytest.mark.compiled_helper
@pytest.mark.skipif(os.path.isabs(PYTHONS_CXX), reason="Python names its compiler by path")
def test_without_a_compiler_one_warning_line_once_per_installation(tmp_path):
    path = path_without_a_compiler(tmp_path / "bin")
    build = build_directory(tmp_path)

    first, status = train_in_subprocess(tmp_path, path)
    assert first.stdout == ""
    assert re.fullmatch(not_built_warning(NO_CXX, build) + "\n", first.stderr), first.stderr
    log = (build / "build.log").read_text()
    assert f"CalledProcessError: Command '['which', '{PYTHONS_CXX}']'" in log
    assert f"not built: {NO_CXX}" in log
    assert status == {
        "state": "failed",
        "directory": str(build),
        "log_file": str(build / "build.log"),
        "reason": NO_CXX,
    }

    # The same Paddle and the same (missing) compiler: not tried, not said.
    again, status_again = train_in_subprocess(tmp_path, path)
    assert (again.stdout, again.stderr) == ("", "")
    assert status_again == status
    assert (build / "build.log").read_text() == log


@pytest.mark.compiled_helper
@pytest.mark.skipif(os.path.isabs(PYTHONS_CXX), reason="Python names its compiler by path")
def test_a_failure_on_another_rank_is_said_by_the_first_process_heard(tmp_path):
    # Ranks start together and one builds: if it is not rank 0, its warning is dropped
    # (the package logs from rank 0 only), so rank 0 says it, once.
    path = path_without_a_compiler(tmp_path / "bin")
    build = build_directory(tmp_path)
    rank_one, status = train_in_subprocess(tmp_path, path, PADDLE_TRAINER_ID="1")
    assert (rank_one.stdout, rank_one.stderr) == ("", "")
    assert status["state"] == "failed"

    rank_zero, _ = train_in_subprocess(tmp_path, path, PADDLE_TRAINER_ID="0")
    assert rank_zero.stdout == ""
    assert re.fullmatch(not_built_warning(NO_CXX, build) + "\n", rank_zero.stderr), rank_zero.stderr

    again, _ = train_in_subprocess(tmp_path, path, PADDLE_TRAINER_ID="0")
    assert (again.stdout, again.stderr) == ("", "")


@pytest.mark.compiled_helper
@pytest.mark.skipif(os.path.isabs(PYTHONS_CXX), reason="Python names its compiler by path")
def test_a_new_compiler_or_version_is_tried_again_once(tmp_path):
    path = path_without_a_compiler(tmp_path / "bin")
    build = build_directory(tmp_path)
    first, _ = train_in_subprocess(tmp_path, path)
    assert re.fullmatch(not_built_warning(NO_CXX, build) + "\n", first.stderr), first.stderr

    stand_ins = tmp_path / "stand-ins"
    compilers = {
        "CXX": str(stand_ins / PYTHONS_CXX),
        "CC": str(stand_ins / PYTHONS_CC),
    }
    stand_in_compilers(stand_ins, "1")
    fails = "stand-in: fatal error: compiles nothing"
    # A compiler is found, so a build is announced, then its failure.
    tried = building_line(build) + not_built_warning(fails, build) + "\n"
    named, status = train_in_subprocess(tmp_path, path, **compilers)
    assert named.stdout == ""
    assert re.fullmatch(tried, named.stderr), named.stderr
    assert status["state"] == "failed" and status["reason"] == fails
    assert fails in (build / "build.log").read_text()

    same, _ = train_in_subprocess(tmp_path, path, **compilers)
    assert (same.stdout, same.stderr) == ("", "")

    stand_in_compilers(stand_ins, "2")
    upgraded, _ = train_in_subprocess(tmp_path, path, **compilers)
    assert re.fullmatch(tried, upgraded.stderr), upgraded.stderr

    # The same programs found on PATH rather than named in $CXX and $CC.
    on_path, _ = train_in_subprocess(tmp_path, str(stand_ins) + os.pathsep + path)
    assert re.fullmatch(tried, on_path.stderr), on_path.stderr
    quiet, _ = train_in_subprocess(tmp_path, str(stand_ins) + os.pathsep + path)
    assert (quiet.stdout, quiet.stderr) == ("", "")


@pytest.mark.compiled_helper
@pytest.mark.skipif(os.path.isabs(PYTHONS_CXX), reason="Python names its compiler by path")
def test_a_compiler_back_on_path_builds_and_uses_the_helper(tmp_path):
    path = path_without_a_compiler(tmp_path / "bin")
    build = build_directory(tmp_path)
    _, status = train_in_subprocess(tmp_path, path)
    assert status["state"] == "failed"

    built, status = train_in_subprocess(tmp_path, os.environ["PATH"], expected_path="fused-cpu")
    assert built.stdout == ""
    assert re.fullmatch(building_line(build), built.stderr), built.stderr
    assert status == {
        "state": "built",
        "directory": str(build),
        "log_file": str(build / "build.log"),
        "reason": None,
    }
    assert [os.path.dirname(m) for m in markers(tmp_path)] == [str(build)]
    assert not (build / fused_cpu._FAILED).exists()

    # Built, the helper needs no compiler.
    after, _ = train_in_subprocess(tmp_path, path, expected_path="fused-cpu")
    assert (after.stdout, after.stderr) == ("", "")
