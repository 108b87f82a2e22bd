"""Distributed runs, in real processes: two CPU ranks over gloo, started by Paddle's own
launcher on loopback addresses, each run bounded in time and cleaned up by process
group. Every rank must skip the same steps and hold the same scale, counters and
statistics; the parameters must equal references computed here, in one process."""

import contextlib
import math
import os
import re
import signal
import socket
import subprocess
import sys
import warnings

import numpy as np
import paddle
import pytest

from helpers import batches, loss_of, make_model
from reference_rule import ReferenceScaler

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
WORKER = os.path.join(TESTS, "distributed_worker.py")
STEPS = 8
INJECTED = {0: {5}, 1: {1, 2}}  # as in distributed_worker.py
EVERY = sorted(INJECTED[0] | INJECTED[1])
COLUMNS = [
    "skipped",
    "scale",
    "incr_count",
    "decr_count",
    "iterations",
    "skipped_total",
    "skip_streak",
    "growths",
    "backoffs",
]
LAUNCH_TIMEOUT_S = 180

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the gloo launcher runs on Linux only"
)


def free_loopback_port():
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# How Paddle's launcher reports a rank killed by a signal (SIGSEGV: -11, SIGABRT: -6).
KILLED_BY_A_SIGNAL = re.compile(r"Exit code -\d+")


def run_on_ranks(script, arguments, out, ranks=2):
    """Start ``script`` on ``ranks`` processes with Paddle's launcher; its console output
    and the ranks' logs. Fails the test if it outlives LAUNCH_TIMEOUT_S or exits non-zero.

    A run whose rank dies of a signal is run once more, with a warning. Now and then a
    rank of Paddle 3.3 crashes so (SIGSEGV or SIGABRT) after its results are written,
    past the point where faulthandler could report it: in Paddle's teardown at exit. It
    happened on the Paddle-kernel path too, where no code of this package is compiled,
    and 35 runs in a row on a loaded machine did not repeat it."""
    try:
        return _run_on_ranks_once(script, arguments, out, ranks, "")
    except AssertionError as failure:
        if not KILLED_BY_A_SIGNAL.search(str(failure)):
            raise
        warnings.warn(f"a rank died of a signal; ran it once more:\n{failure}", stacklevel=2)
        return _run_on_ranks_once(script, arguments, out, ranks, "_again")


def _run_on_ranks_once(script, arguments, out, ranks, attempt):
    log_dir = out / f"log_{os.path.basename(script)}_{arguments[0] if arguments else ''}{attempt}"
    env = dict(
        os.environ,
        PYTHONFAULTHANDLER="1",
        PYTHONPATH=os.pathsep.join(p for p in (TESTS, REPO, os.environ.get("PYTHONPATH")) if p),
    )
    command = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--nproc_per_node",
        str(ranks),
        "--master",
        f"127.0.0.1:{free_loopback_port()}",
        "--log_dir",
        str(log_dir),
        script,
        *arguments,
    ]
    # A session of its own, so that a hung run is killed with every rank it started.
    process = subprocess.Popen(
        command,
        cwd=os.path.dirname(script),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{arguments}: no result within {LAUNCH_TIMEOUT_S} s (a rank waiting?)")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    logs = [
        "" if not path.exists() else path.read_text(errors="replace")
        for path in (log_dir / f"workerlog.{rank}" for rank in range(ranks))
    ]
    console = output.decode(errors="replace")
    assert process.returncode == 0, console[-3000:] + "".join(log[-3000:] for log in logs)
    return console, logs


def launch(scenario, out, ranks=2):
    """Run the worker's ``scenario`` on ``ranks`` processes; the per-rank results."""
    run_on_ranks(WORKER, [scenario, str(out)], out, ranks)
    return [dict(np.load(out / f"{scenario}.rank{rank}.npz")) for rank in range(ranks)]


def expected_log(skipped_steps, steps=range(STEPS)):
    """What each rank must record after each step, from the reference rule."""
    rule = ReferenceScaler(2.0**10, incr_every_n_steps=3)
    rows, skipped, streak = [], 0, 0
    for iteration, step in enumerate(steps, start=1):
        found = step in skipped_steps
        rule.update(found)
        skipped += found
        streak = streak + 1 if found else 0
        rows.append(
            [
                found,
                float(rule.scale),
                rule.incr_count,
                rule.decr_count,
                iteration,
                skipped,
                streak,
                rule.growths,
                rule.backoffs,
            ]
        )
    return np.array(rows, dtype="float64")


