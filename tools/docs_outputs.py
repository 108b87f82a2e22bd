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

and, after a semicolon, how far the numbers a training run prints may drift: on another
processor Paddle's CPU kernels round differently, and over hundreds of steps a run moves.
Each drift names a number by the words before it (back to two spaces, a `|`, `:`, `,`,
`;`, `(` or another number) and bounds it by a share of the page's value (`±8%`), a
difference (`±0.5`) or a factor (`×2`, where a printed `2^20` counts as 1048576); every
other number is held to the digit, and every word:

    <!-- output: python examples/monitor_a_run.py (Paddle 3.3.1) -->
    <!-- output: python examples/train.py (Paddle 3.3.1, stdout; drifts: loss ±8%, scale ×2) -->
    ```text
    ...
    ```

`make docs-output` reruns every command in a fresh folder (a script named by its path in
the repository, so that what it writes stays out of the checkout) and writes its output
(stdout and stderr, as a terminal shows them) into the block, unless the block's numbers
are within their drifts of the fresh run's (a page is not rewritten for another
processor's digits). With `--check` it writes nothing and fails where a block differs
from a fresh run on the same Paddle (durations and the drifts aside); a block recorded on
another Paddle, or whose command cannot run here (an optional library missing), is
reported and left alone. `--nudged up` (or `down`) runs each command with every
parameter a layer creates one float step off (tools/nudged/): a run drifts as it would
on another processor, and the drifts the pages allow must cover it.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import glob
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKED = re.compile(
    r"<!-- output: (?P<command>python [^\n]+?) "
    r"\(Paddle (?P<paddle>[\w.]+)(?P<options>(?:, [\w ]+)*)(?P<drifts>; drifts: [^)]+)?\) -->\n"
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
    command: str, stdout_only: bool, setup: str | None = None, nudged: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``command``'s output in a fresh folder, after ``setup`` (Python code) if given, its
    layers' parameters ``nudged`` one float step "up" or "down" if given."""
    arguments = [sys.executable, *command.split()[1:]]
    # The script: the first argument, or the first .py one after a module and its options
    # (`-m paddle.distributed.launch --nproc_per_node 2 examples/...py`).
    for index in [1] + [i for i, argument in enumerate(arguments) if argument.endswith(".py")]:
        script = os.path.join(ROOT, arguments[index])
        if os.path.isfile(script):
            arguments[index] = script
            break
    # Paddle prints a note of its own, on every import, where OMP_NUM_THREADS is above 1
    # (and sets it to 1 where it is unset): the pages show a run without it.
    unset = ("PYTHONPATH", "OMP_NUM_THREADS")
    environment = {key: value for key, value in os.environ.items() if key not in unset}
    # This checkout's package, wherever the command runs: a script or a fresh folder would
    # otherwise find whatever copy is installed. Nudged, the folder that nudges goes first.
    paths = [ROOT] if nudged is None else [os.path.join(ROOT, "tools", "nudged"), ROOT]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    if nudged is not None:
        environment["NUDGE_WEIGHTS"] = nudged

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


# A number stands alone: not a digit of a name (`0.weight`) or of an exponent (`2^20` is
# one number).
NUMBER = re.compile(
    r"(?<![\w.^])(?:2\^(?P<exponent>-?\d+)|(?P<value>-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)%?)(?![\w.])"
)
DRIFT = re.compile(r"(?P<name>\w[\w ]*?) (?P<kind>[±×])(?P<amount>\d+(?:\.\d+)?)(?P<share>%?)")


def drifts(marked: str | None) -> dict[str, re.Match[str]]:
    """The drifts a block's mark allows (what follows "; drifts: "), by name."""
    allowed: dict[str, re.Match[str]] = {}
    for text in marked.removeprefix("; drifts: ").split(",") if marked else []:
        drift = DRIFT.fullmatch(text.strip())
        if drift is None:
            raise ValueError(f"a drift is a name and ±N%, ±N or ×N, not {text.strip()!r}")
        allowed[drift["name"]] = drift
    return allowed


def numbers(line: str) -> tuple[str, list[tuple[str, str, float]]]:
    """``line`` with its numbers taken out (and its spacing evened), and each number as
    its name, its text and its value."""
    words, found, start = [], [], 0
    for match in NUMBER.finditer(line):
        before = line[start : match.start()]
        name = " ".join(re.split(r"[|,;:(]| - | {2,}", before.rstrip(" :="))[-1].split())
        exponent = match["exponent"]
        value = 2.0 ** int(exponent) if exponent else float(match["value"])
        words.append(" ".join(before.split()))
        found.append((name, match[0], value))
        start = match.end()
    return "#".join(words + [" ".join(line[start:].split())]), found


def within(drift: re.Match[str] | None, shown: float, fresh: float) -> bool:
    if drift is None:
        return False
    amount = float(drift["amount"])
    if drift["kind"] == "×":
        return shown / amount <= fresh <= shown * amount if shown > 0 else fresh == shown
    return abs(fresh - shown) <= (amount * abs(shown) / 100 if drift["share"] else amount)


def paired(shown: str, output: str) -> list[tuple[str, str, float, str, float]] | None:
    """Each number ``output`` prints beside the one ``shown`` has in its place (name,
    shown text and value, printed text and value), durations aside; ``None`` where the two
    differ in more than numbers: a line or a word."""
    shown_lines, output_lines = untimed(shown).splitlines(), untimed(output).splitlines()
    if len(shown_lines) != len(output_lines):
        return None
    pairs = []
    for shown_line, output_line in zip(shown_lines, output_lines):
        (shown_words, shown_numbers), (words, found) = numbers(shown_line), numbers(output_line)
        if words != shown_words:
            return None
        pairs += [(*before, *after[1:]) for before, after in zip(shown_numbers, found)]
    return pairs


def agree(shown: str, output: str, allowed: dict[str, re.Match[str]]) -> bool:
    """Whether ``output`` says what ``shown`` says: the same lines and words, each number
    to the digit or within the drift its name is allowed."""
    pairs = paired(shown, output)
    return pairs is not None and all(
        text == shown_text or within(allowed.get(name), shown_value, value)
        for name, shown_text, shown_value, text, value in pairs
    )


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


def fresh_output(match: re.Match[str], text: str, nudged: str | None = None) -> str:
    """What the command of the marked block ``match`` of the page ``text`` prints now, as
    the block shows it. A ``ValueError`` says what is wrong with the mark, a
    ``RuntimeError`` why the command cannot run here."""
    options = [option for option in match["options"].split(", ") if option]
    unknown = set(options) - {STDOUT, AFTER_BLOCK, VARIES, RANK_ZERO}
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}")
    setup = None
    if AFTER_BLOCK in options:
        blocks = list(PYTHON_BLOCK.finditer(text, 0, match.start()))
        if not blocks:
            raise ValueError("no Python block above it")
        setup = blocks[-1]["code"]
    result = run(match["command"], STDOUT in options, setup, nudged)
    if result.returncode != 0:
        raise RuntimeError((result.stderr or result.stdout or "")[-500:])
    output = "\n".join(line.rstrip() for line in result.stdout.strip().splitlines())
    return rank_zero_lines(output) if RANK_ZERO in options else output


