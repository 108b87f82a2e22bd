#!/usr/bin/env python
"""The tables of docs/benchmarks.md, printed as Markdown from a bench_scaler.py --json run.

python benchmarks/tables.py RESULTS.json
"""

from __future__ import annotations

import json
import sys

OPTION_COLUMNS = [
    ("without statistics", "ours-step[no stats]"),
    ("`max_loss_scaling`", "ours-step[max bound]"),
    ("`min_loss_scaling=0.5`", "ours-step[floor 0.5]"),
    ("`stuck_after=100`", "ours-step[stuck]"),
    ("`report_overflows`", "ours-step[report]"),
    ('`policy="headroom"`', "ours-step[headroom]"),
    ("`measure_every=1`", "ours-step[measure every step]"),
]


def reads(impl: dict) -> str:
    return "/".join(str(impl["host_reads"][origin]) for origin in ("scaler", "paddle", "other"))


def ratio(value: float | None) -> str:
    return "n/a" if value is None else f"**{value:.2f}**"


def markdown(header: list[str], alignments: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table: the header, its alignment row (``---`` or ``---:``), the rows."""
    return ["| " + " | ".join(cells) + " |" for cells in [header, alignments, *rows]]


def overhead_table(results: dict) -> list[str]:
    header = [
        "workload (tensors x params)", "optimizer", "native step+update", "ours step+update",
        "ratio", "native minimize", "ours minimize", "ratio", "reads native", "reads ours",
    ]  # fmt: skip
    rows = []
    for run in results["runs"]:
        impls, ratios = run["impls"], run["ratios"]
        ms = {name: f"{impl['overhead_ms']:.2f}" for name, impl in impls.items()}
        rows.append([
            run["workload"], run["optimizer"], ms["native-step"], ms["ours-step"],
            ratio(ratios["step"]), ms["native-minimize"], ms["ours-minimize"],
            ratio(ratios["minimize"]), reads(impls["native-step"]), reads(impls["ours-step"]),
        ])  # fmt: skip
    return markdown(header, ["---"] * 2 + ["---:"] * 6 + ["---"] * 2, rows)


def before_after_table(results: dict) -> list[str]:
    header = [
        "workload", "optimizer", "before: step", "after: step", "before: minimize",
        "after: minimize", "reads before",
    ]  # fmt: skip
    rows = []
    for run in results["runs"]:
        ratios = {kind: ratio(value) for kind, value in run["ratios"].items()}
        rows.append([
            run["workload"], run["optimizer"], ratios["before step"], ratios["step"],
            ratios["before minimize"], ratios["minimize"], reads(run["impls"]["before-step"]),
        ])  # fmt: skip
    return markdown(header, ["---"] * 2 + ["---:"] * 4 + ["---"], rows)


def options_table(results: dict) -> list[str]:
    header = ["workload", "optimizer", "ours step+update"]
    header += [title for title, _ in OPTION_COLUMNS] + ["native"]
    rows = []
    for run in results["runs"]:
        ms = {name: f"{impl['overhead_ms']:.2f}" for name, impl in run["impls"].items()}
        options = [ms[name] for _, name in OPTION_COLUMNS]
        rows.append(
            [run["workload"], run["optimizer"], ms["ours-step"], *options, ms["native-step"]]
        )
    return markdown(header, ["---"] * 2 + ["---:"] * (len(header) - 2), rows)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv in (["-h"], ["--help"]) else 2
    with open(argv[0]) as source:
        results = json.load(source)
    tables = [("overhead per step (ms) and the ratio to Paddle's", overhead_table)]
    if any("before step" in run["ratios"] for run in results["runs"]):
        tables.append(("before and after, the same run", before_after_table))
    tables.append(("what each option costs", options_table))
    for title, table in tables:
        print(f"\n<!-- {title} -->")
        print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