def unscaled_params(rank, skipped_steps):
    """The same training without a scaler, on one rank's data, leaving out ``skipped``."""
    model = make_model(seed=0)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    for step, batch in enumerate(batches(seed=rank, steps=STEPS)):
        if step in skipped_steps:
            continue
        loss_of(model, batch).backward()
        optimizer.step()
        optimizer.clear_grad()
    return [p.numpy() for p in model.parameters()]


def params_in(result, prefix):
    count = len([key for key in result if key.startswith(prefix)])
    return [result[f"{prefix}{index}"] for index in range(count)]


@pytest.fixture(scope="module")
def independent(tmp_path_factory):
    return launch("independent", tmp_path_factory.mktemp("independent"))


@pytest.mark.parametrize("name", ["sync", "group"])
def test_every_rank_skips_the_steps_any_rank_overflowed(independent, name):
    expected = expected_log(set(EVERY))
    for rank, result in enumerate(independent):
        np.testing.assert_array_equal(result[f"{name}_log"], expected, err_msg=f"rank {rank}")
        for got, want in zip(params_in(result, f"{name}_param"), unscaled_params(rank, EVERY)):
            np.testing.assert_array_equal(got, want)


def test_ranks_with_different_gradients_take_the_same_headroom_decisions(independent):
    # Each rank measures its own amax; the policy grows and backs off alike on both, and
    # every rank skips the steps any rank overflowed.
    logs = [result["headroom_log"] for result in independent]
    np.testing.assert_array_equal(logs[0], logs[1])
    skipped = [step for step, row in enumerate(logs[0]) if row[0]]
    assert skipped == sorted(EVERY)
    assert logs[0][:, 7].max() > 0  # it grew, from the measured amax
    for rank, result in enumerate(independent):
        for got, want in zip(params_in(result, "headroom_param"), unscaled_params(rank, EVERY)):
            np.testing.assert_array_equal(got, want)


def test_without_sync_each_rank_follows_its_own_flag(independent):
    for rank, result in enumerate(independent):
        np.testing.assert_array_equal(result["nosync_log"], expected_log(INJECTED[rank]))
        own = sorted(INJECTED[rank])
        for got, want in zip(params_in(result, "nosync_param"), unscaled_params(rank, own)):
            np.testing.assert_array_equal(got, want)
    assert not np.array_equal(independent[0]["nosync_log"], independent[1]["nosync_log"])


def test_check_consistency_names_the_rank_that_differs(independent):
    for result in independent:
        message = str(result["inconsistency"])
        assert "rank 1: scale 3 (rank 0: " in message, message
        assert "rank 0:" not in message.split("differs between ranks;")[1].split("(")[0]


def test_the_data_parallel_example_prints_on_two_ranks_what_its_page_shows(tmp_path):
    with open(os.path.join(REPO, "docs", "distributed.md"), encoding="utf-8") as page:
        section = page.read().split("## Running it")[1]
    shown = re.search(r"```text\n(2 ranks agree: .*?)```", section, re.S)[1]
    *results, resumed = shown.strip().splitlines()
    example = os.path.join(REPO, "examples", "distributed_data_parallel.py")
    _, logs = run_on_ranks(example, ["--steps", "40", "--ckpt-dir", str(tmp_path)], tmp_path)
    printed = [line for line in logs[0].splitlines() if line.startswith(("2 ranks", "last loss"))]
    assert printed == results, logs[0][-2000:]
    assert resumed.startswith("every rank resumed from step 40 of "), resumed
    assert f"every rank resumed from step 40 of {tmp_path}" in logs[0], logs[0][-2000:]
    assert "2 ranks agree" not in logs[1]


def test_the_two_rank_benchmark_reports_the_reduction(tmp_path):
    script = os.path.join(REPO, "benchmarks", "bench_distributed.py")
    _, logs = run_on_ranks(script, ["--rounds", "5", "--workload", "4x1K"], tmp_path)
    assert "the reduction: " in logs[0] and "ms per step" in logs[0], logs[0][-2000:]


