"""``python -m paddle_amp_scaler``: doctor and inspect, run as a user runs them (in a
subprocess, from a folder outside the checkout), and doctor's GPU verdicts from facts
written by hand, since no test machine has every GPU."""

import dataclasses
import json
import math
import os
import pickle
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
from paddle_amp_scaler.cli import doctor, main

from helpers import GradInjector, WritesAMarker, batches, make_model, write_payload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Magic, format version, payload length, SHA-256: what precedes a checkpoint's payload.
HEADER_SIZE = 8 + 4 + 8 + 32
# The folder that holds the package under test: the subprocess runs from elsewhere, where
# an installed copy (another checkout's editable install, say) would answer instead.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(paddle_amp_scaler.__file__)))


def run_cli(*args, cwd, env=None):
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment.update(env or {}, PYTHONPATH=PACKAGE_PARENT)
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
    package = os.path.dirname(os.path.abspath(paddle_amp_scaler.__file__))
    shown = package.replace(os.path.expanduser("~"), "~", 1)
    # Its label fills the column: one space before the value.
    first = result.stdout.splitlines()[0]
    assert first == f"paddle_amp_scaler {paddle_amp_scaler.__version__} ({shown})"
    assert facts["Python"].startswith(platform.python_version())
    assert facts["NumPy"] == np.__version__
    assert facts["Paddle"].startswith(f"{paddle.__version__}, CPU build")
    assert facts["CUDA"] == facts["GPU kernels for"] == "none (CPU build)"
    assert facts["devices"] == "cpu (current: cpu)"
    assert result.stdout.rstrip().endswith("Nothing here stands in the way of training.")
    # The compiled helper and the choice of an unscale path are gone from the package.
    assert "helper" not in result.stdout and "unscale path" not in result.stdout

    report = json.loads(run_cli("doctor", "--json", cwd=tmp_path).stdout)
    assert report["ok"] is True and report["gpu_coverage"] == []
    assert [finding for finding in report["findings"] if finding["severity"] != "note"] == []
    assert report["facts"]["paddle"] == paddle.__version__
    assert report["facts"]["build"] == "CPU" and report["facts"]["cuda_archs"] is None
    assert not [key for key in report["facts"] if "helper" in key or "unscale" in key]


# -- doctor's facts, read from Paddle --------------------------------------------------------


def test_the_architectures_are_read_from_paddle_where_it_lists_them(monkeypatch):
    monkeypatch.setattr(paddle.version, "cuda_archs", lambda: [90, 80, 86], raising=False)
    assert doctor._cuda_archs("CUDA") == (80, 86, 90)
    assert doctor._cuda_archs("CPU") is None
    # A build that lists nothing says nothing.
    monkeypatch.setattr(paddle.version, "cuda_archs", list)
    assert doctor._cuda_archs("CUDA") is None
    # Paddle 2.6 has no paddle.version.cuda_archs().
    monkeypatch.delattr(paddle.version, "cuda_archs")
    assert doctor._cuda_archs("CUDA") is None


def test_the_probe_keeps_the_line_that_names_the_error(monkeypatch):
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

    monkeypatch.setattr(doctor.paddle, "to_tensor", fails)
    monkeypatch.setattr(doctor.paddle, "CUDAPlace", lambda index: index)
    error = doctor._probe(0)
    assert error.startswith("ExternalError: CUDA error(209), no kernel image is available")
    assert doctor.gpu_coverage(doctor.Gpu(0, *H100, error), None).covered is False


# -- doctor's verdicts, from facts written by hand ------------------------------------------

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
A100 = ("NVIDIA A100", (8, 0))
RTX_4090 = ("NVIDIA GeForce RTX 4090", (8, 9))
RTX_5090 = ("NVIDIA GeForce RTX 5090", (12, 0))
# Architecture lists as paddle.version.cuda_archs() gives them, made up for the tests.
UP_TO_86 = (61, 70, 75, 80, 86)
UP_TO_90 = (75, 80, 86, 90)
# What a kernel raises on a GPU that it has no binary for (Paddle's wording).
NO_IMAGE = "ExternalError: CUDA error(209), no kernel image is available for execution"


