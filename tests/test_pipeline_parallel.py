"""fleet's pipeline parallelism, in real processes: two CPU ranks over gloo, one stage
each, started by Paddle's launcher through test_distributed.py's harness. Through
``fleet.distributed_scaler`` and ``train_batch``, this package's GradScaler must skip the
steps Paddle's own GradScaler skips, hold the same scale after every step, and leave
each stage's parameters bit for bit as Paddle's does."""

import math
import os
import re
import sys

import numpy as np
import paddle
import pytest
from paddle.distributed.fleet.proto import distributed_strategy_pb2

from helpers import tool
from test_distributed import COLUMNS, REPO, TESTS, expected_log, params_in, run_on_ranks

WORKER = os.path.join(TESTS, "pipeline_worker.py")
EXAMPLE = os.path.join(REPO, "examples", "pipeline_parallel.py")
OVERFLOWING = [3, 5]  # pipeline_worker.py's INF_IN_A_GRADIENT, INF_IN_THE_LOSS
# What pipeline_worker.py records of Paddle's scaler: skipped, scale, incr_count, decr_count.
PADDLE_COLUMNS = COLUMNS[:4]

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the gloo launcher runs on Linux only"),
    pytest.mark.skipif(
        "use_batch_p2p_comm" not in distributed_strategy_pb2.PpConfig.DESCRIPTOR.fields_by_name,
        reason=(
            f"Paddle {paddle.__version__} cannot run fleet's pipeline on the CPU: its p2p "
            "sends each activation with send_on_calc_stream, which gloo does not implement "
            "(NotImplementedError: ProcessGroupGLOO does not support send with sync_op and "
            "use_calc_stream flag), and it has no pp_configs.use_batch_p2p_comm to send "
            "otherwise"
        ),
    ),
]


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """One launch: on each stage, our scaler's run, Paddle's and an unscaled one."""
    out = tmp_path_factory.mktemp("pipeline")
    run_on_ranks(WORKER, [str(out)], out)
    results = [dict(np.load(out / f"pipeline.rank{rank}.npz")) for rank in range(2)]
    assert [int(result["stage"]) for result in results] == [0, 1]
    return results


def test_every_stage_skips_and_scales_as_paddles_scaler_does(stages):
    expected = expected_log(set(OVERFLOWING))
    for result in stages:
        np.testing.assert_array_equal(result["ours_log"], expected)
        np.testing.assert_array_equal(
            result["ours_log"][:, : len(PADDLE_COLUMNS)], result["paddle_log"]
        )


def test_the_first_stages_overflow_skips_the_last_stage_whose_gradients_were_finite(stages):
    for result in stages:
        np.testing.assert_array_equal(result["ours_loss"], result["paddle_loss"])
        losses = result["ours_loss"]
        # The inf of step 3 sat in the first stage's gradients: the loss, and so the last
        # stage's gradients, stayed finite; yet the last stage skipped that step too.
        assert math.isfinite(losses[OVERFLOWING[0]]) and math.isinf(losses[OVERFLOWING[1]])
        kept = [step for step in range(len(losses)) if step not in OVERFLOWING]
        np.testing.assert_array_equal(losses[kept], result["unscaled_loss"])


def test_each_stage_ends_bit_identical_to_paddles_scaler_and_to_an_unscaled_run(stages):
    for result in stages:
        ours, paddles = params_in(result, "ours_param"), params_in(result, "paddle_param")
        unscaled = params_in(result, "unscaled_param")
        assert len(ours) == len(paddles) == len(unscaled) == 4  # two Linear layers a stage
        for mine, theirs, plain in zip(ours, paddles, unscaled):
            np.testing.assert_array_equal(mine, theirs)
            np.testing.assert_array_equal(mine, plain)
    first, last = (params_in(result, "ours_param")[0] for result in stages)
    assert first.shape != last.shape  # each rank holds its own stage


def test_the_stages_scalers_agree(stages):
    assert [str(result["consistency"]) for result in stages] == ["", ""]


def test_the_example_prints_on_two_ranks_what_its_page_shows(tmp_path):
    outputs = tool("docs_outputs")
    with open(os.path.join(REPO, "docs", "distributed.md"), encoding="utf-8") as page:
        blocks = [
            match
            for match in outputs.MARKED.finditer(page.read())
            if "examples/pipeline_parallel.py" in match["command"]
        ]
    assert len(blocks) == 1, "the page shows the example's output once, in a marked block"
    assert re.search(r"\brank 0\b", blocks[0]["options"]), blocks[0]["options"]
    _, logs = run_on_ranks(EXAMPLE, [], tmp_path)
    shown, printed = blocks[0]["body"].strip(), outputs.rank_zero_lines(logs[0])
    assert outputs.agree(shown, printed, outputs.drifts(blocks[0]["drifts"])), printed
    assert "stages agree" not in logs[1]


def test_the_headroom_policy_and_the_overflow_report_see_the_stages_gradients(stages):
    # fleet's unscale measures and counts nothing; the scaler takes the amax (agreed over
    # the stages) and the counts before it.
    logs = [result["headroom_log"] for result in stages]
    np.testing.assert_array_equal(logs[0][:, :2], logs[1][:, :2])
    scale, headroom_bits, reported = logs[0].T
    assert headroom_bits[0] > 0, "the first iteration was measured"
    assert scale[0] != 2.0**10, "and the scale fitted to it"
    # The inf in stage 0's gradient at step 3 is counted there, and there only.
    step = OVERFLOWING[0]
    assert logs[0][step, 2] == step + 1
    assert logs[1][step, 2] < step + 1
