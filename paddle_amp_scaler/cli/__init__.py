"""``python -m paddle_amp_scaler``: ``doctor`` says whether this environment can train,
``inspect`` says what a checkpoint holds. This module reads the command line; each
command lives in its own module (``doctor``, ``inspection``) and writes its report to
standard output, its errors to standard error.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence

import paddle

from .._version import __version__
from . import doctor, inspection


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor.run(as_json=args.json)
    if args.command == "inspect":
        return inspection.run(args.path, as_json=args.json)
    parser.print_help(sys.stderr)
    return 2


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
    doctor_command = commands.add_parser(
        "doctor",
        help="the environment as the package sees it, and what stands in the way of training",
        description="Print Python, NumPy and Paddle (build, CUDA, the GPU architectures "
        "its kernels were built for, where Paddle lists them), the devices and whether "
        "Paddle's kernels cover each GPU (one small kernel is tried on each). Exits with 1, "
        "saying how to fix it, when something cannot work.",
    )
    inspect_command = commands.add_parser(
        "inspect",
        help="what a checkpoint written by save_checkpoint holds",
        description="Verify a checkpoint and print what it holds: step, format, the Paddle "
        "that wrote it, the scaler's state, the models and optimizers, the RNG state and "
        "the extra entries. Objects in extra are named, never built: inspecting a file "
        "runs no code from it. Exits with 1 for a file that is no readable checkpoint.",
    )
    inspect_command.add_argument("path", help="the checkpoint file")
    for command in (doctor_command, inspect_command):
        command.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    return parser