def cuda_facts(paddle_version, cuda_archs, gpus):
    """This machine's facts, made a CUDA build of ``paddle_version`` with ``gpus``."""
    return dataclasses.replace(
        doctor.gather_facts(),
        paddle=paddle_version,
        build="CUDA",
        cuda="12.0",
        cuda_archs=cuda_archs,
        gpus=tuple(gpus),
        device="gpu:0",
    )


@pytest.mark.parametrize(
    "card, archs, probe_error, covered, how",
    [
        (A100, UP_TO_86, None, True, "a Paddle kernel ran on it (sm_80 binaries)"),
        # A binary runs on later minor versions of its major one: Ada on Ampere's sm_86.
        (RTX_4090, UP_TO_86, None, True, "(sm_86 binaries)"),
        (("Tesla T4", (7, 5)), UP_TO_86, None, True, "(sm_75 binaries)"),
        (H100, UP_TO_90, None, True, "(sm_90 binaries)"),
        # Never on the next major version.
        (H100, UP_TO_86, NO_IMAGE, False,
         "found no image for it (no binary for sm_90 among sm_61, sm_70, sm_75, sm_80, sm_86)"),
        (("GeForce GTX 980", (5, 2)), UP_TO_86, NO_IMAGE, False, "(no binary for sm_52 among"),
        (RTX_5090, UP_TO_90, NO_IMAGE, False, "(no binary for sm_120 among sm_75, sm_80,"),
        # A kernel that ran settles it whatever the list says (PTX, which it leaves out).
        (RTX_5090, UP_TO_90, None, True, "a Paddle kernel ran on it (no binary for sm_120"),
        # Paddle 2.6 lists nothing: the kernel tried on the GPU decides.
        (H100, None, None, True,
         "a Paddle kernel ran on it (cannot tell from the listed architectures"),
        (H100, None, NO_IMAGE, False,
         "found no image for it (cannot tell from the listed architectures"),
        # A probe that failed otherwise tells nothing about the kernels.
        (H100, UP_TO_90, "out of memory", None, "a Paddle kernel failed on it: out of memory"),
    ],
    ids=["a100", "4090", "t4", "h100", "h100-to-86", "980", "5090", "5090-ran", "h100-unlisted",
         "h100-unlisted-no-image", "h100-oom"],
)  # fmt: skip
def test_gpu_coverage(card, archs, probe_error, covered, how):
    coverage = doctor.gpu_coverage(doctor.Gpu(0, *card, probe_error), archs)
    assert coverage.covered is covered and how in coverage.how


def errors_and_notes(facts):
    found = list(doctor.findings(facts))
    return (
        [finding for finding in found if finding.severity == "error"],
        [finding for finding in found if finding.severity == "note"],
    )


def test_doctor_fails_with_the_fix_on_a_gpu_paddle_has_no_kernels_for(monkeypatch, capsys):
    # Paddle 2.6 lists no architectures: the probe found no image.
    facts = cuda_facts("2.6.2", None, [doctor.Gpu(0, *H100, NO_IMAGE)])
    (error,), _ = errors_and_notes(facts)
    assert error.what == (
        "GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0) has no kernels in Paddle "
        "2.6.2: a Paddle kernel found no image for it (cannot tell from the listed "
        "architectures: Paddle lists none); every Paddle operation on it fails with "
        "cudaErrorNoKernelImageForDevice"
    )
    assert error.fix == (
        "install a build of Paddle with kernels for sm_90: "
        "https://www.paddlepaddle.org.cn/en/install/quick lists the builds for each CUDA"
    )

    monkeypatch.setattr(doctor, "gather_facts", lambda: facts)
    assert main(["doctor"]) == 1
    report = capsys.readouterr().out
    assert "GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0): NOT covered, " in report
    shown = fields(report)
    assert shown["GPU kernels for"] == (
        "not listed by Paddle 2.6.2: a kernel tried on each GPU decides"
    )
    assert shown["devices"] == "cpu, gpu:0 (current: gpu:0)"
    assert f"error: {error.what}\n  fix: {error.fix}" in report
    assert "Nothing here stands in the way" not in report
    assert main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["gpu_coverage"][0]["covered"] is False
    errors = [finding for finding in report["findings"] if finding["severity"] == "error"]
    assert errors == [dataclasses.asdict(error)]


