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
]


def reads(impl: dict) -> str:
    return f"{impl['host_reads']['scaler']}/{impl['host_reads']['paddle']}"


def ratio(value: float | None) -> str:
    return "n/a" if value is None else f"**{value:.2f}**"


def overhead_table(results: dict) -> list[str]:
    lines = [
        "| workload (tensors x params) | optimizer | native step+update | ours step+update "
        "| ratio | native minimize | ours minimize | ratio | floor | reads native | reads ours |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for run in results["runs"]:
        impls, ratios = run["impls"], run["ratios"]
        ms = {name: f"{impl['overhead_ms']:.2f}" for name, impl in impls.items()}
        lines.append(
            f"| {run['workload']} | {run['optimizer']} | {ms['native-step']} | "
            f"{ms['ours-step']} | {ratio(ratios['step'])} | {ms['native-minimize']} | "
            f"{ms['ours-minimize']} | {ratio(ratios['minimize'])} | {ms['floor']} | "
            f"{reads(impls['native-step'])} | {reads(impls['ours-step'])} |"
        )
    return lines


def before_after_table(results: dict) -> list[str]:
    lines = [
        "| workload | optimizer | before: step | after: step | before: minimize | "
        "after: minimize |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for run in results["runs"]:
        ratios = {kind: ratio(value) for kind, value in run["ratios"].items()}
        lines.append(
            f"| {run['workload']} | {run['optimizer']} | {ratios['before step']} | "
            f"{ratios['step']} | {ratios['before minimize']} | {ratios['minimize']} |"
        )
    return lines


def options_table(results: dict) -> list[str]:
    header = " | ".join(title for title, _ in OPTION_COLUMNS)
    lines = [
        f"| workload | optimizer | ours step+update | {header} | native |",
        "| --- | --- | ---: |" + " ---: |" * len(OPTION_COLUMNS) + " ---: |",
    ]
    for run in results["runs"]:
        impls = run["impls"]
        cells = [f"{impls[name]['overhead_ms']:.2f}" for _, name in OPTION_COLUMNS]
        lines.append(
            f"| {run['workload']} | {run['optimizer']} | "
            f"{impls['ours-step']['overhead_ms']:.2f} | {' | '.join(cells)} | "
            f"{impls['native-step']['overhead_ms']:.2f} |"
        )
    return lines


def unscale_table(results: dict) -> list[str]:
    lines = [
        "| workload | gradient bytes | NumPy multiply | ours | x NumPy | native | x NumPy | copy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for bandwidth in results["bandwidth"]:
        passes = bandwidth["passes"]
        lines.append(
            f"| {bandwidth['workload']} | {bandwidth['grad_bytes'] / 1e6:.0f} MB | "
            f"{passes['numpy']['median_ms']:.3f} ms | {passes['ours']['median_ms']:.3f} ms | "
            f"**{passes['ours']['vs_numpy']:.2f}** | {passes['native']['median_ms']:.3f} ms | "
            f"{passes['native']['vs_numpy']:.2f} | {passes['copy']['median_ms']:.3f} ms |"
        )
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip())
        return 2
    with open(argv[0]) as source:
        results = json.load(source)
    before = any("before step" in run["ratios"] for run in results["runs"])
    tables = [("overhead per step (ms) and the ratio to Paddle's", overhead_table)]
    if before:
        tables.append(("before and after, the same run", before_after_table))
    tables += [("what each option costs", options_table), ("the unscale pass", unscale_table)]
    for title, table in tables:
        print(f"\n<!-- {title} -->")
        print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
