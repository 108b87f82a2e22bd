"""``python -m paddle_amp_scaler``: ``doctor`` says whether this environment can train
and which path the scaler takes here; ``inspect`` says what a checkpoint holds.

Doctor's verdicts are pure functions of the facts it gathers (``Facts``, ``Gpu``,
``GpuKernels``), so that the cases no test machine has, a GPU newer than the installed
Paddle's kernels above all, are tested with facts written by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import paddle

from . import checkpoint
from ._version import __version__
from .core import fused_cpu, unscale_paths
from .core.state_dict import parse_state_dict
from .core.statistics import ScalerStats, headroom_bits

WIDTH = 18  # the column where values start

# What the CUDA wheels of paddlepaddle-gpu on PyPI carry: 2.6.2 is the last release there,
# and Paddle 2.6 does not expose the list itself (paddle.version.cuda_archs() is 3.x's).
PYPI_2_6_SASS = (61, 70, 75, 80, 86)
PADDLE_INDEX = "https://www.paddlepaddle.org.cn/packages/stable/cu126/"
PADDLE_INSTALL_PAGE = "https://www.paddlepaddle.org.cn/en/install/quick"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    result: int = args.run(args)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m paddle_amp_scaler",
        description="Dynamic loss scaling for PaddlePaddle: what this environment gives "
        "the scaler, and what a checkpoint holds.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"paddle_amp_scaler {__version__} (Paddle {paddle.__version__}, "
        f"Python {platform.python_version()})",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    doctor = commands.add_parser(
        "doctor",
        help="the environment as the package sees it, and what stands in the way of training",
        description="Print Python, NumPy and Paddle (build, CUDA, cuDNN, the GPUs its "
        "kernels cover), the devices, the unscale path a scaler takes here and why, and "
        "the compiled CPU helper's state. Exits with 1, saying how to fix it, when "
        "something cannot work; builds nothing.",
    )
    doctor.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    doctor.set_defaults(run=run_doctor)
    inspect = commands.add_parser(
        "inspect",
        help="what a checkpoint written by save_checkpoint holds",
        description="Verify a checkpoint and print what it holds: step, format, the Paddle "
        "that wrote it, the scaler's state, the models and optimizers, the RNG state and "
        "the extra entries. Objects in extra are named, never built: inspecting a file "
        "runs no code from it. Exits with 1 for a file that is no readable checkpoint.",
    )
    inspect.add_argument("path", help="the checkpoint file")
    inspect.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    inspect.set_defaults(run=run_inspect)
    return parser


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")


def _error(text: str) -> None:
    sys.stderr.write(f"error: {text}\n")


def _line(label: str, value: Any) -> str:
    return f"{label:<{WIDTH - 1}} {value}"


def _shown(path: str) -> str:
    """``path`` with the home folder as ``~``: reports get pasted into bug reports."""
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if path.startswith(home + os.sep) else path


# -- doctor: the facts -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GpuKernels:
    """What the installed Paddle's GPU kernels were compiled for: ``sass``, the compute
    capabilities with binaries (86 for sm_86), and ``ptx``, those carried as PTX that the
    driver can compile for newer GPUs; None where nobody says. ``source`` says who says."""

    sass: tuple[int, ...] | None
    ptx: tuple[int, ...] | None
    source: str


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One visible GPU: its compute capability and, if a Paddle kernel was tried on it,
    whether it ran (``probe_error`` None) or what it raised."""

    index: int
    name: str
    capability: tuple[int, int]
    probed: bool = False
    probe_error: str | None = None


@dataclasses.dataclass(frozen=True)
class Coverage:
    """Whether a GPU has kernels in this Paddle (None: cannot tell), and how."""

    covered: bool | None
    how: str