def test_the_verdict_the_docs_show_is_what_doctor_says():
    facts = cuda_facts("2.6.2", None, [doctor.Gpu(0, *H100, NO_IMAGE)])
    (error,), _ = errors_and_notes(facts)
    with open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8") as page:
        shown = page.read()
    assert f"\nerror: {error.what}\n  fix: {error.fix}\n" in shown


def test_doctor_passes_where_a_kernel_ran_on_every_gpu(monkeypatch, capsys):
    for archs, listed in [
        (UP_TO_90, "sm_75 sm_80 sm_86 sm_90 (paddle.version.cuda_archs())"),
        (None, "not listed by Paddle 2.6.2: a kernel tried on each GPU decides"),
    ]:
        facts = cuda_facts("2.6.2", archs, [doctor.Gpu(0, *A100), doctor.Gpu(1, *H100)])
        assert errors_and_notes(facts)[0] == []
        monkeypatch.setattr(doctor, "gather_facts", lambda facts=facts: facts)
        assert main(["doctor"]) == 0
        report = capsys.readouterr().out
        assert fields(report)["GPU kernels for"] == listed
        assert fields(report)["devices"] == "cpu, gpu:0, gpu:1 (current: gpu:0)"
        for index, (name, _) in enumerate([A100, H100]):
            assert f"GPU {index} ({name}, compute capability " in report
        assert report.count(": covered, a Paddle kernel ran on it (") == 2
        assert report.rstrip().endswith("Nothing here stands in the way of training.")


def test_a_newer_gpu_is_told_which_cuda_it_needs():
    facts = cuda_facts("3.3.1", UP_TO_90, [doctor.Gpu(0, *RTX_5090, NO_IMAGE)])
    (error,), _ = errors_and_notes(facts)
    assert "no binary for sm_120 among sm_75, sm_80, sm_86, sm_90" in error.what
    assert "kernels for sm_120" in error.fix and "paddlepaddle.org.cn" in error.fix
    assert "compute capability 12.0 needs CUDA 12.8 or newer" in error.fix


def test_a_gpu_that_runs_no_kernel_at_all_is_an_error_with_the_driver_to_check():
    facts = cuda_facts("3.3.1", UP_TO_90, [doctor.Gpu(0, *A100, "cudaErrorInsufficientDriver")])
    (error,), _ = errors_and_notes(facts)
    assert error.what.endswith("runs no Paddle kernel: cudaErrorInsufficientDriver")
    assert "nvidia-smi" in error.fix and "CUDA 12.0" in error.fix


