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


POLICY_SCRIPT = os.path.join(REPO, "benchmarks", "policy_bench.py")
POLICY_ROWS = ["interval", "headroom", "pytorch", "deepspeed", "fp32"]
WORKLOADS = ["digits-mlp", "copy-lm", "outlier-batches"]


def run_policy_benchmark(*args, env_extra=None):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(part for part in [REPO, os.environ.get("PYTHONPATH")] if part),
        **(env_extra or {}),
    )
    return subprocess.run(
        [sys.executable, POLICY_SCRIPT, "--quick", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def is_fraction(value):
    return is_finite(value) and 0 <= value <= 1


def test_quick_policy_benchmark_reports_every_workload_and_policy(tmp_path):
    json_path, figure_path = tmp_path / "policies.json", tmp_path / "policies.png"
    result = run_policy_benchmark("--json", json_path, "--figure", figure_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads(json_path.read_text())
    assert [workload["name"] for workload in results["results"]] == WORKLOADS
    # The machine's default path: make test runs the suite on both.
    assert (results["path"], results["measure_every"]) in (("fused-cpu", 1), ("paddle", 64))
    for workload in results["results"]:
        rows = workload["summaries"]
        assert set(rows) == set(POLICY_ROWS)
        for policy in POLICY_ROWS:
            row = rows[policy]
            assert row["iterations"] == workload["iterations"]
            assert is_positive(row["final_loss"]), (workload["name"], policy)
            assert is_positive(row["step_ms_median"]), (workload["name"], policy)
            if policy == "fp32":
                continue
            fractions = ("flushed_fraction", "subnormal_fraction", "beyond_any_scale_fraction")
            assert all(is_fraction(row[name]) for name in fractions), (workload["name"], row)
            assert row["flushed"] <= row["nonzero"] and row["nonzero"] > 0
            assert row["skipped"] == round(row["skipped_per_1000"] * row["iterations"] / 1000)
            assert is_positive(row["final_scale"])
        # PyTorch's settings are interval's numbers: the same run, said so.
        assert rows["pytorch"]["same_run_as"] == "interval"
        assert {k: v for k, v in rows["pytorch"].items() if k not in ("policy", "same_run_as")} == {
            k: v for k, v in rows["interval"].items() if k != "policy"
        }
        traces = workload["traces"]
        assert len(traces["headroom"]["scale"]) == workload["iterations"]
        assert len(traces["fp32"]["loss"]) == workload["iterations"]
    named = {workload["name"]: workload for workload in results["results"]}
    # The emulation is live: the language model's gradients underflow, and the outlier
    # batches overflow and are skipped under every policy.
    assert named["copy-lm"]["summaries"]["interval"]["flushed_fraction"] > 0
    outliers = named["outlier-batches"]
    assert outliers["outliers"]
    for policy in ("interval", "headroom", "deepspeed"):
        skipped_at = outliers["traces"][policy]["skipped_at"]
        assert set(outliers["outliers"]) <= set(skipped_at), policy
    # Every target has its PASS or FAIL line, and the JSON agrees with it.
    checks = results["checks"]
    assert len(checks) == 3 * len(WORKLOADS) + 1
    for check in checks:
        verdict = "PASS" if check["passed"] else "FAIL"
        assert f"{verdict}  {check['target']}: {check['detail']}" in result.stdout
    assert "| workload | policy | skipped /1000 it |" in result.stdout
    assert figure_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_policy_benchmark_on_the_gpu_path_measures_on_its_schedule(tmp_path):
    json_path = tmp_path / "policies.json"
    result = run_policy_benchmark(
        "--workloads", "digits-mlp", "--json", json_path, env_extra={"PADDLE_AMP_SCALER_FUSED": "0"}
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads(json_path.read_text())
    assert results["path"] == "paddle" and results["measure_every"] == 64
    assert [workload["name"] for workload in results["results"]] == ["digits-mlp"]
    assert "path:     paddle" in result.stdout
    rejected = run_policy_benchmark("--workloads", "mnist")
    assert rejected.returncode != 0 and "unknown ['mnist']" in rejected.stderr


def test_beyond_any_scale_is_what_the_best_scale_still_flushes(monkeypatch):
    import importlib.util

    import numpy as np

    from paddle_amp_scaler.testing import UnderflowCensus, count_float16_range

    spec = importlib.util.spec_from_file_location("policy_bench", POLICY_SCRIPT)
    policy_bench = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up while the module runs.
    monkeypatch.setitem(sys.modules, "policy_bench", policy_bench)
    spec.loader.exec_module(policy_bench)
    rng = np.random.default_rng(3)
    for spread in (20, 45, 60):
        values = np.exp2(rng.uniform(-spread, 0, 50_000)).astype(np.float32)
        census = UnderflowCensus(exponents=True)
        census.observe(values)
        census.end_iteration()
        # The best power of two puts the largest value just below 65504; what float16
        # flushes there, it flushes at any scale.
        best = np.float32(2.0 ** np.floor(np.log2(65504 / values.max())))
        flushed_at_best = count_float16_range(values * best).flushed
        beyond = policy_bench.beyond_any_scale(census.last_exponents, census.last_amax)
        assert beyond == flushed_at_best
        assert (flushed_at_best > 0) == (spread > 40)