def refresh(page: str, check: bool, nudged: str | None = None) -> list[str]:
    """Rerun the marked commands of ``page`` (``nudged``, if given); return the problems
    found."""
    with open(page, encoding="utf-8") as source:
        text = source.read()
    problems, version = [], paddle_version()
    name = os.path.relpath(page, ROOT)

    def replace(match: re.Match[str]) -> str:
        command = match["command"]
        if check and match["paddle"] != version:
            print(f"{name}: `{command}` was recorded on Paddle {match['paddle']}; not compared")
            return match[0]
        try:
            allowed = drifts(match["drifts"])
            output = fresh_output(match, text, nudged)
        except ValueError as error:
            problems.append(f"{name}: `{command}`: {error}")
            return match[0]
        except RuntimeError as error:
            print(f"{name}: `{command}` cannot run here, left as it was:\n{error}")
            return match[0]
        shown = match["body"].strip()
        if agree(shown, output, allowed):
            output = shown  # a page is not rewritten for durations or drifts alone
        varies = VARIES in match["options"]
        differs = labels(output) != labels(shown) if varies else output != shown
        if check and differs:
            problems.append(
                f"{name}: the output of `{command}` is not what the page shows:\n"
                + difference(shown, output)
            )
        recorded = f"Paddle {version}{match['options']}{match['drifts'] or ''}"
        return f"<!-- output: {command} ({recorded}) -->\n```text\n{output}\n```"

    updated = MARKED.sub(replace, text)
    if not check and updated != text:
        with open(page, "w", encoding="utf-8") as target:
            target.write(updated)
        print(f"{name}: updated")
    return problems


def measure(page: str) -> None:
    """Print how far each number of ``page``'s blocks moves between a run and the runs
    nudged up and down, by name, beside the drift its block allows."""
    with open(page, encoding="utf-8") as source:
        text = source.read()
    for match in MARKED.finditer(text):
        if match["paddle"] != paddle_version() or VARIES in match["options"]:
            continue
        print(f"{os.path.relpath(page, ROOT)}: {match['command']}")
        try:
            plain, *nudged = [fresh_output(match, text, way) for way in (None, "up", "down")]
        except RuntimeError as error:
            print(f"  cannot run here:\n{error}")
            continue
        moved: dict[str, list[float]] = {}  # name: the largest share, difference, factor
        for output in nudged:
            pairs = paired(plain, output)
            if pairs is None:
                print("  more than numbers change:\n" + difference(plain, output))
            for name, _, before, _, after in pairs or []:
                largest = moved.setdefault(name, [0.0, 0.0, 1.0])
                if before != after:
                    low, high = sorted([abs(before), abs(after)])
                    share = abs(after - before) / abs(before) * 100 if before else math.inf
                    change = [share, abs(after - before), high / low if low else math.inf]
                    moved[name] = [max(pair) for pair in zip(largest, change)]
        allowed = {name: drift[0] for name, drift in drifts(match["drifts"]).items()}
        for name, (share, amount, factor) in moved.items():
            held = "held" if amount == 0 else f"±{share:.1f}%, ±{amount:.3g}, ×{factor:.2f}"
            print(f"  {name or '(unnamed)':28s} {held:32s} allowed: {allowed.get(name, 'none')}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--nudged", choices=["up", "down"], help="with --check: a drifted run")
    parser.add_argument(
        "--measure", action="store_true", help="how far each number moves when nudged"
    )
    args = parser.parse_args(argv)
    if args.nudged and not args.check:
        parser.error("--nudged checks the pages' drifts: use it with --check")
    if args.measure:
        for page in pages():
            measure(page)
        return 0
    problems = [problem for page in pages() for problem in refresh(page, args.check, args.nudged)]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
