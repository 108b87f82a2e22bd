"""Every example runs; the main job reaches its accuracy, draws its figure and resumes
exactly from a checkpoint."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
PATTERNS = [
    "clip_after_unscale",
    "grad_accumulation",
    "grad_penalty",
    "two_models",
    "o2_master_weights",
    "quickstart",
    "torch_style",
    "keras_style",
    "mindspore_style",
    "custom_pylayer",
    "monitor_a_run",
]

pytest.importorskip("sklearn")


def run_example(name, *args):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.dirname(EXAMPLES), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, f"{name}.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_example_runs(name):
    result = run_example(name, "--steps", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_example_rejects_bad_steps(name):
    result = run_example(name, "--steps", "0")
    assert result.returncode == 2 and "--steps must be at least 1" in result.stderr


@pytest.fixture(scope="module")
def digits():
    spec = importlib.util.spec_from_file_location(
        "train_digits", os.path.join(EXAMPLES, "train_digits.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_default_run_reaches_95_percent_and_draws_the_figure(digits, tmp_path, capsys):
    figure, logs = tmp_path / "training.png", tmp_path / "vdl"
    accuracy = digits.main(["--no-progress", "--plot", str(figure), "--visualdl-dir", str(logs)])
    assert accuracy >= 0.95
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    skipped = int(out.split("skipped steps ")[1].split()[0])
    assert skipped >= 1, "the default CPU run should show overflow and back-off"
    # The VisualDL log: the loss every step, the scaler's numbers every tenth.
    visualdl = pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
    (name,) = os.listdir(logs)
    reader = visualdl.LogReader(file_path=str(logs / name))
    assert {"train/loss", "train/loss_scale", "train/skipped"} <= set(reader.get_tags()["scalar"])
    assert len(reader.get_data("scalar", "train/loss")) == 660
    assert reader.get_data("scalar", "train/skipped")[-1].value == skipped


def test_resumed_run_ends_with_the_uninterrupted_parameters(digits, tmp_path):
    from paddle_amp_scaler import read_checkpoint

    common = ["--no-progress", "--plot", "", "--visualdl-dir", ""]
    common += ["--epochs", "3", "--ckpt-every", "10"]
    digits.main(common + ["--ckpt-dir", str(tmp_path / "straight")])
    assert digits.main(common + ["--ckpt-dir", str(tmp_path / "cut"), "--stop-after", "35"]) is None
    assert read_checkpoint(tmp_path / "cut" / "digits.ckpt").step == 35
    digits.main(common + ["--ckpt-dir", str(tmp_path / "cut"), "--resume"])
    straight = read_checkpoint(tmp_path / "straight" / "digits.ckpt")
    resumed = read_checkpoint(tmp_path / "cut" / "digits.ckpt")
    assert straight.step == resumed.step
    for key, value in straight.models[0].items():
        np.testing.assert_array_equal(resumed.models[0][key], value, err_msg=key)
    assert straight.extra["history"] == resumed.extra["history"]


def test_help_documents_every_flag():
    result = run_example("train_digits", "--help")
    assert result.returncode == 0
    for flag in (
        "--epochs",
        "--batch-size",
        "--lr",
        "--init-scale",
        "--incr-every",
        "--device",
        "--emulate-fp16",
        "--ckpt-dir",
        "--ckpt-every",
        "--resume",
        "--stop-after",
        "--plot",
        "--seed",
        "--visualdl-dir",
        "--no-progress",
    ):
        assert flag in result.stdout
    # Each default said once, and none for a flag that has none.
    help_text = " ".join(result.stdout.split())
    assert help_text.count("(default") == 10 and "(default: None)" not in help_text
    assert ") (default" not in help_text


@pytest.mark.parametrize(
    "args,message",
    [
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--resume"], "--resume and --stop-after need --ckpt-dir"),
        (["--device", "tpu"], "invalid choice"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_flags_give_a_clear_error(args, message):
    result = run_example("train_digits", *args)
    assert result.returncode == 2 and message in result.stderr


def test_the_paddle_model_example_shows_the_scale_in_its_progress_bar_and_visualdl(tmp_path):
    pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
    result = run_example("model_fit_visualdl", "--logdir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    bar = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert bar and all("loss_scale: " in line and "skipped: " in line for line in bar)
    assert "VisualDL train/loss_scale: 6 points" in result.stdout
    assert "VisualDL train/skipped: 6 points" in result.stdout


def test_paddleformers_trainer_trains_on_our_scaler_after_install():
    """Runs only where PaddleFormers is installed (not in this project's test environment:
    it pins NumPy and PyArrow versions of its own)."""
    pytest.importorskip("paddleformers")
    result = run_example("paddleformers_trainer", "--steps", "40")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the Trainer built paddle_amp_scaler.scaler.GradScaler" in result.stdout
    assert "skipped=5," in result.stdout and "parameters finite: True" in result.stdout
    # Attached ahead of report_to's VisualDL callback: its log holds the scaler's numbers.
    assert "VisualDL train/skipped_steps: 10: 1, 20: 2, 30: 4, 40: 5" in result.stdout
