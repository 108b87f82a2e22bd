"""Paddle 3's semi-automatic parallelism, in real processes: two CPU ranks started by
Paddle's launcher (the harness of test_distributed.py), a tensor-parallel MLP placed with
``dist.shard_layer`` and ``dist.shard_optimizer``, and the scaler with and without
``dist.shard_scaler``. Paddle's own scaler, enabled on the CPU, is the reference; the
update rule's specification another. The worker is semi_auto_worker.py."""

import os
import pickle
import re
import sys

import numpy as np
import paddle
import paddle.distributed as dist
import pytest
from test_cli import run_cli

from paddle_amp_scaler import GradScaler, load_checkpoint
from paddle_amp_scaler.checkpoint import read_checkpoint

from helpers import tool
from reference_rule import ReferenceScaler
from test_distributed import REPO, TESTS, run_on_ranks

WORKER = os.path.join(TESTS, "semi_auto_worker.py")
STEPS, INF_STEP = 6, 3  # as in semi_auto_worker.py
OPTIMIZERS = ("sgd", "adamw")
OURS = ("ours_shard_scaler", "ours_own")

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the gloo launcher runs on Linux only"),
    pytest.mark.skipif(
        not hasattr(dist, "shard_scaler"),
        reason=f"Paddle {paddle.__version__} has no semi-automatic parallel API "
        "(dist.shard_scaler came with 3.0)",
    ),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The worker's results per rank, and the folder of what it saved."""
    out = tmp_path_factory.mktemp("semi_auto")
    # A single-process run's state, for the worker to resume from.
    single = GradScaler(policy="headroom", init_loss_scaling=2.0**12)
    paddle.save(single.state_dict(), str(out / "single.pdparams"))
    run_on_ranks(WORKER, [str(out)], out)
    results = [dict(np.load(out / f"semi_auto.rank{rank}.npz")) for rank in range(2)]
    return results, out


def reference_log(init=2.0**10, incr_every_n_steps=2):
    """[skipped, scale] per step by the rule's specification, every rank skipping the
    step rank 0 overflowed."""
    rule = ReferenceScaler(init, incr_every_n_steps=incr_every_n_steps)
    rows = []
    for step in range(STEPS):
        rule.update(step == INF_STEP)
        rows.append([step == INF_STEP, float(rule.scale)])
    return np.array(rows, dtype="float64")


def each_rank(run, key):
    results, _ = run
    values = [result[key] for result in results]
    np.testing.assert_array_equal(values[0], values[1], err_msg=f"{key}: the ranks differ")
    return values[0]