def test_notes_that_do_not_stop_training():
    facts = dataclasses.replace(
        cuda_facts("2.6.2", None, []),
        numpy="2.1.0",
        paddle_distributions=("paddlepaddle 2.6.2", "paddlepaddle-gpu 2.6.2"),
    )
    errors, found = errors_and_notes(facts)
    assert errors == []
    notes = {finding.what.split(":")[0]: finding for finding in found}
    assert "Paddle is a CUDA build but sees no GPU" in notes
    assert "import numpy.random" in notes["Paddle 2.6 with NumPy 2.1.0"].fix
    assert any("both paddlepaddle 2.6.2 and paddlepaddle-gpu 2.6.2" in key for key in notes)
    assert len(notes) == 3

    # A Paddle before 2.6 is an error; a develop build, numbered 0.0.0, is not.
    def errors_of(paddle_version):
        found, _ = errors_and_notes(dataclasses.replace(facts, paddle=paddle_version))
        return [finding.what for finding in found]

    assert errors_of("2.5.2") == [
        "Paddle 2.5.2 is older than 2.6, the oldest this package supports"
    ]
    assert errors_of("0.0.0") == errors_of("3.0.0rc1") == []


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
    assert saved["bounds"] == [1.0, 4096.0] and saved["use_dynamic_loss_scaling"] is True
    assert (saved["incr_count"], saved["decr_count"]) == (
        scaler.get_incr_count(),
        scaler.get_decr_count(),
    )
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
    assert facts["memory"] == ", ".join(f"{key} {value}" for key, value in memory.items())
    assert memory["grown_at"] == 1 and memory["amax"] > 0
    assert facts["headroom"] == f"{bits:.2f} bits below float16's top"
    report = json.loads(run_cli("inspect", "--json", str(path), cwd=tmp_path).stdout)
    assert report["scaler"]["policy"] == "headroom" and report["scaler"]["memory"] == memory
    assert report["scaler"]["headroom_bits"] == pytest.approx(bits)
    # The interval rule's dict says so, and has no memory to show.
    interval = tmp_path / "interval.ckpt"
    save_quietly(interval, model=model, optimizer=optimizer, scaler=GradScaler(), step=1)
    facts = fields(run_cli("inspect", str(interval), cwd=tmp_path).stdout)
    assert facts["policy"] == "interval" and "memory" not in facts and "headroom" not in facts


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
    retyped = pickle.loads(data[HEADER_SIZE:])
    retyped["models"] = 5
    write_payload(folder / "retyped", retyped)
    cases["retyped"] = (None, "was not written by save_checkpoint: its models is 5")
    cases["missing"] = (None, "No such file")
    for name, (_, message) in cases.items():
        result = run_cli("inspect", name, cwd=folder)
        assert result.returncode == 1, (name, result.stdout)
        assert result.stdout == "" and result.stderr.startswith("error: "), name
        assert message in result.stderr, (name, result.stderr)
    assert not marker.exists()


def test_inspect_a_checkpoint_whose_extra_holds_itself_and_bytes(tmp_path):
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    loop = [1]
    loop.append(loop)
    extra = {"loop": loop, "marker": WritesAMarker(tmp_path / "marker"), "blob": b"\x00a"}
    extra["self"] = extra
    path = tmp_path / "run.ckpt"
    save_quietly(path, model=model, optimizer=optimizer, scaler=GradScaler(), step=0, extra=extra)
    result = run_cli("inspect", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    facts = fields(result.stdout)
    assert facts["extra"] == "dict of 4 entries" and facts["loop"] == "list of 2"
    assert facts["self"] == "dict of 4, holding objects not loaded: io.open"
    # A value JSON has no type for is shown by its repr.
    assert facts["blob"] == "bytes b'\\x00a'"
    report = json.loads(run_cli("inspect", "--json", str(path), cwd=tmp_path).stdout)
    entries = report["extra"]["entries"]
    assert entries["self"] == {"type": "dict", "length": 4, "not_loaded": ["io.open"]}
    assert entries["blob"] == {"type": "bytes", "repr": repr(b"\x00a")}
    assert not (tmp_path / "marker").exists()


def test_inspect_a_scaler_state_that_does_not_parse(trained):
    path, _, _ = trained
    payload = pickle.loads(path.read_bytes()[HEADER_SIZE:])
    payload["scaler"]["incr_ratio"] = 0.5
    write_payload(path, payload)
    result = run_cli("inspect", str(path), cwd=path.parent)
    assert result.returncode == 1, result.stdout
    assert fields(result.stdout)["scaler"].startswith("its state does not parse: ")
    assert "incr_ratio" in fields(result.stdout)["scaler"]
    report = json.loads(run_cli("inspect", "--json", str(path), cwd=path.parent).stdout)
    assert report["scaler"]["enabled"] is True and "incr_ratio" in report["scaler"]["error"]
