"""The benchmark's quick run finishes, reports every figure and draws its chart.

Only that the figures exist and are sane numbers: timings on a shared machine are too
noisy to assert on.
"""

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "bench_scaler.py")
IMPLS = ["none", "native-step", "native-minimize", "ours-step", "ours-minimize", "floor"]
ORIGINS = ["scaler", "paddle", "other"]
PASSES = ["ours", "native", "copy", "numpy"]
OPTION_ROWS = [
    "ours-step[no stats]",
    "ours-step[max bound]",
    "ours-step[floor 0.5]",
    "ours-step[stuck]",
    "ours-step[report]",
]


def run_quick_benchmark(json_path, figure_path, growth_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(part for part in [REPO, os.environ.get("PYTHONPATH")] if part),
    )
    return subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--quick",
            "--json",
            str(json_path),
            "--figure",
            str(figure_path),
            "--growth-figure",
            str(growth_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def is_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value)


def is_positive(value):
    return is_finite(value) and value > 0


def test_quick_benchmark_reports_every_figure(tmp_path):
    json_path, figure_path = tmp_path / "results.json", tmp_path / "overhead.png"
    growth_path = tmp_path / "growth.png"
    result = run_quick_benchmark(json_path, figure_path, growth_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads(json_path.read_text())

    runs = results["runs"]
    assert {run["optimizer"] for run in runs} == {"sgd", "adamw"}
    for run in runs:
        for name in IMPLS:
            impl = run["impls"][name]
            assert is_positive(impl["median_ms"]), (run["workload"], name, impl)
            # An overhead is a difference of two noisy medians: finite, of either sign.
            assert is_finite(impl["overhead_ms"]), (run["workload"], name, impl)
            reads = impl["host_reads"]
            assert all(
                isinstance(reads[origin], int) and reads[origin] >= 0 for origin in ORIGINS
            ), (run["workload"], name, reads)
        for kind, native in (("step", "native-step"), ("minimize", "native-minimize")):
            # A ratio is left out only where Paddle's overhead is lost in the noise, which
            # a quick run on a busy machine can see.
            lost = run["impls"][native]["overhead_ms"] <= 0
            ratio = run["ratios"][kind]
            assert (ratio is None) if lost else is_finite(ratio), (run["workload"], kind, run)
        # Every bar the figure draws has its figure in the results.
        assert set(OPTION_ROWS) <= set(run["impls"]), sorted(run["impls"])
    for figure in (figure_path, growth_path):
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure

    for bandwidth in results["bandwidth"]:
        for name in PASSES:
            figures = bandwidth["passes"][name]
            assert is_positive(figures["gb_per_s"]), (bandwidth["workload"], name)
            assert is_positive(figures["vs_copy"]), (bandwidth["workload"], name)
            assert is_positive(figures["vs_numpy"]), (bandwidth["workload"], name)

    for optimizer_name in ("sgd", "adamw"):
        fits = results["cost_vs_size"][optimizer_name]
        for figure in ("ms_per_mparam", "ms_per_tensor"):
            assert fits[figure], (optimizer_name, figure)
            assert all(is_finite(fit[who]) for fit in fits[figure] for who in ("ours", "native")), (
                optimizer_name,
                figure,
            )
