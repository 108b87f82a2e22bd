#!/usr/bin/env python
"""Figures of a benchmark run, drawn from the results ``bench_scaler.py`` writes.

    PYTHONPATH=. python benchmarks/bench_scaler.py --json results.json --figure overhead.png
    python benchmarks/figures.py results.json overhead.png     # again, from saved results

The overhead figure has one panel per optimizer and one group of bars per workload:
each bar is an overhead of ours divided by the overhead of Paddle's own scaler on the
same steps, so that 1.0 is Paddle's cost whatever the workload's size (its absolute
cost is written under each workload). The growth figure (``--growth-figure``) draws the
overheads themselves, ours and Paddle's, against the number of parameters at a fixed
number of tensors and against the number of tensors at a fixed size. Needs matplotlib
(the ``examples`` extra).
"""

from __future__ import annotations

import json
import sys

# (label, implementation in the results, its native counterpart), left to right.
BARS = [
    ("ours, defaults (step + update)", "ours-step", "native-step"),
    ("ours, defaults (minimize)", "ours-minimize", "native-minimize"),
    ("without statistics", "ours-step[no stats]", "native-step"),
    ("max_loss_scaling", "ours-step[max bound]", "native-step"),
    ("min_loss_scaling=0.5", "ours-step[floor 0.5]", "native-step"),
    ("stuck_after=100", "ours-step[stuck]", "native-step"),
    ("report_overflows", "ours-step[report]", "native-step"),
]
# The defaults stand out; one option at a time in lighter shades.
COLOURS = ["#1f5fa8", "#4f8fd8", "#9a9a9a", "#f2b447", "#e07b39", "#6cb56c", "#b267c9"]


def overhead_ratios(run: dict) -> list[float | None]:
    """Each bar's overhead over Paddle's, or None where the run lacks it or Paddle's is
    lost in the noise."""
    impls = run["impls"]
    ratios: list[float | None] = []
    for _, ours, native in BARS:
        native_ms = impls[native]["overhead_ms"]
        ratios.append(
            impls[ours]["overhead_ms"] / native_ms if ours in impls and native_ms > 0 else None
        )
    return ratios


def draw_overheads(results: dict, path: str) -> None:
    """One PNG (or whatever ``path``'s suffix names) of every run's overhead ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    optimizers = list(dict.fromkeys(run["optimizer"] for run in results["runs"]))
    target = results["targets"]["overhead_ratio_max"]
    figure, axes = plt.subplots(
        len(optimizers), 1, figsize=(11, 3.6 * len(optimizers)), squeeze=False, sharey=True
    )
    width = 0.8 / len(BARS)
    for panel, optimizer in zip(axes[:, 0], optimizers):
        runs = [run for run in results["runs"] if run["optimizer"] == optimizer]
        for index, ((label, _, _), colour) in enumerate(zip(BARS, COLOURS)):
            offsets = [group + (index - (len(BARS) - 1) / 2) * width for group in range(len(runs))]
            heights = [overhead_ratios(run)[index] for run in runs]
            panel.bar(
                [x for x, h in zip(offsets, heights) if h is not None],
                [h for h in heights if h is not None],
                width,
                label=label,
                color=colour,
            )
        panel.axhline(1.0, color="black", linewidth=1.2)
        beside = panel.get_yaxis_transform()  # x in axes fraction, y in data
        panel.text(1.01, 1.0, "Paddle's\nown", transform=beside, va="center")
        panel.axhline(target, color="black", linewidth=0.8, linestyle="--")
        panel.text(1.01, target, f"target\n{target}", transform=beside, va="center")
        panel.set_xticks(range(len(runs)))
        panel.set_xticklabels(
            [
                f"{run['workload']}\nPaddle: {run['impls']['native-step']['overhead_ms']:.2f} ms"
                for run in runs
            ]
        )
        panel.set_xlim(-0.5, len(runs) - 0.5)
        panel.set_ylabel("overhead / Paddle's")
        panel.set_title(f"{optimizer}: what each scaler adds to a step, relative to Paddle's")
        panel.grid(axis="y", alpha=0.3)
    axes[0, 0].set_ylim(0, 1.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    legend_rows = 2
    figure.legend(handles, labels, loc="upper center", ncol=-(-len(BARS) // legend_rows))
    machine = results["machine"]
    figure.text(
        0.01,
        0.005,
        f"Paddle {machine['paddle']}, {machine['cpu_model']}, {machine['usable_cpus']} CPUs; "
        "medians of interleaved rounds; float32 gradients, no forward or backward timed",
        fontsize="small",
        color="#555555",
    )
    figure.tight_layout(rect=(0, 0.03, 1, 1 - 0.5 / figure.get_figheight()))
    figure.savefig(path, dpi=110)
    plt.close(figure)


# (label, implementation in the results, colour) of the growth figure's lines.
GROWTH_LINES = [("Paddle's own", "native-step", "#9a9a9a"), ("ours", "ours-step", "#1f5fa8")]


def draw_growth(results: dict, path: str) -> None:
    """Overhead (ms) of step + update, ours and Paddle's: against parameters where the
    tensor count is the same, and against tensors where the size is the same."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    optimizers = list(dict.fromkeys(run["optimizer"] for run in results["runs"]))
    figure, axes = plt.subplots(len(optimizers), 2, figsize=(11, 3.8 * len(optimizers)))
    axes = axes.reshape(len(optimizers), 2)
    for row, optimizer in zip(axes, optimizers):
        runs = [run for run in results["runs"] if run["optimizer"] == optimizer]
        fits = results["cost_vs_size"][optimizer]
        by_params, by_tensors = row
        for fit in fits["ms_per_mparam"]:
            group = [run for run in runs if run["tensors"] == fit["tensors"]]
            group.sort(key=lambda run: run["params"])
            for label, impl, colour in GROWTH_LINES:
                slope = fit["native" if impl.startswith("native") else "ours"]
                by_params.plot(
                    [run["params"] / 1e6 for run in group],
                    [run["impls"][impl]["overhead_ms"] for run in group],
                    marker="o",
                    color=colour,
                    label=f"{label}: {slope:.2f} ms per M params",
                )
            by_params.set_title(f"{optimizer}, {fit['tensors']} tensors: cost against size")
        by_params.set_xlabel("parameters (millions)")
        for fit in fits["ms_per_tensor"]:
            group = [run for run in runs if run["params"] == fit["params"]]
            group.sort(key=lambda run: run["tensors"])
            for label, impl, colour in GROWTH_LINES:
                by_tensors.plot(
                    [run["tensors"] for run in group],
                    [run["impls"][impl]["overhead_ms"] for run in group],
                    marker="o",
                    color=colour,
                    label=label if fit is fits["ms_per_tensor"][0] else None,
                )
            by_tensors.annotate(
                f"{fit['params'] / 1e6:g}M params",
                (group[-1]["tensors"], group[-1]["impls"]["native-step"]["overhead_ms"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize="small",
            )
        by_tensors.set_title(f"{optimizer}: cost against the number of tensors, same size")
        by_tensors.set_xlabel("tensors")
        for panel in row:
            panel.set_xscale("log")
            panel.set_yscale("log")
            panel.set_ylabel("overhead per step (ms)")
            panel.grid(alpha=0.3, which="both")
            panel.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: figures.py RESULTS.json FIGURE.png [GROWTH.png]\n")
        return 2
    with open(argv[0]) as saved:
        results = json.load(saved)
    draw_overheads(results, argv[1])
    if len(argv) == 3:
        draw_growth(results, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
