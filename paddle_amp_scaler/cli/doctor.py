"""``doctor``: whether this environment can train, and what to do where it cannot.

Built as facts, then verdicts, then a report. The verdicts are pure functions of the
facts (``Facts``, ``Gpu``), so that the cases no test machine has, a GPU newer than the
installed Paddle's kernels above all, are tested with facts written by hand. Every fact
is read from Paddle at run time, none from a table of releases that would go stale:
where Paddle does not list the architectures its kernels were built for (Paddle 2.6 has
no ``paddle.version.cuda_archs()``), one kernel tried on each GPU decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import sys
from collections.abc import Iterator, Sequence

import numpy as np
import paddle

from .._version import __version__
from .report import line

PADDLE_INSTALL_PAGE = "https://www.paddlepaddle.org.cn/en/install/quick"


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One visible GPU: its compute capability, and what a Paddle kernel tried on it
    raised (None: it ran).
    """

    index: int
    name: str
    capability: tuple[int, int]
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
    paddle_distributions: tuple[str, ...]
    build: str  # "CPU", "CUDA", "ROCm", "XPU" or "custom device"
    cuda: str | None
    # The compute capabilities Paddle's kernels were compiled for (86 for sm_86), as
    # paddle.version.cuda_archs() lists them; None where Paddle does not list them.
    cuda_archs: tuple[int, ...] | None
    device: str
    gpus: tuple[Gpu, ...]
    other_devices: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Finding:
    """Something doctor found: an ``error`` (training cannot work as installed) or a
    ``note``, each with its fix.
    """

    severity: str
    what: str
    fix: str


