"""``python -m paddle_amp_scaler``: doctor and inspect, run as a user runs them (in a
subprocess, from a folder outside the checkout), and doctor's GPU verdicts from facts
written by hand, since no test machine has every GPU."""

import dataclasses
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import warnings

import numpy as np
import paddle
import pytest

import paddle_amp_scaler
from paddle_amp_scaler import GradScaler, save_checkpoint
from paddle_amp_scaler.checkpoint import rng_state_survives_pickling
from paddle_amp_scaler.core import fused_cpu, unscale_paths

from helpers import GradInjector, WritesAMarker, batches, make_model, write_payload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, cwd, env=None):
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "paddle_amp_scaler", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def fields(output):
    """{label: value} of a report's lines: the label, two spaces or more, the value."""
    pairs = (line.strip().split("  ", 1) for line in output.splitlines() if "  " in line.strip())
    return {label: value.strip() for label, value in pairs}


# -- the commands as a user runs them -------------------------------------------------------


def test_version(tmp_path):
    result = run_cli("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"paddle_amp_scaler {paddle_amp_scaler.__version__} ")
    assert f"Paddle {paddle.__version__}" in result.stdout


@pytest.mark.parametrize(
    "command", [[], ["doctor"], ["inspect"]], ids=["main", "doctor", "inspect"]
)
def test_help(tmp_path, command):
    result = run_cli(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m paddle_amp_scaler")
    assert "--json" in result.stdout if command else "doctor" in result.stdout


def test_no_command_or_a_wrong_one_is_a_usage_error(tmp_path):
    bare = run_cli(cwd=tmp_path)
    assert bare.returncode == 2 and "usage:" in bare.stderr and bare.stdout == ""
    wrong = run_cli("inspekt", cwd=tmp_path)
    assert wrong.returncode == 2 and "invalid choice: 'inspekt'" in wrong.stderr
    missing = run_cli("inspect", cwd=tmp_path)
    assert missing.returncode == 2 and "path" in missing.stderr


def test_doctor_on_this_machine(tmp_path):
    result = run_cli("doctor", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    facts = fields(result.stdout)
    assert facts["Python"].startswith(platform.python_version())
    assert facts["NumPy"] == np.__version__
    assert facts["Paddle"].startswith(f"{paddle.__version__}, CPU build")
    assert facts["CUDA"] == facts["cuDNN"] == facts["GPU kernels for"] == "none (CPU build)"
    assert facts["devices"] == "cpu (current: cpu)"
    # The path this process's scalers take, and the helper's state, as they are.
    path = unscale_paths.default_unscale_path()
    assert facts["unscale path"].startswith(f"{path}: ")
    status = fused_cpu.build_status()
    shown = status.directory.replace(os.path.expanduser("~"), "~", 1)
    assert facts["compiled helper"].startswith(f"{status.state}, in {shown}")
    saves = "save the random generator" if rng_state_survives_pickling() else "leave the random"
    assert facts["checkpoints"].startswith(saves)
    assert result.stdout.rstrip().endswith("Nothing here stands in the way of training.")

    report = json.loads(run_cli("doctor", "--json", cwd=tmp_path).stdout)
    assert report["ok"] is True and report["gpu_coverage"] == []
    assert [finding for finding in report["findings"] if finding["severity"] != "note"] == []
    assert report["facts"]["unscale_path"] == path
    assert report["facts"]["helper"]["state"] == status.state


def test_doctor_builds_nothing(tmp_path):
    cache = tmp_path / "extensions"
    cache.mkdir()
    environment = {"PADDLE_EXTENSION_DIR": str(cache), "PADDLE_AMP_SCALER_FUSED": "1"}
    result = run_cli("doctor", cwd=tmp_path, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    facts = fields(result.stdout)
    shown = str(cache).replace(os.path.expanduser("~"), "~", 1)
    assert facts["compiled helper"].startswith(f"not built yet, in {shown}")
    assert facts["unscale path"].startswith("fused-cpu: the compiled helper, on a CPU, once built")
    assert list(cache.iterdir()) == []


def test_doctor_with_the_helper_turned_off(tmp_path):
    result = run_cli("doctor", "--json", cwd=tmp_path, env={"PADDLE_AMP_SCALER_FUSED": "0"})
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)["facts"]
    assert facts["helper"]["state"] == "disabled"
    assert facts["unscale_path"] == "paddle"
    assert "PADDLE_AMP_SCALER_FUSED=0 turns the compiled helper off" in facts["unscale_reason"]


# -- doctor's verdicts, from facts written by hand ------------------------------------------


@pytest.fixture
def cli():
    """The command line's module, for the tests that call its functions directly."""
    return importlib.import_module("paddle_amp_scaler.cli")


# What GPU kernels a Paddle build carries: (sass, ptx, who says so).
PYPI_2_6 = ((61, 70, 75, 80, 86), (), "PyPI's paddlepaddle-gpu 2.6")
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
A100 = ("NVIDIA A100", (8, 0))
RTX_5090 = ("NVIDIA GeForce RTX 5090", (12, 0))


def cuda_facts(cli, paddle_version, kernels, gpus):
    """This machine's facts, made a CUDA build of ``paddle_version`` with ``gpus``."""
    return dataclasses.replace(
        cli.gather_facts(),
        paddle=paddle_version,
        build="CUDA",
        cuda="12.0",
        cudnn="8.9",
        kernels=cli.GpuKernels(*kernels),
        gpus=tuple(gpus),
        device="gpu:0",
        unscale_path="paddle",
        unscale_reason="Paddle's kernels, as on every gpu",
    )


@pytest.mark.parametrize(
    "card, kernels, covered, how",
    [
        (H100, PYPI_2_6, False, "no binary for sm_90 among sm_61, sm_70, sm_75, sm_80, sm_86"),
        (A100, PYPI_2_6, True, "sm_80 binaries"),
        # A binary runs on later minor versions of its major one: Ada on Ampere's sm_86.
        (("NVIDIA GeForce RTX 4090", (8, 9)), PYPI_2_6, True, "sm_86 binaries"),
        (("Tesla T4", (7, 5)), PYPI_2_6, True, "sm_75 binaries"),
        (("GeForce GTX 980", (5, 2)), PYPI_2_6, False, "no binary for sm_52"),
        (H100, ((80, 90), None, "cuda_archs"), True, "sm_90 binaries"),
        (RTX_5090, ((80, 86, 90), None, "cuda_archs"), False, "does not say whether it has PTX"),
        # PTX compiles for any later GPU, at a cost on first use.
        (H100, ((80,), (80,), "hand-made"), True, "PTX for compute_80"),
        (H100, (None, None, "Paddle 3.0.0 does not expose it"), None, "does not expose it"),
    ],
    ids=["h100-2.6", "a100-2.6", "4090-2.6", "t4-2.6", "980-2.6", "h100-3.x", "5090-3.x",
         "h100-ptx", "h100-unlisted"],
)  # fmt: skip
def test_gpu_coverage_from_the_kernel_list(cli, card, kernels, covered, how):
    coverage = cli.gpu_coverage(cli.Gpu(0, *card), cli.GpuKernels(*kernels))
    assert coverage.covered is covered and how in coverage.how


def test_a_kernel_tried_on_the_gpu_settles_it(cli):
    failed = "(External) CUDA error(209), no kernel image is available for execution on the device."
    listed = cli.GpuKernels((90,), None, "cuda_archs")
    refused = cli.gpu_coverage(cli.Gpu(0, *H100, probed=True, probe_error=failed), listed)
    assert refused.covered is False and "no image" in refused.how
    # A build from Paddle's index may hold more than PyPI's list says.
    ran = cli.gpu_coverage(cli.Gpu(0, *H100, probed=True), cli.GpuKernels(*PYPI_2_6))
    assert ran.covered is True and "ran" in ran.how
    oom = cli.Gpu(0, *H100, probed=True, probe_error="out of memory")
    other = cli.gpu_coverage(oom, cli.GpuKernels(*PYPI_2_6))
    assert other.covered is None and "out of memory" in other.how


def test_the_probe_keeps_the_line_that_names_the_error(cli, monkeypatch):
    # What Paddle 2.6.2 raises on an H100: a C++ traceback first, the error last.
    message = (
        "\n\n--------------------------------------\nC++ Traceback (most recent call last):\n"
        "0   paddle::experimental::full(...)\n\n----------------------\nError Message "
        "Summary:\n----------------------\nExternalError: CUDA error(209), no kernel image "
        "is available for execution on the device.\n  [Hint: 'cudaErrorNoKernelImageForDevice'"
        ". This indicates that there is no kernel image available that is suitable for the "
        "device.] (at ../paddle/phi/backends/gpu/cuda/cuda_info.cc:259)\n"
    )

    def fails(*args, **kwargs):
        raise OSError(message)

    monkeypatch.setattr(cli.paddle, "to_tensor", fails)
    monkeypatch.setattr(cli.paddle, "CUDAPlace", lambda index: index)
    error = cli._probe(0)
    assert error.startswith("ExternalError: CUDA error(209), no kernel image is available")
    coverage = cli.gpu_coverage(cli.Gpu(0, *H100, probed=True, probe_error=error), None)
    assert coverage.covered is False


def test_doctor_fails_with_the_fix_on_an_h100_with_pypis_paddle(cli, monkeypatch, capsys):
    facts = cuda_facts(cli, "2.6.2", PYPI_2_6, [cli.Gpu(0, *H100)])
    (error,) = [finding for finding in cli.findings(facts) if finding.severity == "error"]
    assert "GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0) has no kernels" in error.what
    assert "cudaErrorNoKernelImageForDevice" in error.what
    assert "PyPI's paddlepaddle-gpu stops at 2.6.2" in error.fix
    assert "CUDA 12 build of Paddle 3.x" in error.fix
    assert "-i https://www.paddlepaddle.org.cn/packages/stable/cu126/" in error.fix

    monkeypatch.setattr(cli, "gather_facts", lambda: facts)
    assert cli.main(["doctor"]) == 1
    report = capsys.readouterr().out
    assert "GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0): NOT covered" in report
    assert f"error: {error.what}\n  fix: {error.fix}" in report
    assert "Nothing here stands in the way" not in report
    assert cli.main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["gpu_coverage"][0]["covered"] is False


def test_the_h100_verdict_the_docs_show_is_what_doctor_says(cli):
    facts = cuda_facts(cli, "2.6.2", PYPI_2_6, [cli.Gpu(0, *H100)])
    (error,) = [finding for finding in cli.findings(facts) if finding.severity == "error"]
    with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as page:
        shown = page.read()
    assert f"\nerror: {error.what}\n  fix: {error.fix}\n" in shown


def test_doctor_passes_where_the_kernels_cover_every_gpu(cli, monkeypatch, capsys):
    facts = cuda_facts(cli, "2.6.2", PYPI_2_6, [cli.Gpu(0, *A100, probed=True)])
    assert [finding for finding in cli.findings(facts) if finding.severity == "error"] == []
    monkeypatch.setattr(cli, "gather_facts", lambda: facts)
    assert cli.main(["doctor"]) == 0
    report = capsys.readouterr().out
    assert "GPU 0 (NVIDIA A100, compute capability 8.0): covered, sm_80 binaries" in report
    assert "sm_61 sm_70 sm_75 sm_80 sm_86; no PTX" in report


def test_doctor_on_paddle_3_points_at_paddles_index_for_a_newer_gpu(cli):
    kernels = ((75, 80, 86, 90), None, "paddle.version.cuda_archs()")
    facts = cuda_facts(cli, "3.3.1", kernels, [cli.Gpu(0, *RTX_5090)])
    (error,) = [finding for finding in cli.findings(facts) if finding.severity == "error"]
    assert "no binary for sm_120" in error.what
    assert "paddlepaddle.org.cn" in error.fix and "CUDA 12.8 or newer" in error.fix


def test_notes_that_do_not_stop_training(cli):
    facts = dataclasses.replace(
        cuda_facts(cli, "2.6.2", PYPI_2_6, []),
        numpy="2.1.0",
        paddle_distributions=("paddlepaddle 2.6.2", "paddlepaddle-gpu 2.6.2"),
    )
    notes = {finding.what.split(":")[0]: finding for finding in cli.findings(facts)}
    assert all(finding.severity == "note" for finding in notes.values())
    assert "Paddle is a CUDA build but sees no GPU" in notes
    assert "import numpy.random" in notes["Paddle 2.6 with NumPy 2.1.0"].fix
    assert any("both paddlepaddle 2.6.2 and paddlepaddle-gpu 2.6.2" in key for key in notes)

    # A Paddle before 2.6 is an error; a develop build, numbered 0.0.0, is not.
    def errors(paddle_version):
        found = cli.findings(dataclasses.replace(facts, paddle=paddle_version))
        return [finding.what for finding in found if finding.severity == "error"]

    assert errors("2.5.2") == ["Paddle 2.5.2 is older than 2.6, the oldest this package supports"]
    assert errors("0.0.0") == errors("3.0.0rc1") == []


def test_the_unscale_path_and_why(cli):
    def status(state, reason=None):
        return fused_cpu.BuildStatus(state, "/cache/helper", reason=reason)

    assert cli.unscale_choice("gpu:0", status("built"), "paddle") == (
        "paddle",
        "Paddle's kernels, as on every gpu",
    )
    assert cli.unscale_choice("xpu:1", status("not built yet"), "paddle")[0] == "paddle"
    path, why = cli.unscale_choice("cpu", status("disabled", "PADDLE_AMP_SCALER_FUSED=0"), "paddle")
    assert path == "paddle" and "PADDLE_AMP_SCALER_FUSED=0 turns the compiled helper off" in why
    path, why = cli.unscale_choice("cpu", status("failed", "g++: not found"), None)
    assert path == "paddle" and "failed to build" in why
    assert cli.unscale_choice("cpu", status("built"), "fused-cpu") == (
        "fused-cpu",
        "the compiled helper, on a CPU",
    )
    assert cli.unscale_choice("cpu", status("built"), "paddle")[0] == "paddle"
    path, why = cli.unscale_choice("cpu", status("not built yet"), None)
    assert path == "fused-cpu" and "once built" in why


def test_a_failed_helper_is_a_note_with_its_log(cli):
    facts = dataclasses.replace(
        cli.gather_facts(),
        helper=fused_cpu.BuildStatus("failed", "/cache/x", "/cache/x/build.log", "g++: not found"),
    )
    (note,) = [finding for finding in cli.findings(facts) if "helper" in finding.what]
    assert note.severity == "note" and "g++: not found" in note.what
    assert "/cache/x/build.log" in note.fix
    assert "compiled helper   failed, in /cache/x (g++: not found); log: /cache/x/build.log" in (
        cli.doctor_report(facts, [note])
    )


# -- inspect ---------------------------------------------------------------------------------


def save_quietly(path, **objects):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Paddle 2.6 cannot save its generator's position
        save_checkpoint(path, **objects)


@pytest.fixture
def trained(tmp_path):
    """A checkpoint of two models, an AdamW with a schedule, a bounded scaler that skipped
    one step of four."""
    models = [make_model(seed=0), make_model(seed=1, depth=1)]
    parameters = models[0].parameters() + models[1].parameters()
    schedule = paddle.optimizer.lr.StepDecay(0.01, step_size=2)
    optimizer = paddle.optimizer.AdamW(learning_rate=schedule, parameters=parameters)
    scaler = GradScaler(init_loss_scaling=2.0**10, max_loss_scaling=2.0**12, incr_every_n_steps=3)
    injector = GradInjector(models[0][0].weight)
    for step, (x, y) in enumerate(batches(steps=4)):
        with injector.inject(math.inf if step == 1 else None):
            loss = sum(paddle.nn.functional.mse_loss(model(x), y) for model in models)
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        schedule.step()
    path = tmp_path / "run.ckpt"
    extra = {"epoch": 2, "note": "warm-up done", "order": np.arange(5), "history": [0.5, 0.4]}
    save_quietly(path, model=models, optimizer=optimizer, scaler=scaler, step=4, extra=extra)
    return path, models, scaler


def test_inspect_a_checkpoint(trained):
    path, models, scaler = trained
    result = run_cli("inspect", path.name, cwd=path.parent)
    assert result.returncode == 0, result.stderr
    facts = fields(result.stdout)
    assert facts["checkpoint"] == "run.ckpt"
    assert facts["format"] == "version 1, SHA-256 checksum holds"
    assert facts["written with"] == f"Paddle {paddle.__version__}"
    assert facts["step"] == "4"
    assert facts["scaler"] == "dynamic loss scaling"
    assert facts["scale"] == str(scaler.get_loss_scaling())
    assert facts["counters"] == (
        f"incr_count {scaler.get_incr_count()}, decr_count {scaler.get_decr_count()}"
    )
    assert facts["ratios"] == "incr_ratio 2.0, decr_ratio 0.5"
    assert facts["periods"] == (
        f"incr_every_n_steps 3, decr_every_n_nan_or_inf {scaler.get_decr_every_n_nan_or_inf()}"
    )
    assert facts["policy"] == "interval"
    assert facts["bounds"] == "min_loss_scaling 1.0, max_loss_scaling 4096.0"
    assert facts["stats"].startswith("iterations 4, skipped 1, skip_streak 0, last_skipped 2")
    assert facts["models"] == "2" and facts["optimizers"] == "1"
    small = models[1].state_dict()
    values = sum(int(np.prod(value.shape)) for value in small.values())
    assert facts["model 1"] == f"{len(small)} tensors, {values} values: " + ", ".join(
        f"{name} {list(value.shape)} float32" for name, value in small.items()
    )
    assert facts["model 0"].endswith(", ... (2 more)")  # 6 tensors, 4 shown
    assert facts["optimizer 0"].startswith("10 parameters; accumulators: moment1_0 x10")
    assert facts["optimizer 0"].endswith("also LR_Scheduler")
    rng = "saved (cpu, 1 generator)" if rng_state_survives_pickling() else "not saved"
    assert facts["RNG state"].startswith(rng)
    assert facts["extra"] == "dict of 4 entries"
    assert facts["epoch"] == "int 2" and facts["note"] == "str 'warm-up done'"
    assert facts["order"] == "ndarray [5] int64" and facts["history"] == "list of 2"


def test_inspect_as_json(trained):
    path, models, scaler = trained
    result = run_cli("inspect", "--json", str(path), cwd=path.parent)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["step"], report["format_version"], report["checksum"]) == (4, 1, "holds")
    assert report["paddle_version"] == paddle.__version__
    saved = report["scaler"]
    assert saved["scale"] == scaler.get_loss_scaling() and saved["policy"] == "interval"
    assert (saved["min_loss_scaling"], saved["max_loss_scaling"]) == (1.0, 4096.0)
    stats = scaler.stats()
    assert {key: saved["stats"][key] for key in ("iterations", "skipped", "last_skipped")} == {
        "iterations": stats.iterations,
        "skipped": stats.skipped,
        "last_skipped": stats.last_skipped,
    }
    for summary, model in zip(report["models"], models):
        assert summary["tensors"] == len(model.state_dict())
        assert summary["values"] == sum(int(np.prod(p.shape)) for p in model.state_dict().values())
        assert summary["entries"]["0.weight"] == {
            "type": "ndarray",
            "shape": list(model[0].weight.shape),
            "dtype": "float32",
        }
    (optimizer,) = report["optimizers"]
    assert optimizer["parameters"] == 10 and optimizer["master_weights"] == 0
    assert optimizer["accumulators"]["moment1_0"] == 10
    assert report["rng"]["saved"] is rng_state_survives_pickling()
    assert report["extra"]["entries"]["order"] == {
        "type": "ndarray",
        "shape": [5],
        "dtype": "int64",
    }
    assert report["extra"]["entries"]["epoch"] == {"type": "int", "value": 2}


def test_inspect_shows_a_saved_policy_and_its_memory(tmp_path):
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = GradScaler(policy="headroom", init_loss_scaling=2.0)
    scaler.scale(model(paddle.ones([2, 8])).mean()).backward()
    scaler.step(optimizer)
    scaler.update()
    path = tmp_path / "run.ckpt"
    save_quietly(path, model=model, optimizer=optimizer, scaler=scaler, step=1)
    memory = scaler.state_dict()["headroom"]
    result = run_cli("inspect", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    facts = fields(result.stdout)
    assert facts["policy"] == "headroom"
    bits = scaler.stats().headroom_bits
    assert facts["headroom"] == (
        f"margin {memory['margin']} bits, last amax {memory['amax']:g} ({bits:.2f} bits "
        "below float16's top), last grew at iteration 1"
    )
    report = json.loads(run_cli("inspect", "--json", str(path), cwd=tmp_path).stdout)
    assert report["scaler"]["policy"] == "headroom" and report["scaler"]["headroom"] == memory
    # The interval rule's dict says so, and has no memory to show.
    interval = tmp_path / "interval.ckpt"
    save_quietly(interval, model=model, optimizer=optimizer, scaler=GradScaler(), step=1)
    facts = fields(run_cli("inspect", str(interval), cwd=tmp_path).stdout)
    assert facts["policy"] == "interval" and "headroom" not in facts


def test_inspect_names_objects_in_extra_and_runs_none(tmp_path):
    marker = tmp_path / "marker"
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    path = tmp_path / "run.ckpt"
    extra = {"sampler": WritesAMarker(marker), "state": {"inner": [WritesAMarker(marker)]}}
    save_quietly(path, model=model, optimizer=optimizer, scaler=GradScaler(), step=0, extra=extra)
    result = run_cli("inspect", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    facts = fields(result.stdout)
    assert facts["sampler"].startswith("an object built by io.open, not loaded")
    assert "trust_extra=True" in facts["sampler"]
    assert facts["state"] == "dict of 1, holding objects not loaded: io.open"
    report = json.loads(run_cli("inspect", "--json", str(path), cwd=tmp_path).stdout)
    assert report["extra"]["entries"]["sampler"] == {
        "type": "object",
        "class": "io.open",
        "loaded": False,
    }
    assert not marker.exists()


def test_inspect_refuses_what_is_no_readable_checkpoint(trained):
    path, _, _ = trained
    folder, data = path.parent, path.read_bytes()
    marker = folder / "marker"
    corrupted = bytearray(data)
    corrupted[-1] ^= 1
    cases = {
        "text.txt": (b"not a checkpoint\n", "is not a checkpoint written by save_checkpoint"),
        "empty": (b"", "the file is empty"),
        "truncated": (data[: len(data) // 2], "is truncated or padded"),
        "corrupted": (bytes(corrupted), "is corrupted: checksum mismatch"),
    }
    for name, (content, _) in cases.items():
        (folder / name).write_bytes(content)
    write_payload(folder / "crafted", {"step": WritesAMarker(marker)})
    cases["crafted"] = (None, "tries to build io.open")
    cases["missing"] = (None, "No such file")
    for name, (_, message) in cases.items():
        result = run_cli("inspect", name, cwd=folder)
        assert result.returncode == 1, (name, result.stdout)
        assert result.stdout == "" and result.stderr.startswith("error: "), name
        assert message in result.stderr, (name, result.stderr)
    assert not marker.exists()
