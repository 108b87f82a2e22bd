"""Every example runs; the main job reaches its accuracy, draws its figure and resumes
exactly from a checkpoint."""

import importlib.util
import os
import runpy
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


# A flag is refused before anything runs, so these run in this process: a fresh one
# would spend a second and a half importing Paddle for argparse's answer.
@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_example_rejects_bad_steps(name, monkeypatch, capsys):
    monkeypatch.syspath_prepend(EXAMPLES)  # its `from _common import ...`
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--steps", "0"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(os.path.join(EXAMPLES, f"{name}.py"), run_name="__main__")
    assert exited.value.code == 2 and "--steps must be at least 1" in capsys.readouterr().err


@pytest.fixture(scope="module")
def digits():
    spec = importlib.util.spec_from_file_location(
        "train_digits", os.path.join(EXAMPLES, "train_digits.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary_of(out, policy):
    """The numbers of one policy's summary line: skipped steps, flushed %, accuracy %."""
    (line,) = [line for line in out.splitlines() if line.startswith(f"{policy}:")]
    skipped = int(line.split("skipped steps ")[1].split()[0])
    flushed = float(line.split("gradients flushed to zero ")[1].split("%")[0])
    accuracy = float(line.split("test accuracy ")[1].split("%")[0])
    return skipped, flushed, accuracy


def visualdl_points(folder, tag):
    """(step, value) of ``tag`` in the one VisualDL record of ``folder``."""
    visualdl = pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
    (name,) = os.listdir(folder)
    reader = visualdl.LogReader(file_path=str(folder / name))
    return [(point.id, point.value) for point in reader.get_data("scalar", tag)]


def test_default_run_trains_both_policies_above_95_percent_and_draws_the_figure(
    digits, tmp_path, capsys
):
    figure, logs = tmp_path / "training.png", tmp_path / "vdl"
    accuracies = digits.main(["--no-progress", "--plot", str(figure), "--visualdl-dir", str(logs)])
    assert set(accuracies) == {"interval", "headroom"}
    assert min(accuracies.values()) >= 0.95
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    for policy in ("interval", "headroom"):
        skipped, flushed, accuracy = summary_of(out, policy)
        assert skipped >= 1, f"{policy}: the initial 2**24 should overflow and back off"
        # The emulation rounds every matmul: as the loss falls, gradients underflow.
        assert 0 < flushed < 5, (policy, flushed)
        assert accuracy == pytest.approx(100 * accuracies[policy], abs=0.01)
        # The VisualDL log: one record per policy, the loss every step, the scaler's
        # numbers every tenth.
        pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
        assert len(visualdl_points(logs / policy, "train/loss")) == 660
        assert visualdl_points(logs / policy, "train/skipped")[-1][1] == skipped
    assert sorted(os.listdir(logs)) == ["headroom", "interval"]


def test_the_policies_start_alike_and_part_on_the_scale(digits, tmp_path):
    common = ["--no-progress", "--plot", "", "--visualdl-dir", "", "--epochs", "2"]
    digits.main(common + ["--ckpt-dir", str(tmp_path)])
    from paddle_amp_scaler import read_checkpoint

    history = read_checkpoint(tmp_path / "digits.ckpt").extra["history"]
    interval, headroom = history["interval"], history["headroom"]
    # Same weights, same batch: the first loss is the same; the scales then differ, as
    # headroom calibrates in its first iterations and interval halves once per skip.
    assert interval["loss"][0] == headroom["loss"][0]
    assert interval["scale"][:3] == [2.0**24, 2.0**23, 2.0**22]
    assert headroom["scale"][1] < interval["scale"][1]
    assert digits.main(common + ["--policies", "headroom", "--ckpt-dir", str(tmp_path / "h")])


def test_a_second_run_replaces_the_first_runs_visualdl_record(digits, tmp_path):
    pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
    logs = tmp_path / "vdl"
    logs.mkdir()
    # What the demo wrote before it logged each policy in its own folder.
    (logs / "vdlrecords.1700000000.log").write_bytes(b"")
    common = ["--no-progress", "--plot", "", "--visualdl-dir", str(logs), "--epochs", "2"]
    digits.main(common)
    first = {policy: os.listdir(logs / policy) for policy in ("interval", "headroom")}
    digits.main(common + ["--lr", "1e-3"])
    assert sorted(os.listdir(logs)) == ["headroom", "interval"]
    for policy in ("interval", "headroom"):
        assert len(os.listdir(logs / policy)) == 1, first[policy]
        steps = [step for step, _ in visualdl_points(logs / policy, "train/loss")]
        assert steps == list(range(1, 45)), "one run's 44 steps, once each"


def test_without_visualdl_the_summary_names_no_log(digits, tmp_path, monkeypatch, capsys):
    # None in sys.modules: `from visualdl import LogWriter` raises ImportError, as uninstalled.
    monkeypatch.setitem(sys.modules, "visualdl", None)
    logs = tmp_path / "vdl"
    digits.main(["--no-progress", "--plot", "", "--visualdl-dir", str(logs), "--epochs", "2"])
    out = capsys.readouterr().out
    assert "VisualDL is not installed (pip install visualdl): no log written" in out
    assert "VisualDL log" not in out.splitlines()[-1] and not logs.exists()


def test_resumed_run_ends_with_the_uninterrupted_parameters(digits, tmp_path):
    from paddle_amp_scaler import read_checkpoint

    common = ["--no-progress", "--plot", "", "--epochs", "3", "--ckpt-every", "10"]
    straight_logs, cut_logs = tmp_path / "vdl-straight", tmp_path / "vdl-cut"
    straight_args = ["--ckpt-dir", str(tmp_path / "straight"), "--visualdl-dir", str(straight_logs)]
    digits.main(common + straight_args)
    cut = ["--ckpt-dir", str(tmp_path / "cut"), "--visualdl-dir", str(cut_logs)]
    assert digits.main(common + cut + ["--stop-after", "35"]) is None
    assert read_checkpoint(tmp_path / "cut" / "digits.ckpt").step == 35
    digits.main(common + cut + ["--resume"])
    straight = read_checkpoint(tmp_path / "straight" / "digits.ckpt")
    resumed = read_checkpoint(tmp_path / "cut" / "digits.ckpt")
    assert straight.step == resumed.step
    assert len(straight.models) == 2
    for saved, restored in zip(straight.models, resumed.models):
        for key, value in saved.items():
            np.testing.assert_array_equal(restored[key], value, err_msg=key)
    assert straight.extra["history"] == resumed.extra["history"]
    assert straight.scaler == resumed.scaler
    assert straight.extra["scalers"] == resumed.extra["scalers"]
    # The resumed run adds to the interrupted run's VisualDL record: one line, each step once.
    pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
    for policy in ("interval", "headroom"):
        assert visualdl_points(cut_logs / policy, "train/loss") == visualdl_points(
            straight_logs / policy, "train/loss"
        )


def test_help_documents_every_flag(digits, capsys):
    with pytest.raises(SystemExit) as exited:
        digits.parse_args(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for flag in (
        "--epochs",
        "--batch-size",
        "--lr",
        "--init-scale",
        "--incr-every",
        "--policies",
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
        assert flag in shown
    # Each default said once, and none for a flag that has none.
    help_text = " ".join(shown.split())
    assert help_text.count("(default") == 11 and "(default: None)" not in help_text
    assert ") (default" not in help_text


@pytest.mark.parametrize(
    "args,message",
    [
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--resume"], "--resume and --stop-after need --ckpt-dir"),
        (["--device", "tpu"], "invalid choice"),
        (["--policies", "fixed"], "choose from interval,headroom"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_flags_give_a_clear_error(digits, capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        digits.parse_args(args)
    assert exited.value.code == 2 and message in capsys.readouterr().err


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