@pytest.mark.parametrize("variant", OURS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize(
    ("layout", "where"), [("tensor", "loss"), ("tensor", "grad"), ("data", "loss")]
)
def test_the_same_skips_scale_and_parameters_as_paddles_scaler(
    run, layout, where, optimizer, variant
):
    # With shard_scaler Paddle's unscale runs and the package does the rest; without it
    # the package's own reduction over the gradients' mesh agrees the verdict. "tensor":
    # fc1 split by columns, fc2 by rows; "data": parameters replicated, the batch split.
    key = f"match_{layout}_{optimizer}_{where}"
    results, _ = run
    # Paddle 3.0's own scaler cannot run the data layout (semi_auto_worker.py says why):
    # there the scaler is held to the rule, and with shard_scaler to without it.
    reference = "paddle" if f"{key}_paddle_log" in results[0] else "ours_own"
    np.testing.assert_array_equal(each_rank(run, f"{key}_{reference}_log"), reference_log())
    np.testing.assert_array_equal(
        each_rank(run, f"{key}_{variant}_log"), each_rank(run, f"{key}_{reference}_log")
    )
    for rank, result in enumerate(results):
        np.testing.assert_array_equal(
            result[f"{key}_{variant}_params"],
            result[f"{key}_{reference}_params"],
            err_msg=f"rank {rank}'s parameters",
        )


@pytest.mark.parametrize("variant", OURS)
def test_the_headroom_amax_of_sharded_gradients_is_the_largest_over_every_shard(run, variant):
    held, whole_fc1 = [result[f"headroom_{variant}_fc1_amax"] for result in run[0]][0]
    # The test means something: in the measured iterations rank 0's shard of fc1's
    # gradient lies five binades and more below the whole gradient's largest magnitude.
    assert np.all(held[:3] * 2.0**5 < whole_fc1[:3]), (held, whole_fc1)
    whole, kept = each_rank(run, f"headroom_{variant}_amax")
    # The first three iterations are measured: what the rule kept is the whole amax.
    np.testing.assert_array_equal(kept[:3], whole[:3])
    log = each_rank(run, f"headroom_{variant}_log")
    assert not log[:, 0].any()
    assert log[0, 1] != 2.0**10, "the rule fitted the scale to the amax it measured"


def test_under_shard_scaler_the_package_adds_no_host_read_and_no_collective(run):
    ours_reads = each_rank(run, "cost_ours_shard_scaler_reads")
    paddles_reads = each_rank(run, "cost_paddle_reads")
    assert ours_reads[0] == 0, "host reads by the package's own code"
    assert ours_reads[1] == paddles_reads[1] > 0  # AdamW reads its flag, under either
    np.testing.assert_array_equal(
        each_rank(run, "cost_ours_shard_scaler_collectives"),
        each_rank(run, "cost_paddle_collectives"),
    )


@pytest.mark.parametrize("variant", OURS)
@pytest.mark.parametrize("policy", ["interval", "headroom"])
def test_every_part_of_the_scaler_takes_dist_gradients(run, policy, variant):
    key = f"surface_{policy}_{variant}"
    log = each_rank(run, f"{key}_log")
    np.testing.assert_array_equal(log[:, 0], reference_log()[:, 0])
    if policy == "interval":
        np.testing.assert_array_equal(log, reference_log())
    stats = each_rank(run, f"{key}_stats")
    iterations, skipped, streak, last_skipped, _, backoffs, scale, _, _, nonfinite_loss = stats
    assert (iterations, skipped, streak, last_skipped, backoffs) == (STEPS, 1, 0, INF_STEP + 1, 1)
    # The inf was in a gradient: every loss, a dist tensor here, was finite.
    assert nonfinite_loss == 0
    assert scale == log[-1, 1]
    np.testing.assert_array_equal(each_rank(run, f"{key}_reloaded"), stats)
    # stuck_after=1: the policy's callable saw the skipped iteration, on every rank.
    assert list(each_rank(run, f"{key}_stuck")) == [INF_STEP + 1]
    # Each rank counts its own shards: the inf was in rank 0's shard of fc1's gradient, an
    # 8 x 8 block.
    first, second = (result[f"{key}_report"] for result in run[0])
    assert list(first) == [f"fc1.weight 64 0 {INF_STEP + 1}"]
    assert list(second) == []


@pytest.mark.parametrize("policy", ["interval", "headroom"])
def test_what_a_rank_saves_holds_plain_numbers_and_loads_into_one_process(run, policy):
    results, out = run
    key = f"surface_{policy}_ours_own"
    with open(out / f"{key}.rank0.pickle", "rb") as file:
        saved = pickle.load(file)
    assert not any(isinstance(value, paddle.Tensor) for value in saved.values()), saved
    assert saved["scale"].dtype == np.float32 and saved["scale"].shape == (1,)
    single = GradScaler(policy=policy)
    single.load_state_dict(saved)
    stats = results[0][f"{key}_stats"]
    assert single.stats().scale == stats[6] and single.stats().iterations == STEPS
    # The checkpoint's scaler state too, and inspect reads the file.
    checkpoint = out / f"{key}.rank0.ckpt"
    from_checkpoint = GradScaler(policy=policy)
    from_checkpoint.load_state_dict(read_checkpoint(checkpoint).scaler)
    assert from_checkpoint.state_dict()["scale"] == saved["scale"]
    inspected = run_cli("inspect", str(checkpoint), cwd=out)
    assert inspected.returncode == 0, inspected.stderr
    shown = inspected.stdout
    assert re.search(rf"^step +{STEPS}$", shown, re.M), shown
    assert re.search(rf"^  scale +{stats[6]}$", shown, re.M), shown


@pytest.mark.parametrize("policy", ["interval", "headroom"])
def test_a_ranks_checkpoint_resumes_a_sharded_run(run, policy):
    key = f"surface_{policy}_ours_own"
    np.testing.assert_array_equal(
        each_rank(run, f"{key}_resumed_stats"), each_rank(run, f"{key}_stats")
    )
    for rank, result in enumerate(run[0]):
        np.testing.assert_array_equal(
            result[f"{key}_resumed_params"], result[f"{key}_params"], err_msg=f"rank {rank}"
        )


def test_a_ranks_checkpoint_resumes_a_single_process_run(run):
    # Paddle gathers a dist tensor's shards when it is read whole: a rank's checkpoint
    # holds the whole model and optimizer, which an unsharded run takes as they are.
    results, out = run
    from semi_auto_worker import MLP

    paddle.seed(1)
    model = MLP()
    optimizer = paddle.optimizer.AdamW(0.01, parameters=model.parameters())
    scaler = GradScaler()
    step = load_checkpoint(
        out / "surface_interval_ours_own.rank0.ckpt",
        model=model,
        optimizer=optimizer,
        scaler=scaler,
    )
    assert step == STEPS
    assert scaler.stats().scale == results[0]["surface_interval_ours_own_stats"][6]
    whole = np.concatenate([p.numpy().ravel() for p in model.parameters()])
    np.testing.assert_array_equal(whole, results[0]["surface_interval_ours_own_whole_params"])


def test_a_single_process_state_loads_under_semi_automatic_parallelism(run):
    _, out = run
    written = paddle.load(str(out / "single.pdparams"))
    for rank in range(2):
        loaded = paddle.load(str(out / f"single_loaded.rank{rank}.pdparams"))
        assert loaded.keys() == written.keys()
        for name, value in written.items():
            np.testing.assert_equal(loaded[name], value, err_msg=name)
    log = each_rank(run, "from_single_process_log")
    assert not log[:, 0].any()


def test_check_consistency_names_the_rank_that_differs_without_a_global_group(run):
    # The worker never calls init_parallel_env: the check gathers all the same.
    message = str(each_rank(run, "inconsistency"))
    assert "rank 1: scale 3 (rank 0: 2048)" in message, message


@pytest.mark.parametrize(
    "face",
    [
        "torch",
        "keras",
        "install",
        "minimize_ours_own",
        "minimize_ours_shard_scaler",
        "unscale_ours_own",
        "unscale_ours_shard_scaler",
    ],
)
def test_the_faces_and_install_train_as_the_scaler_does(run, face):
    np.testing.assert_array_equal(
        each_rank(run, f"face_{face}_log"), each_rank(run, "match_tensor_adamw_grad_ours_own_log")
    )
    if face == "install":
        assert str(each_rank(run, "face_install_type")) == "paddle_amp_scaler.core.scaler"


def test_mindspores_functional_scaler_takes_dist_gradients(run):
    np.testing.assert_array_equal(each_rank(run, "face_mindspore_log"), reference_log())


def test_the_example_prints_on_two_ranks_what_its_page_shows(tmp_path):
    # The page's block is generated by tools/docs_outputs.py (make docs-output).
    outputs = tool("docs_outputs")
    with open(os.path.join(REPO, "docs", "distributed.md"), encoding="utf-8") as page:
        (block,) = (
            match
            for match in outputs.MARKED.finditer(page.read())
            if "examples/semi_auto_parallel.py" in match["command"]
        )
    example = os.path.join(REPO, "examples", "semi_auto_parallel.py")
    _, logs = run_on_ranks(example, ["--steps", "40"], tmp_path)
    shown, printed = block["body"].strip(), outputs.rank_zero_lines(logs[0])
    assert outputs.agree(shown, printed, outputs.drifts(block["drifts"])), printed
    assert "2 ranks agree" not in logs[1]


def test_a_gradient_on_a_mesh_without_this_rank_is_left_out():
    # In a pipeline split each stage's parameters live on a mesh of their own; on the
    # other stages' ranks their gradients hold no shard (an uninitialized local value of
    # the whole shape, whose memory a kernel would read as numbers).
    from paddle_amp_scaler.core import kernels

    def on(ranks, values):
        mesh = dist.ProcessMesh(ranks)
        return dist.shard_tensor(paddle.to_tensor(values), mesh, [dist.Replicate()])

    held, elsewhere = on([0], [[1.0, float("inf")]]), on([1], [[1.0, 2.0]])
    assert not elsewhere._local_value()._is_initialized()
    scale, finite = paddle.to_tensor([4.0]), paddle.to_tensor([False])
    assert kernels.measure([elsewhere, None]) is None
    checked = kernels.grads_by_dtype_of([elsewhere, None])
    assert not bool(kernels.unscale_and_check_(checked, scale, finite))
    table = kernels.measure([held, elsewhere])
    assert table.shape == [1, 3] and float(kernels.amax_in(table).numpy()[0]) == float("inf")
    checked = kernels.grads_by_dtype_of([held, elsewhere])
    assert bool(kernels.unscale_and_check_(checked, scale, finite))