@dataclasses.dataclass(frozen=True)
class Facts:
    """The environment, as doctor gathered it."""

    package_file: str
    python: str
    python_executable: str
    numpy: str
    paddle: str
    paddle_commit: str
    paddle_distributions: tuple[str, ...]
    build: str  # "CPU", "CUDA", "ROCm", "XPU" or "custom device"
    cuda: str | None
    cudnn: str | None
    kernels: GpuKernels | None
    device: str
    gpus: tuple[Gpu, ...]
    other_devices: tuple[str, ...]
    helper: fused_cpu.BuildStatus
    unscale_path: str
    unscale_reason: str
    rng_in_checkpoints: bool | None


@dataclasses.dataclass(frozen=True)
class Finding:
    """Something doctor found: an ``error`` (training cannot work as installed) or a
    ``note``, each with its fix."""

    severity: str
    what: str
    fix: str


def gather_facts() -> Facts:
    """The facts of this environment. Builds nothing; runs one small Paddle kernel on
    each visible GPU, the test that settles whether its kernels cover it."""
    build = _build()
    helper = fused_cpu.build_status()
    device = str(paddle.device.get_device())
    loaded = None
    if not device.startswith("cpu") or helper.state in ("built", "disabled"):
        # Safe to ask: off the CPU, or with the helper built or off, this builds nothing.
        loaded = unscale_paths.default_unscale_path()
    path, reason = unscale_choice(device, helper, loaded)
    return Facts(
        package_file=os.path.dirname(os.path.abspath(checkpoint.__file__)),
        python=platform.python_version(),
        # abspath, not realpath: "run/../venv/bin/python" reads as the venv's, which a
        # resolved symlink (the base interpreter) would hide.
        python_executable=os.path.abspath(sys.executable),
        numpy=np.__version__,
        paddle=paddle.__version__,
        paddle_commit=str(paddle.version.commit),
        paddle_distributions=_paddle_distributions(),
        build=build,
        cuda=_version_or_none(paddle.version.cuda()),
        cudnn=_version_or_none(paddle.version.cudnn()),
        kernels=_gpu_kernels(build),
        device=device,
        gpus=_gpus(build),
        other_devices=_other_devices(),
        helper=helper,
        unscale_path=path,
        unscale_reason=reason,
        rng_in_checkpoints=_rng_in_checkpoints(),
    )


def _build() -> str:
    if paddle.is_compiled_with_rocm():
        return "ROCm"
    if paddle.is_compiled_with_cuda():
        return "CUDA"
    if paddle.is_compiled_with_xpu():
        return "XPU"
    if _other_devices():
        return "custom device"
    return "CPU"


def _version_or_none(value: Any) -> str | None:
    # A CPU build answers the string 'False'.
    text = str(value)
    return None if text in ("False", "None", "") else text


