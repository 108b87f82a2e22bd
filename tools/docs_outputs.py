#!/usr/bin/env python
"""The outputs the documentation shows, regenerated from the code that prints them.

A page marks each such block with the command that made it and the Paddle it ran on,
then any of these options after the version:

- ", stdout": the command's standard output alone;
- ", after the Python block above": the page's last Python block before the mark runs
  first, in a fresh folder, and the command runs there (on the files it wrote);
- ", varies by machine": the output describes the machine (versions, paths), so
  `--check` compares only the labels that start its lines;
- ", rank 0": the command starts ranks with Paddle's launcher, whose console carries
  rank 0's output among Paddle's own log lines (its loggers' records, glog's lines, the
  banner of the flags the launcher set): the block shows rank 0's lines without them.

    <!-- output: python examples/monitor_a_run.py (Paddle 3.3.1) -->
    ```text
    ...
    ```

`make docs-output` reruns every command in a fresh folder (a script named by its path in
the repository, so that what it writes stays out of the checkout) and writes its output
(stdout and stderr, as a terminal shows them) into the block. With `--check` it writes
nothing and fails where a block differs from a fresh run on the same Paddle (durations
aside); a block recorded on another Paddle, or whose command cannot run here (an optional
library missing), is reported and left alone.
"""

from __future__ import annotations

import difflib
import functools
import glob
import os
import re
import subprocess
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKED = re.compile(
    r"<!-- output: (?P<command>python [^\n]+?) "
    r"\(Paddle (?P<paddle>[\w.]+)(?P<options>(?:, [\w ]+)*)\) -->\n"
    r"```text\n(?P<body>.*?)```",
    re.S,
)
STDOUT, AFTER_BLOCK, VARIES = "stdout", "after the Python block above", "varies by machine"
RANK_ZERO = "rank 0"
PADDLE_LOG_LINE = re.compile(
    r"\[\d{4}-\d\d-\d\d [\d:,]+\] \[ *[A-Z]+\] "  # Paddle's Python loggers
    r"|[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] "  # glog, from Paddle's C++
    r"|=+( Modified FLAGS detected =+)?$|FLAGS\(name="  # the flags' banner
)
PYTHON_BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.S | re.M)


def pages() -> list[str]:
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


# A page may quote one command twice (the demo's summary, on the README and the landing
# page): it runs once.
@functools.cache
def run(
    command: str, stdout_only: bool, setup: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``command``'s output in a fresh folder, after ``setup`` (Python code) if given."""
    arguments = [sys.executable, *command.split()[1:]]
    # The script: the first argument, or the first .py one after a module and its options
    # (`-m paddle.distributed.launch --nproc_per_node 2 examples/...py`).
    for index in [1] + [i for i, argument in enumerate(arguments) if argument.endswith(".py")]:
        script = os.path.join(ROOT, arguments[index])
        if os.path.isfile(script):
            arguments[index] = script
            break
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    # This checkout's package, wherever the command runs: a script or a fresh folder would
    # otherwise find whatever copy is installed.
    environment["PYTHONPATH"] = ROOT

    def execute(arguments: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            arguments,
            cwd=cwd,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stdout_only else subprocess.STDOUT,
            text=True,
            timeout=600,
        )

    with tempfile.TemporaryDirectory() as folder:
        if setup is not None:
            prepared = execute([sys.executable, "-c", setup], folder)
            if prepared.returncode != 0:
                return prepared
        return execute(arguments, folder)


def rank_zero_lines(output: str) -> str:
    """What rank 0 printed, from a launcher's console (or rank 0's log): the lines in no
    format of Paddle's own logs."""
    lines = (line.rstrip() for line in output.strip().splitlines())
    return "\n".join(line for line in lines if not PADDLE_LOG_LINE.match(line))


def labels(output: str) -> list[str]:
    """What starts each line, up to two spaces (or its first word, where the label fills
    its column and one space parts it from the value): the part of a report that is no
    value."""
    return [re.match(r"(.*?) {2,}|\S*", line.strip())[0].rstrip() for line in output.splitlines()]


# Durations (paddle.Model's progress bar prints "3ms/step", the demo "8.6s on CPU") differ
# from run to run.
DURATION = re.compile(r"\b\d+(?:\.\d+)?(?:ms|us|s)\b")


def untimed(output: str) -> str:
    return DURATION.sub("<duration>", output)


def difference(shown: str, output: str) -> str:
    """The lines that differ, as a unified diff, so a failed check says where."""
    return "\n".join(
        difflib.unified_diff(
            shown.splitlines(), output.splitlines(), "page", "fresh run", lineterm=""
        )
    )


def paddle_version() -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Paddle 3's import-time note about ccache
        import paddle

    return str(paddle.__version__)


def refresh(page: str, check: bool) -> list[str]:
    """Rerun the marked commands of ``page``; return the problems found."""
    with open(page, encoding="utf-8") as source:
        text = source.read()
    problems, version = [], paddle_version()
    name = os.path.relpath(page, ROOT)

    def replace(match: re.Match[str]) -> str:
        command = match["command"]
        options = [option for option in match["options"].split(", ") if option]
        unknown = set(options) - {STDOUT, AFTER_BLOCK, VARIES, RANK_ZERO}
        if unknown:
            problems.append(f"{name}: `{command}` has unknown options {sorted(unknown)}")
            return match[0]
        if check and match["paddle"] != version:
            print(f"{name}: `{command}` was recorded on Paddle {match['paddle']}; not compared")
            return match[0]
        setup = None
        if AFTER_BLOCK in options:
            blocks = list(PYTHON_BLOCK.finditer(text, 0, match.start()))
            if not blocks:
                problems.append(f"{name}: `{command}` has no Python block above it")
                return match[0]
            setup = blocks[-1]["code"]
        result = run(command, STDOUT in options, setup)
        if result.returncode != 0:
            reason = (result.stderr or result.stdout or "")[-500:]
            print(f"{name}: `{command}` cannot run here, left as it was:\n{reason}")
            return match[0]
        output = "\n".join(line.rstrip() for line in result.stdout.strip().splitlines())
        if RANK_ZERO in options:
            output = rank_zero_lines(output)
        shown = match["body"].strip()
        if untimed(output) == untimed(shown):
            output = shown  # a page is not rewritten for its durations alone
        if VARIES in options:
            differs = labels(output) != labels(shown)
        else:
            differs = untimed(output) != untimed(shown)
        if check and differs:
            problems.append(
                f"{name}: the output of `{command}` is not what the page shows:\n"
                + difference(shown, output)
            )
        recorded = f"Paddle {version}{match['options']}"
        return f"<!-- output: {command} ({recorded}) -->\n```text\n{output}\n```"

    updated = MARKED.sub(replace, text)
    if not check and updated != text:
        with open(page, "w", encoding="utf-8") as target:
            target.write(updated)
        print(f"{name}: updated")
    return problems


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    if argv and not check:
        print(__doc__.strip())
        return 2
    problems = [problem for page in pages() for problem in refresh(page, check)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
