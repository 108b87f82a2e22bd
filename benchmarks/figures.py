#!/usr/bin/env python
"""The figure of a benchmark run, drawn from the results ``bench_scaler.py`` writes.

    PYTHONPATH=. python benchmarks/bench_scaler.py --json results.json --figure overhead.png
    python benchmarks/figures.py results.json overhead.png     # again, from saved results

One panel per optimizer and one group of bars per workload: each bar is an overhead of
ours (or of the earlier checkout's, with ``--before``) divided by the overhead of Paddle's
own scaler on the same steps, so that 1.0 is Paddle's cost, and the target, whatever the
workload's size (Paddle's absolute cost is written under each workload). Needs
matplotlib (the ``examples`` extra).
"""

from __future__ import annotations

import json
import sys

# (label, implementation in the results, its native counterpart, colour), left to right.
# The defaults stand out; the earlier checkout in grey; one option at a time in lighter
# shades.
BARS = [
    ("ours, defaults (step + update)", "ours-step", "native-step", "#1f5fa8"),
    ("ours, defaults (minimize)", "ours-minimize", "native-minimize", "#4f8fd8"),
    ("before (step + update)", "before-step", "native-step", "#5a5a5a"),
    ("before (minimize)", "before-minimize", "native-minimize", "#9a9a9a"),
    ("without statistics", "ours-step[no stats]", "native-step", "#c9c9c9"),
    ("max_loss_scaling", "ours-step[max bound]", "native-step", "#f2b447"),
    ("min_loss_scaling=0.5", "ours-step[floor 0.5]", "native-step", "#e07b39"),
    ("stuck_after=100", "ours-step[stuck]", "native-step", "#6cb56c"),
    ("report_overflows", "ours-step[report]", "native-step", "#b267c9"),
    ("policy='headroom'", "ours-step[headroom]", "native-step", "#d6616b"),
    ("measure_every=1", "ours-step[measure every step]", "native-step", "#8c6d31"),
]
# The top of the scale: a taller bar is cut there, with its value written on it.
TOP = 1.6


def bars_in(results: dict) -> list[tuple[str, str, str, str]]:
    """The bars whose implementation every run measured (before's only with --before)."""
    return [bar for bar in BARS if all(bar[1] in run["impls"] for run in results["runs"])]


def overhead_ratio(run: dict, ours: str, native: str) -> float | None:
    """``ours``' overhead over ``native``'s; None where Paddle's is lost in the noise."""
    native_ms = run["impls"][native]["overhead_ms"]
    return run["impls"][ours]["overhead_ms"] / native_ms if native_ms > 0 else None


def draw_overheads(results: dict, path: str) -> None:
    """One PNG (or whatever ``path``'s suffix names) of every run's overhead ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    optimizers = list(dict.fromkeys(run["optimizer"] for run in results["runs"]))
    target = results["targets"]["overhead_ratio_max"]
    bars = bars_in(results)
    figure, axes = plt.subplots(
        len(optimizers), 1, figsize=(12, 3.8 * len(optimizers)), squeeze=False, sharey=True
    )
    width = 0.84 / len(bars)
    for panel, optimizer in zip(axes[:, 0], optimizers):
        runs = [run for run in results["runs"] if run["optimizer"] == optimizer]
        for index, (label, ours, native, colour) in enumerate(bars):
            offsets = [group + (index - (len(bars) - 1) / 2) * width for group in range(len(runs))]
            heights = [overhead_ratio(run, ours, native) for run in runs]
            shown = [(x, h) for x, h in zip(offsets, heights) if h is not None]
            panel.bar(
                [x for x, _ in shown],
                [min(h, TOP) for _, h in shown],
                width,
                label=label,
                color=colour,
            )
            for x, height in shown:
                if height > TOP:  # cut at the top, its value written on it
                    panel.text(x, TOP, f"{height:.1f}", ha="center", va="top", fontsize=7)
        panel.axhline(target, color="black", linewidth=1.2)
        beside = panel.get_yaxis_transform()  # x in axes fraction, y in data
        panel.text(1.01, target, f"Paddle's own\n(target {target:g})", transform=beside)
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
    axes[0, 0].set_ylim(0, TOP)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", ncol=-(-len(bars) // 2))
    machine = results["machine"]
    figure.text(
        0.01,
        0.005,
        f"Paddle {machine['paddle']} on CPU (its kernels, the path every device takes), "
        f"{machine['cpu_model']}, {machine['usable_cpus']} CPUs; medians of interleaved "
        "rounds; float32 gradients; a forward and backward before each step, untimed",
        fontsize="small",
        color="#555555",
    )
    figure.tight_layout(rect=(0, 0.03, 0.93, 1 - 0.5 / figure.get_figheight()))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: figures.py RESULTS.json FIGURE.png\n")
        return 2
    with open(argv[0]) as saved:
        results = json.load(saved)
    draw_overheads(results, argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