def _paddle_distributions() -> tuple[str, ...]:
    found = []
    for name in ("paddlepaddle", "paddlepaddle-gpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found.append(f"{name} {importlib.metadata.version(name)}")
    return tuple(found)


def _gpu_kernels(build: str) -> GpuKernels | None:
    if build != "CUDA":
        return None
    archs = getattr(paddle.version, "cuda_archs", None)
    listed = [int(arch) for arch in archs()] if archs is not None else []
    if listed:
        return GpuKernels(tuple(sorted(listed)), None, "paddle.version.cuda_archs()")
    if paddle.__version__.startswith("2.6"):
        return GpuKernels(
            PYPI_2_6_SASS,
            (),
            "not exposed by Paddle 2.6: the list of PyPI's paddlepaddle-gpu 2.6 wheels",
        )
    return GpuKernels(None, None, f"Paddle {paddle.__version__} does not expose it")


def _gpus(build: str) -> tuple[Gpu, ...]:
    if build != "CUDA":
        return ()
    gpus = []
    for index in range(paddle.device.cuda.device_count()):
        properties = paddle.device.cuda.get_device_properties(index)
        gpus.append(
            Gpu(
                index,
                str(properties.name),
                (int(properties.major), int(properties.minor)),
                probed=True,
                probe_error=_probe(index),
            )
        )
    return tuple(gpus)


def _probe(index: int) -> str | None:
    """None if an elementwise Paddle kernel runs on GPU ``index``, else what it raised.
    Elementwise, because cuBLAS and cuDNN bring kernels of their own for new GPUs where
    Paddle's own have none."""
    try:
        x = paddle.to_tensor([1.0, 2.0], place=paddle.CUDAPlace(index))
        float((x * 2.0).sum())
    except Exception as error:
        # Paddle's message opens with a C++ traceback; the line that names the error is
        # the one to show.
        lines = [line.strip() for line in str(error).splitlines() if line.strip(" -")]
        named = [line for line in lines if _no_kernel_image(line)]
        named = named or [line for line in lines if "Error" in line] or lines
        return (named[0] if named else type(error).__name__)[:300]
    return None


def _other_devices() -> tuple[str, ...]:
    try:
        return tuple(str(name) for name in paddle.device.get_available_custom_device())
    except Exception:  # Paddle without custom-device support
        return ()


def _rng_in_checkpoints() -> bool | None:
    try:
        return checkpoint.rng_state_survives_pickling()
    except Exception:  # a device that runs no kernel, which doctor reports on its own
        return None


# -- doctor: the verdicts, pure functions of the facts -----------------------------------


def unscale_choice(
    device: str, helper: fused_cpu.BuildStatus, loaded: str | None
) -> tuple[str, str]:
    """(path, why) of the unscale path a scaler built now takes. ``loaded`` is
    ``default_unscale_path()``'s answer where asking it builds nothing, else None."""
    paddle_path, fused_path = unscale_paths.PADDLE_PATH, unscale_paths.FUSED_CPU_PATH
    if not device.startswith("cpu"):
        return paddle_path, f"Paddle's kernels, as on every {device.split(':')[0]}"
    if helper.state == "disabled":
        why = helper.reason or "the environment"
        return paddle_path, f"Paddle's kernels: {why} turns the compiled helper off"
    if helper.state == "failed":
        return paddle_path, "Paddle's kernels: the compiled helper failed to build"
    if helper.state == "built":
        if loaded == fused_path:
            return fused_path, "the compiled helper, on a CPU"
        return paddle_path, "Paddle's kernels: the built helper could not be loaded"
    return (
        fused_path,
        "the compiled helper, on a CPU, once built: the first scaler made here builds it "
        "(about 15 s, once), or uses Paddle's kernels if it cannot",
    )


def gpu_coverage(gpu: Gpu, kernels: GpuKernels | None) -> Coverage:
    """Whether ``kernels`` cover ``gpu``: a binary for its major version at or below its
    minor one, or PTX at or below its compute capability, which the driver compiles. A
    kernel tried on the GPU settles it either way."""
    major, minor = gpu.capability
    capability = major * 10 + minor
    if gpu.probe_error is not None:
        if _no_kernel_image(gpu.probe_error):
            return Coverage(False, f"a Paddle kernel found no image for it: {gpu.probe_error}")
        return Coverage(None, f"a Paddle kernel failed on it: {gpu.probe_error}")
    listed = _listed_coverage(capability, kernels)
    if gpu.probed and listed.covered is not True:
        return Coverage(True, "a Paddle kernel ran on it")
    return listed


def _listed_coverage(capability: int, kernels: GpuKernels | None) -> Coverage:
    if kernels is None or kernels.sass is None:
        source = kernels.source if kernels is not None else "nobody says"
        return Coverage(None, f"the architectures Paddle's kernels were built for: {source}")
    # A binary runs on its own major version, from its minor version up.
    major = capability // 10
    binaries = [arch for arch in kernels.sass if arch // 10 == major and arch <= capability]
    if binaries:
        return Coverage(True, f"sm_{max(binaries)} binaries")
    ptx = [arch for arch in kernels.ptx or () if arch <= capability]
    if ptx:
        return Coverage(
            True, f"PTX for compute_{max(ptx)}, compiled by the driver on first use (slow start)"
        )
    built_for = ", ".join(f"sm_{arch}" for arch in kernels.sass)
    if kernels.ptx is None:
        ptx_note = "and Paddle does not say whether it has PTX (its release builds have none)"
    else:
        ptx_note = "and no PTX"
    return Coverage(False, f"no binary for sm_{capability} among {built_for}, {ptx_note}")


def _no_kernel_image(message: str) -> bool:
    return any(
        mark in message
        for mark in ("cudaErrorNoKernelImageForDevice", "no kernel image", "error(209)")
    )


def findings(facts: Facts) -> list[Finding]:
    """What stands in the way of training (errors) or is worth knowing (notes)."""
    found = []
    if _release(facts.paddle) < (2, 6):
        found.append(
            Finding(
                "error",
                f"Paddle {facts.paddle} is older than 2.6, the oldest this package supports",
                "python -m pip install --upgrade paddlepaddle (or paddlepaddle-gpu)",
            )
        )
    if len(facts.paddle_distributions) > 1:
        found.append(
            Finding(
                "note",
                f"both {' and '.join(facts.paddle_distributions)} are installed: they write "
                "the same files, and uninstalling either breaks the other",
                "python -m pip uninstall paddlepaddle paddlepaddle-gpu, then install the one "
                "for this machine",
            )
        )
    for gpu in facts.gpus:
        coverage = gpu_coverage(gpu, facts.kernels)
        if coverage.covered is False:
            found.append(
                Finding(
                    "error",
                    f"{_gpu_name(gpu)} has no kernels in Paddle {facts.paddle}: "
                    f"{coverage.how}; every Paddle operation on it fails with "
                    "cudaErrorNoKernelImageForDevice",
                    _fix_for_uncovered(gpu, facts.paddle),
                )
            )
        elif gpu.probe_error is not None:
            found.append(
                Finding(
                    "error",
                    f"{_gpu_name(gpu)} runs no Paddle kernel: {gpu.probe_error}",
                    f"check the driver (nvidia-smi) supports CUDA {facts.cuda}, the CUDA "
                    "this Paddle was built with",
                )
            )
    if facts.build == "CUDA" and not facts.gpus:
        found.append(
            Finding(
                "note",
                "Paddle is a CUDA build but sees no GPU: training runs on the CPU",
                "check nvidia-smi and CUDA_VISIBLE_DEVICES",
            )
        )
    if facts.helper.state == "failed" and facts.device.startswith("cpu"):
        log = f"; its output is in {facts.helper.log_file}" if facts.helper.log_file else ""
        found.append(
            Finding(
                "note",
                "the compiled CPU helper failed to build"
                + (f" ({facts.helper.reason})" if facts.helper.reason else "")
                + ": on a CPU the scaler uses Paddle's kernels, with the same results, a few "
                "times slower",
                f"install a C++ compiler (g++){log}",
            )
        )
    if _release(facts.paddle)[:2] == (2, 6) and _release(facts.numpy) >= (2,):
        found.append(
            Finding(
                "note",
                f"Paddle 2.6 with NumPy {facts.numpy}: numpy.random imported for the first "
                "time after paddle fails (Paddle 2.6 loads its own zlib)",
                "import numpy.random (or scikit-learn) before paddle in your scripts",
            )
        )
    return found


def _fix_for_uncovered(gpu: Gpu, paddle_version: str) -> str:
    newer_cuda = (
        f" (compute capability {gpu.capability[0]}.{gpu.capability[1]} needs a build for "
        f"CUDA 12.8 or newer: {PADDLE_INSTALL_PAGE} lists them)"
        if gpu.capability[0] >= 10
        else ""
    )
    if _release(paddle_version) < (3,):
        return (
            "PyPI's paddlepaddle-gpu stops at 2.6.2, whose kernels cover sm_61 to sm_86 with "
            "no PTX. Install a CUDA 12 build of Paddle 3.x from Paddle's own package index: "
            f"python -m pip install --upgrade paddlepaddle-gpu -i {PADDLE_INDEX}{newer_cuda}"
        )
    return (
        "install the build of Paddle 3.x for this GPU's CUDA from Paddle's own package "
        f"index ({PADDLE_INSTALL_PAGE}){newer_cuda}"
    )


def _gpu_name(gpu: Gpu) -> str:
    major, minor = gpu.capability
    return f"GPU {gpu.index} ({gpu.name}, compute capability {major}.{minor})"


def _release(version: str) -> tuple[int, ...]:
    """The numbers a version starts with ("3.0.0rc1": 3, 0, 0); Paddle's develop builds,
    numbered 0.0.0, count as the newest."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    numbers = tuple(int(number) for number in found[0].split(".")) if found else ()
    return (sys.maxsize,) if numbers and not any(numbers) else numbers


# -- doctor: the report ------------------------------------------------------------------


def doctor_report(facts: Facts, found: Sequence[Finding]) -> str:
    """What ``doctor`` prints: a line per fact, then the findings."""
    gpu_build = facts.build in ("CUDA", "ROCm")
    none = f"none ({facts.build} build)"
    distributions = ", ".join(facts.paddle_distributions) or "no pip distribution"
    lines = [
        _line("paddle_amp_scaler", f"{__version__} ({_shown(facts.package_file)})"),
        _line("Python", f"{facts.python} ({_shown(facts.python_executable)})"),
        _line("NumPy", facts.numpy),
        _line(
            "Paddle",
            f"{facts.paddle}, {facts.build} build ({distributions}, "
            f"commit {facts.paddle_commit[:12]})",
        ),
        _line("CUDA", facts.cuda or none),
        _line("cuDNN", facts.cudnn or none),
        _line("GPU kernels for", _kernels_text(facts.kernels) if gpu_build else none),
        _line("devices", _devices_text(facts)),
    ]
    lines += [
        _line("", f"{_gpu_name(gpu)}: {_coverage_text(gpu_coverage(gpu, facts.kernels))}")
        for gpu in facts.gpus
    ]
    lines += [
        _line("unscale path", f"{facts.unscale_path}: {facts.unscale_reason}"),
        _line("compiled helper", _helper_text(facts.helper)),
        _line("checkpoints", _rng_text(facts.rng_in_checkpoints)),
        "",
    ]
    errors = [finding for finding in found if finding.severity == "error"]
    for finding in found:
        lines += [f"{finding.severity}: {finding.what}", f"  fix: {finding.fix}"]
    if not errors:
        lines.append("Nothing here stands in the way of training.")
    return "\n".join(lines)


def _kernels_text(kernels: GpuKernels | None) -> str:
    if kernels is None or kernels.sass is None:
        return f"not exposed ({kernels.source if kernels else 'no list'})"
    sass = " ".join(f"sm_{arch}" for arch in kernels.sass)
    if kernels.ptx is None:
        ptx = "PTX not exposed"
    else:
        ptx = " ".join(f"compute_{arch}" for arch in kernels.ptx) or "no PTX"
    return f"{sass}; {ptx} ({kernels.source})"


def _devices_text(facts: Facts) -> str:
    names = ["cpu"] + [f"gpu:{gpu.index}" for gpu in facts.gpus] + list(facts.other_devices)
    return ", ".join(names) + f" (current: {facts.device})"


def _coverage_text(coverage: Coverage) -> str:
    verdict = {True: "covered", False: "NOT covered", None: "cannot tell"}[coverage.covered]
    return f"{verdict}, {coverage.how}"


def _helper_text(helper: fused_cpu.BuildStatus) -> str:
    text = f"{helper.state}, in {_shown(helper.directory)}"
    if helper.reason and helper.state != "disabled":
        text += f" ({helper.reason})"
    if helper.log_file:
        text += f"; log: {_shown(helper.log_file)}"
    return text


def _rng_text(survives: bool | None) -> str:
    if survives is None:
        return "cannot tell whether Paddle can save its random generator's position"
    if survives:
        return "save the random generator's position: dropout repeats after a resume"
    return (
        "leave the random generator out: this Paddle cannot save its position, so dropout "
        "draws other numbers after a resume"
    )


def run_doctor(args: argparse.Namespace) -> int:
    facts = gather_facts()
    found = findings(facts)
    if args.json:
        _write(
            json.dumps(
                {
                    "ok": not any(finding.severity == "error" for finding in found),
                    "facts": dataclasses.asdict(facts),
                    "gpu_coverage": [
                        dataclasses.asdict(gpu_coverage(gpu, facts.kernels)) for gpu in facts.gpus
                    ],
                    "findings": [dataclasses.asdict(finding) for finding in found],
                }
            )
        )
    else:
        _write(doctor_report(facts, found))
    return 1 if any(finding.severity == "error" for finding in found) else 0


# -- inspect -------------------------------------------------------------------------------


def run_inspect(args: argparse.Namespace) -> int:
    try:
        content = checkpoint.inspect_checkpoint(args.path)
    except (checkpoint.CheckpointError, OSError) as error:
        _error(str(error))
        return 1
    summary = summarize(args.path, content)
    _write(json.dumps(summary) if args.json else inspect_report(summary))
    return 0 if summary["scaler"].get("error") is None else 1


def summarize(path: str, content: checkpoint.Checkpoint) -> dict[str, Any]:
    """A checkpoint's content as plain JSON values."""
    return {
        "path": path,
        "format_version": content.format_version,
        "checksum": "holds",
        "paddle_version": content.paddle_version,
        "step": content.step,
        "scaler": _scaler_summary(content.scaler),
        "models": [_model_summary(model) for model in content.models],
        "optimizers": [_optimizer_summary(optimizer) for optimizer in content.optimizers],
        "rng": _rng_summary(content.rng),
        "extra": _value_summary(content.extra),
    }


def _scaler_summary(state: Mapping[str, Any]) -> dict[str, Any]:
    if not state:
        return {"enabled": False}
    try:
        saved = parse_state_dict(state)
    except (TypeError, ValueError) as error:
        return {"enabled": True, "error": str(error)}
    bounds = saved.bounds
    return {
        "enabled": True,
        "dynamic": saved.use_dynamic_loss_scaling,
        "scale": saved.scale,
        "incr_count": saved.incr_count,
        "decr_count": saved.decr_count,
        "incr_ratio": saved.incr_ratio,
        "decr_ratio": saved.decr_ratio,
        "incr_every_n_steps": saved.incr_every_n_steps,
        "decr_every_n_nan_or_inf": saved.decr_every_n_nan_or_inf,
        "policy": saved.policy or "interval",
        "headroom": saved.headroom,
        "min_loss_scaling": bounds[0] if bounds else None,
        "max_loss_scaling": bounds[1] if bounds else None,
        "bounds_saved": bounds is not None,
        "stats": _counts_of(saved.stats),
    }


def _counts_of(stats: ScalerStats | None) -> dict[str, Any] | None:
    """The counts a state dict saves: a ScalerStats but its scale and headroom, which
    the state dict keeps elsewhere."""
    if stats is None:
        return None
    counts = dataclasses.asdict(stats)
    del counts["scale"], counts["headroom_bits"]
    return counts


def _model_summary(model: Mapping[str, Any]) -> dict[str, Any]:
    entries = {name: _array_summary(value) for name, value in model.items()}
    return {
        "tensors": len(entries),
        "values": sum(int(np.prod(entry.get("shape", []))) for entry in entries.values()),
        "entries": entries,
    }


def _optimizer_summary(optimizer: Mapping[str, Any]) -> dict[str, Any]:
    accumulators: dict[str, int] = {}
    for _, suffix in optimizer.get("accumulators", {}):
        # Paddle names an accumulator after its parameter: "linear_0.w_0" + "_moment1_0".
        name = suffix.lstrip("_")
        accumulators[name] = accumulators.get(name, 0) + 1
    return {
        "parameters": optimizer.get("parameter_count"),
        "accumulators": accumulators,
        "master_weights": len(optimizer.get("master_weights", {})),
        "other": sorted(str(key) for key in optimizer.get("other", {})),
    }


def _rng_summary(rng: Mapping[str, Any] | None) -> dict[str, Any]:
    if rng is None:
        return {"saved": False}
    return {"saved": True, "device": str(rng.get("device")), "generators": len(rng["states"])}


def _array_summary(value: Any) -> dict[str, Any]:
    if isinstance(value, np.ndarray):
        return {"type": "ndarray", "shape": list(value.shape), "dtype": str(value.dtype)}
    return _value_summary(value)


def _value_summary(value: Any) -> dict[str, Any]:
    """A value of extra: its type, the value itself if short, what it holds if a
    container; an object left unbuilt by its class's name."""
    if isinstance(value, checkpoint.NotLoaded) or (
        isinstance(value, type) and issubclass(value, checkpoint.NotLoaded)
    ):
        return {"type": "object", "class": f"{value.module}.{value.name}", "loaded": False}
    if isinstance(value, np.ndarray):
        return _array_summary(value)
    summary: dict[str, Any] = {"type": type(value).__name__}
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        if isinstance(value, dict):
            summary["entries"] = {str(key): _value_summary(entry) for key, entry in value.items()}
        else:
            summary["length"] = len(value)
        unbuilt = {f"{kind.module}.{kind.name}" for _, kind in checkpoint.not_loaded_in(value, "")}
        if unbuilt:
            summary["not_loaded"] = sorted(unbuilt)
        return summary
    plain = _plain(value)
    if (isinstance(plain, (bool, int, float, str)) or plain is None) and len(repr(plain)) <= 60:
        summary["value"] = plain
    return summary


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def _none(value: Any) -> Any:
    return "none" if value is None else value


def inspect_report(summary: Mapping[str, Any]) -> str:
    """What ``inspect`` prints: a line per fact, indented lines for the parts."""
    lines = [
        _line("checkpoint", summary["path"]),
        _line("format", f"version {summary['format_version']}, SHA-256 checksum holds"),
        _line("written with", f"Paddle {summary['paddle_version'] or '(not recorded)'}"),
        _line("step", summary["step"]),
    ]
    lines += _scaler_lines(summary["scaler"])
    lines.append(_line("models", len(summary["models"])))
    for index, model in enumerate(summary["models"]):
        lines.append(_line(f"  model {index}", _model_text(model)))
    lines.append(_line("optimizers", len(summary["optimizers"])))
    for index, optimizer in enumerate(summary["optimizers"]):
        lines.append(_line(f"  optimizer {index}", _optimizer_text(optimizer)))
    rng = summary["rng"]
    lines.append(
        _line(
            "RNG state",
            f"saved ({rng['device']}, {rng['generators']} generator"
            f"{'s' if rng['generators'] != 1 else ''})"
            if rng["saved"]
            else "not saved (the Paddle that wrote it cannot save its position)",
        )
    )
    lines += _extra_lines(summary["extra"])
    return "\n".join(lines)


def _scaler_lines(scaler: Mapping[str, Any]) -> list[str]:
    if not scaler["enabled"]:
        return [_line("scaler", "disabled (saved from GradScaler(enable=False))")]
    if scaler.get("error"):
        return [_line("scaler", f"its state does not parse: {scaler['error']}")]
    kind = "dynamic loss scaling" if scaler["dynamic"] else "static loss scaling"
    stats = scaler["stats"]
    bounds = (
        f"min_loss_scaling {scaler['min_loss_scaling']}, "
        f"max_loss_scaling {_none(scaler['max_loss_scaling'])}"
        if scaler["bounds_saved"]
        else "not saved (Paddle's own defaults apply)"
    )
    lines = [
        _line("scaler", kind),
        _line("  scale", scaler["scale"]),
        _line(
            "  counters", f"incr_count {scaler['incr_count']}, decr_count {scaler['decr_count']}"
        ),
        _line("  ratios", f"incr_ratio {scaler['incr_ratio']}, decr_ratio {scaler['decr_ratio']}"),
        _line(
            "  periods",
            f"incr_every_n_steps {scaler['incr_every_n_steps']}, "
            f"decr_every_n_nan_or_inf {scaler['decr_every_n_nan_or_inf']}",
        ),
        _line("  policy", scaler["policy"]),
        _line("  bounds", bounds),
    ]
    memory = scaler["headroom"]
    if memory is not None:
        headroom = headroom_bits(memory["amax"])
        grown_at = memory["grown_at"] if memory["grown_at"] >= 0 else None
        lines.append(
            _line(
                "  headroom",
                f"margin {memory['margin']} bits, last amax {memory['amax']:g}"
                + ("" if headroom is None else f" ({headroom:.2f} bits below float16's top)")
                + f", last grew at iteration {_none(grown_at)}",
            )
        )
    if stats is not None:
        counts = [f"{key} {_none(value)}" for key, value in stats.items()]
        lines.append(_line("  stats", ", ".join(counts)))
    return lines


def _model_text(model: Mapping[str, Any], shown: int = 4) -> str:
    entries = list(model["entries"].items())
    parts = [f"{name} {_shape_text(entry)}" for name, entry in entries[:shown]]
    if len(entries) > shown:
        parts.append(f"... ({len(entries) - shown} more)")
    return f"{model['tensors']} tensors, {model['values']:,} values: " + ", ".join(parts)


def _shape_text(entry: Mapping[str, Any]) -> str:
    if entry["type"] == "ndarray":
        return f"{entry['shape']} {entry['dtype']}"
    return str(entry["type"])


def _optimizer_text(optimizer: Mapping[str, Any]) -> str:
    counts = optimizer["accumulators"].items()
    accumulators = ", ".join(f"{name} x{count}" for name, count in counts)
    parts = [
        f"{optimizer['parameters']} parameters",
        f"accumulators: {accumulators or 'none'}",
        f"master weights: {optimizer['master_weights'] or 'none'}",
    ]
    if optimizer["other"]:
        parts.append("also " + ", ".join(optimizer["other"]))
    return "; ".join(parts)


def _extra_lines(extra: Mapping[str, Any]) -> list[str]:
    if extra["type"] == "NoneType":
        return [_line("extra", "none")]
    if "entries" not in extra:
        return [_line("extra", _value_text(extra))]
    count = len(extra["entries"])
    lines = [_line("extra", f"{extra['type']} of {count} {'entry' if count == 1 else 'entries'}")]
    lines += [_line(f"  {key}", _value_text(entry)) for key, entry in extra["entries"].items()]
    return lines


def _value_text(entry: Mapping[str, Any]) -> str:
    kind = entry["type"]
    if kind == "object":
        return (
            f"an object built by {entry['class']}, not loaded: building it runs code from "
            "the file, which read_checkpoint(path, trust_extra=True) does"
        )
    if kind == "ndarray":
        return f"ndarray {entry['shape']} {entry['dtype']}"
    if "entries" in entry or "length" in entry:
        count = len(entry["entries"]) if "entries" in entry else entry["length"]
        text = f"{kind} of {count}"
        if entry.get("not_loaded"):
            text += f", holding objects not loaded: {', '.join(entry['not_loaded'])}"
        return text
    if "value" in entry:
        return f"{kind} {entry['value']!r}"
    return str(kind)