def test_logs_and_warnings_come_from_rank_zero_only(tmp_path):
    first, second = launch("logs", tmp_path)
    # Steps 1 and 2 overflowed on rank 1 (step 5 on rank 0): every rank skipped them.
    logged = [message for message in first["records"] if message]
    skips = [message for message in logged if " skipped: inf/nan" in message]
    assert [message.split(":")[0] for message in skips] == [
        "iteration 2 skipped",
        "iteration 3 skipped",
        "iteration 6 skipped",
    ], logged
    # Rank 0's own gradients were finite on steps 1 and 2, and held the inf of step 5.
    assert all("none in the gradients this rank counted" in m for m in skips[:2]), skips
    assert "linear_" in skips[2] and "(128 inf, 0 nan)" in skips[2], skips
    # The stuck policy speaks once, as a warning, not as a log line too.
    assert not any("stuck_after=1" in message for message in logged), logged
    # Two streaks (iterations 2 and 3, then 6): one warning each.
    assert sum("stuck_after=1" in message for message in first["warnings"]) == 2
    assert list(second["records"]) == [""] and not any(
        "stuck_after" in message for message in second["warnings"]
    )


def test_a_rank_without_gradients_for_an_optimizer_does_not_hang_the_others(tmp_path):
    first, second = launch("branch", tmp_path)
    np.testing.assert_array_equal(first["log"], second["log"])
    np.testing.assert_array_equal(first["log"], expected_log(set(EVERY)))


def test_data_parallel_ranks_equal_a_single_process_over_the_global_batch(tmp_path):
    first, second = launch("dp", tmp_path)
    np.testing.assert_array_equal(first["log"], second["log"])
    np.testing.assert_array_equal(first["log"], expected_log({2}, steps=range(6)))
    model = make_model(seed=0)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    for step, batch in enumerate(batches(seed=7)):
        if step == 2:
            continue
        loss_of(model, batch).backward()
        optimizer.step()
        optimizer.clear_grad()
    for index, param in enumerate(model.parameters()):
        np.testing.assert_array_equal(first[f"param{index}"], second[f"param{index}"])
        # Two half-batch means averaged against one mean: the same up to rounding.
        np.testing.assert_allclose(first[f"param{index}"], param.numpy(), rtol=1e-5, atol=1e-6)


def resume_on_ranks(scenario, tmp_path, saved_after):
    """Both phases of the worker's ``scenario``; asserts that each rank's resumed run ends
    as its uninterrupted run did, bit for bit, and returns the uninterrupted runs."""
    whole = launch(f"{scenario}_first", tmp_path)
    resumed = launch(f"{scenario}_second", tmp_path)
    for rank in range(2):
        np.testing.assert_array_equal(
            resumed[rank]["resumed_log"], whole[rank]["whole_log"][saved_after:]
        )
        for got, want in zip(
            params_in(resumed[rank], "resumed_param"), params_in(whole[rank], "whole_param")
        ):
            np.testing.assert_array_equal(got, want)
    return whole


def test_a_resumed_distributed_run_ends_bit_identical(tmp_path):
    whole = resume_on_ranks("resume", tmp_path, saved_after=4)
    np.testing.assert_array_equal(whole[0]["whole_log"], whole[1]["whole_log"])


def test_one_checkpoint_saved_on_rank_zero_resumes_every_rank_bit_identical(tmp_path):
    whole = resume_on_ranks("dp_resume", tmp_path, saved_after=3)
    assert whole[0]["whole_log"][:, 0].tolist() == [0, 1, 0, 0, 1, 0]  # rank 1's infs


@pytest.mark.parametrize("degree", ["dp", "mp"])
def test_fleet_distributed_scaler_ranks_skip_together(tmp_path, degree):
    first, second = launch(f"fleet_{degree}", tmp_path)
    np.testing.assert_array_equal(first["log"], second["log"])
    skipped = first["log"][:, 0]
    assert [step for step in range(STEPS) if skipped[step]] == EVERY
    assert not math.isnan(first["log"][-1, 1])


# -- in this process: one rank ---------------------------------------------------------


def test_group_and_sync_found_inf_are_checked():
    from paddle_amp_scaler import AmpScaler, GradScaler

    with pytest.raises(TypeError, match="group must be None or a paddle.distributed group"):
        GradScaler(group=[0, 1])
    with pytest.raises(TypeError, match="sync_found_inf must be a bool"):
        AmpScaler(sync_found_inf=1)


def test_one_process_makes_no_collective_and_has_nothing_to_compare(monkeypatch):
    from paddle_amp_scaler import GradScaler
    from paddle_amp_scaler.compat.torch import GradScaler as TorchGradScaler

    def no_collective(*args, **kwargs):
        raise AssertionError("a collective in a single process")

    monkeypatch.setattr(paddle.distributed, "all_reduce", no_collective)
    monkeypatch.setattr(paddle.distributed, "all_gather", no_collective)
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    for scaler in (GradScaler(), TorchGradScaler("cpu", sync_found_inf=True, group=None)):
        scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        scaler.check_consistency()
