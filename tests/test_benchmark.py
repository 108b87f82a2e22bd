"""The benchmarks' quick runs finish, report every figure and draw their charts.

Only that the figures exist and are sane numbers: timings on a shared machine are too
noisy to assert on.
"""

import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, "benchmarks")
SCRIPT = os.path.join(BENCHMARKS, "bench_scaler.py")
IMPLS = ["none", "bare-kernels", "native-step", "native-minimize", "ours-step", "ours-minimize"]
BEFORE_IMPLS = ["before-step", "before-minimize"]
ORIGINS = ["scaler", "paddle", "other"]
OPTION_ROWS = [
    "ours-step[no stats]",
    "ours-step[max bound]",
    "ours-step[floor 0.5]",
    "ours-step[stuck]",
    "ours-step[report]",
    "ours-step[headroom]",
    "ours-step[measure every step]",
]
PNG = b"\x89PNG\r\n\x1a\n"


def run_script(script, *args, env_extra=None):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(part for part in [REPO, os.environ.get("PYTHONPATH")] if part),
        **(env_extra or {}),
    )
    return subprocess.run(
        [sys.executable, script, *map(str, args)],
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
    # This checkout stands in for an earlier one: --before imports it under another name.
    result = run_script(
        SCRIPT, "--quick", "--before", REPO, "--json", json_path, "--figure", figure_path
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads(json_path.read_text())

    runs = results["runs"]
    assert {run["optimizer"] for run in runs} == {"sgd", "adamw"}
    assert results["targets"]["overhead_ratio_max"] == 1.0
    for run in runs:
        assert set(run["impls"]) == {*IMPLS, *BEFORE_IMPLS, *OPTION_ROWS}, sorted(run["impls"])
        for name, impl in run["impls"].items():
            assert is_positive(impl["median_ms"]), (run["workload"], name, impl)
            # An overhead is a difference of two noisy medians: finite, of either sign.
            assert is_finite(impl["overhead_ms"]), (run["workload"], name, impl)
            reads = impl["host_reads"]
            assert all(
                isinstance(reads[origin], int) and reads[origin] >= 0 for origin in ORIGINS
            ), (run["workload"], name, reads)
        # No scaler reads in a step but the report's one; AdamW reads its flag.
        impls = run["impls"]
        assert impls["ours-step"]["host_reads"]["scaler"] == 0
        assert impls["ours-step[report]"]["host_reads"]["scaler"] == 1
        flag_reads = 1 if run["optimizer"] == "adamw" else 0
        assert impls["ours-step"]["host_reads"]["paddle"] == flag_reads
        assert impls["native-step"]["host_reads"]["paddle"] == 1
        # The floor reads nothing but what the optimizer reads of the flag it is handed.
        assert impls["bare-kernels"]["host_reads"] == {"scaler": 0, "paddle": 1, "other": 0}
        for kind, native in (
            ("step", "native-step"),
            ("minimize", "native-minimize"),
            ("before step", "native-step"),
            ("before minimize", "native-minimize"),
            ("step over the floor", "bare-kernels"),
            ("Paddle's step over the floor", "bare-kernels"),
        ):
            # A ratio is left out only where Paddle's overhead is lost in the noise, which
            # a quick run on a busy machine can see.
            lost = impls[native]["overhead_ms"] <= 0
            ratio = run["ratios"][kind]
            assert (ratio is None) if lost else is_finite(ratio), (run["workload"], kind, run)
    summary = result.stdout.split("== summary")[1]
    assert summary.count("(target <= 1.0)") == 2 * len(runs), summary
    assert summary.count("ours-step / bare-kernels overhead") == len(runs), summary
    assert summary.count("(target <= 1.1)") >= len(runs), summary
    assert summary.count("ours-step[headroom] / ours-step per-step time") == len(runs)
    assert figure_path.read_bytes()[:8] == PNG

    # The figure and the docs' tables again, from the saved results.
    again = tmp_path / "again.png"
    drawn = run_script(os.path.join(BENCHMARKS, "figures.py"), json_path, again)
    assert drawn.returncode == 0, drawn.stderr[-4000:]
    assert again.read_bytes()[:8] == PNG
    tables = run_script(os.path.join(BENCHMARKS, "tables.py"), json_path)
    assert tables.returncode == 0, tables.stderr[-4000:]
    for title in ("the ratio to Paddle's", "before and after", "what each option costs"):
        assert title in tables.stdout
    # A header, its alignment row and one row per run, in each of the three tables.
    assert tables.stdout.count("\n| ") == 3 * (2 + len(runs))


POLICY_SCRIPT = os.path.join(REPO, "benchmarks", "policy_bench.py")
POLICY_ROWS = ["interval", "headroom", "pytorch", "deepspeed", "fp32"]
WORKLOADS = ["digits-mlp", "copy-lm", "outlier-batches", "fine-tuning", "recurrent"]


def run_policy_benchmark(*args):
    return run_script(POLICY_SCRIPT, "--quick", *args)


def is_fraction(value):
    return is_finite(value) and 0 <= value <= 1


def test_quick_policy_benchmark_reports_every_workload_and_policy(tmp_path):
    json_path, figure_path = tmp_path / "policies.json", tmp_path / "policies.png"
    result = run_policy_benchmark("--json", json_path, "--figure", figure_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads(json_path.read_text())
    assert [workload["name"] for workload in results["results"]] == WORKLOADS
    # One path, and the headroom policy measures on its schedule, said at the top.
    assert results["measure_every"] == 64 and "path" not in results
    assert "measures: headroom measures the amax in the first 3 iterations and every 64th" in (
        result.stdout
    )
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
    # Within reach: the flushed fraction less the part beyond any scale, per policy.
    for name, row in results["within_reach"].items():
        rows = named[name]["summaries"]
        for policy in ("interval", "headroom"):
            part = rows[policy]["flushed_fraction"] - rows[policy]["beyond_any_scale_fraction"]
            assert math.isclose(row[policy], part, rel_tol=1e-12, abs_tol=1e-15)
    # Every target has its PASS or FAIL line, and the JSON agrees with it: per workload,
    # the flushes within reach, the skips and the loss; the two geometric means.
    checks = results["checks"]
    assert len(checks) == 3 * len(WORKLOADS) + 2
    for check in checks:
        verdict = "PASS" if check["passed"] else "FAIL"
        assert f"{verdict}  {check['target']}: {check['detail']}" in result.stdout
    assert "| workload | policy | skipped /1000 it |" in result.stdout
    assert figure_path.read_bytes()[:8] == PNG
    # The figure again, from the saved results, training nothing.
    again = tmp_path / "again.png"
    replotted = run_script(POLICY_SCRIPT, "--replot", json_path, "--figure", again)
    assert replotted.returncode == 0, replotted.stderr[-4000:]
    assert again.read_bytes()[:8] == PNG and "workload" not in replotted.stdout


def test_quick_policy_benchmark_runs_the_workloads_asked_for(tmp_path):
    json_path = tmp_path / "policies.json"
    result = run_policy_benchmark("--workloads", "outlier-batches", "--json", json_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads(json_path.read_text())
    assert [workload["name"] for workload in results["results"]] == ["outlier-batches"]
    rejected = run_policy_benchmark("--workloads", "mnist")
    assert rejected.returncode != 0 and "unknown ['mnist']" in rejected.stderr


def test_quick_policy_benchmark_runs_headroom_at_the_periods_asked_for(tmp_path):
    json_path = tmp_path / "policies.json"
    result = run_policy_benchmark(
        "--workloads", "fine-tuning", "--periods", "16,64", "--json", json_path
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = json.loads(json_path.read_text())
    assert results["periods"] == [16, 64]
    assert results["policies"]["headroom (measure_every=16)"] == {
        "policy": "headroom",
        "measure_every": 16,
    }
    rows = results["results"][0]["summaries"]
    assert set(rows) == {*POLICY_ROWS, "headroom (measure_every=16)", "headroom (measure_every=64)"}
    # Its own run at 16; at the default period, headroom's run, said so.
    assert "same_run_as" not in rows["headroom (measure_every=16)"]
    assert rows["headroom (measure_every=64)"]["same_run_as"] == "headroom"
    assert rows["headroom (measure_every=64)"]["flushed"] == rows["headroom"]["flushed"]
    assert (
        "period:   headroom (measure_every=16): measures in the first 3 iterations and "
        "every 16th, peak_half_life 128" in result.stdout
    )
    assert "| fine-tuning | headroom (measure_every=16) |" in result.stdout
    assert "| fine-tuning | headroom (measure_every=64, the default: headroom's run) |" in (
        result.stdout
    )
    # Without --periods, no such rows (the default run, as it was).
    assert "measure_every=" not in run_policy_benchmark("--workloads", "fine-tuning").stdout
    rejected = run_policy_benchmark("--periods", "16,0")
    assert rejected.returncode != 0 and "--periods wants positive integers" in rejected.stderr


def test_beyond_any_scale_is_what_the_best_scale_still_flushes(monkeypatch):
    import importlib.util

    import numpy as np

    from paddle_amp_scaler.testing import UnderflowCensus, count_float16_range

    # Its workloads and its report are modules beside it.
    monkeypatch.syspath_prepend(os.path.dirname(POLICY_SCRIPT))
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


SOAK_SCRIPT = os.path.join(REPO, "benchmarks", "soak.py")


def test_a_short_soak_reports_each_variant_asked_for(tmp_path):
    json_path, output_path = tmp_path / "soak.json", tmp_path / "results.txt"
    # 1000 iterations: one injected inf, in the last.
    result = run_script(
        SOAK_SCRIPT,
        "--iterations",
        1000,
        "--variants",
        "headroom,mindspore",
        "--json",
        json_path,
        "--output",
        output_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    rows = [
        line for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line
    ]
    assert [row.split("|")[1].strip() for row in rows] == ["variant", "headroom", "mindspore"]
    assert "at 250 (MiB) | at 500 | at 1,000" in rows[0]
    assert "device:   not measured" in result.stdout or "CUDA memory sampled" in result.stdout
    # The report is appended to --output as printed.
    assert all(row in output_path.read_text() for row in rows)
    results = json.loads(json_path.read_text())["results"]
    for each in results:
        assert sorted(int(point) for point in each["rss"]) == list(range(0, 1001, 50))
        assert all(is_positive(value) for value in each["rss"].values())
        assert each["stats"]["skipped"] == 1 and each["stats"]["backoffs"] == 1
    rejected = run_script(SOAK_SCRIPT, "--variants", "amp")
    assert rejected.returncode != 0 and "unknown ['amp']" in rejected.stderr


ABLATION_SCRIPT = os.path.join(REPO, "benchmarks", "floor_ablation.py")


def test_the_floor_ablation_times_every_variant():
    # A piece of the package it cuts, renamed, fails the run (and so this test).
    result = run_script(ABLATION_SCRIPT, "--workloads", "4x4K,2x4K", "--rounds", 3, "--repeats", 1)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    header, *rows = result.stdout.splitlines()[1:]
    assert header.split("  ")[0] == "workload"
    assert [row.split()[0] for row in rows] == ["4x4K", "2x4K"]
    for row in rows:
        ratios = row.split("(floor")[0].split()[1:]
        # One ratio per variant (a quick run's floor may be lost in the noise: any sign).
        assert len(ratios) == 8 and all(is_finite(float(ratio)) for ratio in ratios), row