def gather_facts() -> Facts:
    """The facts of this environment, read from Paddle; one small Paddle kernel runs on
    each visible GPU, the test that settles whether its kernels cover it.
    """
    try:
        other_devices = tuple(str(name) for name in paddle.device.get_available_custom_device())
    except Exception:  # Paddle without custom-device support
        other_devices = ()
    if paddle.is_compiled_with_rocm():
        build = "ROCm"
    elif paddle.is_compiled_with_cuda():
        build = "CUDA"
    elif paddle.is_compiled_with_xpu():
        build = "XPU"
    else:
        build = "custom device" if other_devices else "CPU"
    distributions = []
    for name in ("paddlepaddle", "paddlepaddle-gpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            distributions.append(f"{name} {importlib.metadata.version(name)}")
    gpus = []
    for index in range(paddle.device.cuda.device_count() if build == "CUDA" else 0):
        gpu = paddle.device.cuda.get_device_properties(index)
        gpus.append(Gpu(index, str(gpu.name), (int(gpu.major), int(gpu.minor)), _probe(index)))
    cuda = str(paddle.version.cuda())  # a CPU build answers 'False'
    return Facts(
        package_file=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        python=platform.python_version(),
        # abspath, not realpath: "run/../venv/bin/python" reads as the venv's, which a
        # resolved symlink (the base interpreter) would hide.
        python_executable=os.path.abspath(sys.executable),
        numpy=np.__version__,
        paddle=paddle.__version__,
        paddle_distributions=tuple(distributions),
        build=build,
        cuda=None if cuda in ("False", "None", "") else cuda,
        cuda_archs=_cuda_archs(build),
        device=str(paddle.device.get_device()),
        gpus=tuple(gpus),
        other_devices=other_devices,
    )


def _cuda_archs(build: str) -> tuple[int, ...] | None:
    listing = getattr(paddle.version, "cuda_archs", None)  # Paddle 3 has it, 2.6 not
    if build != "CUDA" or listing is None:
        return None
    return tuple(sorted(int(arch) for arch in listing())) or None


def _probe(index: int) -> str | None:
    """None if an elementwise Paddle kernel runs on GPU ``index``, else what it raised.
    Elementwise, because cuBLAS and cuDNN bring kernels of their own for new GPUs where
    Paddle's own have none.
    """
    try:
        x = paddle.to_tensor([1.0, 2.0], place=paddle.CUDAPlace(index))
        float((x * 2.0).sum())
    except Exception as error:
        # Paddle's message opens with a C++ traceback; the line that names the error is
        # the one to show.
        lines = [text.strip() for text in str(error).splitlines() if text.strip(" -")]
        named = [text for text in lines if _no_kernel_image(text)]
        named = named or [text for text in lines if "Error" in text] or lines
        return (named[0] if named else type(error).__name__)[:300]
    return None


def gpu_coverage(gpu: Gpu, cuda_archs: tuple[int, ...] | None) -> Coverage:
    """Whether Paddle's kernels cover ``gpu``: the kernel tried on it decides, since the
    listed architectures leave out the PTX the driver may compile; the list says why.
    """
    major, minor = gpu.capability
    # A binary runs on its own major version, from its minor version up.
    binaries = [arch for arch in cuda_archs or () if arch // 10 == major and arch % 10 <= minor]
    if cuda_archs is None:
        listed = "cannot tell from the listed architectures: Paddle lists none"
    elif binaries:
        listed = f"sm_{max(binaries)} binaries"
    else:
        listed = f"no binary for sm_{major}{minor} among " + ", ".join(
            f"sm_{arch}" for arch in cuda_archs
        )
    if gpu.probe_error is None:
        return Coverage(True, f"a Paddle kernel ran on it ({listed})")
    if _no_kernel_image(gpu.probe_error):
        return Coverage(False, f"a Paddle kernel found no image for it ({listed})")
    return Coverage(None, f"a Paddle kernel failed on it: {gpu.probe_error} ({listed})")


def _no_kernel_image(message: str) -> bool:
    return any(
        mark in message
        for mark in ("cudaErrorNoKernelImageForDevice", "no kernel image", "error(209)")
    )


def findings(facts: Facts) -> Iterator[Finding]:
    """What stands in the way of training (errors) or is worth knowing (notes)."""
    if _release(facts.paddle) < (2, 6):
        yield Finding(
            "error",
            f"Paddle {facts.paddle} is older than 2.6, the oldest this package supports",
            "python -m pip install --upgrade paddlepaddle (or paddlepaddle-gpu)",
        )
    if len(facts.paddle_distributions) > 1:
        yield Finding(
            "note",
            f"both {' and '.join(facts.paddle_distributions)} are installed: they write "
            "the same files, and uninstalling either breaks the other",
            "python -m pip uninstall paddlepaddle paddlepaddle-gpu, then install the one "
            "for this machine",
        )
    for gpu in facts.gpus:
        coverage = gpu_coverage(gpu, facts.cuda_archs)
        if coverage.covered is False:
            major, minor = gpu.capability
            fix = f"install a build of Paddle with kernels for sm_{major}{minor}: "
            fix += f"{PADDLE_INSTALL_PAGE} lists the builds for each CUDA"
            if major >= 10:
                # A fact of CUDA's, which no release of Paddle's changes: no CUDA before
                # 12.8 compiles for compute capability 10 and above.
                fix += f" (compute capability {major}.{minor} needs CUDA 12.8 or newer)"
            yield Finding(
                "error",
                f"{_gpu_name(gpu)} has no kernels in Paddle {facts.paddle}: {coverage.how}; "
                "every Paddle operation on it fails with cudaErrorNoKernelImageForDevice",
                fix,
            )
        elif gpu.probe_error is not None:
            yield Finding(
                "error",
                f"{_gpu_name(gpu)} runs no Paddle kernel: {gpu.probe_error}",
                f"check the driver (nvidia-smi) supports CUDA {facts.cuda}, the CUDA "
                "this Paddle was built with",
            )
    if facts.build == "CUDA" and not facts.gpus:
        yield Finding(
            "note",
            "Paddle is a CUDA build but sees no GPU: training runs on the CPU",
            "check nvidia-smi and CUDA_VISIBLE_DEVICES",
        )
    if _release(facts.paddle)[:2] == (2, 6) and _release(facts.numpy) >= (2,):
        yield Finding(
            "note",
            f"Paddle 2.6 with NumPy {facts.numpy}: numpy.random imported for the first "
            "time after paddle fails (Paddle 2.6 loads its own zlib)",
            "import numpy.random (or scikit-learn) before paddle in your scripts",
        )


def _gpu_name(gpu: Gpu) -> str:
    major, minor = gpu.capability
    return f"GPU {gpu.index} ({gpu.name}, compute capability {major}.{minor})"


def _release(version: str) -> tuple[int, ...]:
    """The numbers a version starts with ("3.0.0rc1": 3, 0, 0); Paddle's develop builds,
    numbered 0.0.0, count as the newest.
    """
    found = re.match(r"\d+(?:\.\d+)*", version)
    numbers = tuple(int(number) for number in found[0].split(".")) if found else ()
    return (sys.maxsize,) if numbers and not any(numbers) else numbers


def run(as_json: bool) -> int:
    """Gather, judge, print; 1 when something cannot work."""
    facts = gather_facts()
    found = list(findings(facts))
    coverages = [gpu_coverage(gpu, facts.cuda_archs) for gpu in facts.gpus]
    ok = not any(finding.severity == "error" for finding in found)
    if as_json:
        report = {
            "ok": ok,
            "facts": dataclasses.asdict(facts),
            "gpu_coverage": [dataclasses.asdict(coverage) for coverage in coverages],
            "findings": [dataclasses.asdict(finding) for finding in found],
        }
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        sys.stdout.write(doctor_report(facts, coverages, found, ok) + "\n")
    return 0 if ok else 1


def doctor_report(
    facts: Facts, coverages: Sequence[Coverage], found: Sequence[Finding], ok: bool
) -> str:
    """What ``doctor`` prints: a line per fact, then the findings."""
    none = f"none ({facts.build} build)"
    kernels = none
    if facts.cuda_archs is not None:
        archs = " ".join(f"sm_{arch}" for arch in facts.cuda_archs)
        kernels = f"{archs} (paddle.version.cuda_archs())"
    elif facts.build in ("CUDA", "ROCm"):
        kernels = f"not listed by Paddle {facts.paddle}: a kernel tried on each GPU decides"
    distributions = ", ".join(facts.paddle_distributions) or "no pip distribution"
    devices = ["cpu"] + [f"gpu:{gpu.index}" for gpu in facts.gpus] + list(facts.other_devices)
    verdicts = {True: "covered", False: "NOT covered", None: "cannot tell"}
    lines = [
        line("paddle_amp_scaler", f"{__version__} ({_shown(facts.package_file)})"),
        line("Python", f"{facts.python} ({_shown(facts.python_executable)})"),
        line("NumPy", facts.numpy),
        line("Paddle", f"{facts.paddle}, {facts.build} build ({distributions})"),
        line("CUDA", facts.cuda or none),
        line("GPU kernels for", kernels),
        line("devices", ", ".join(devices) + f" (current: {facts.device})"),
        *(
            line("", f"{_gpu_name(gpu)}: {verdicts[coverage.covered]}, {coverage.how}")
            for gpu, coverage in zip(facts.gpus, coverages)
        ),
        "",
    ]
    for finding in found:
        lines += [f"{finding.severity}: {finding.what}", f"  fix: {finding.fix}"]
    if ok:
        lines.append("Nothing here stands in the way of training.")
    return "\n".join(lines)


def _shown(path: str) -> str:
    """``path`` with the home folder as ``~``: reports get pasted into bug reports."""
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if path.startswith(home + os.sep) else path
