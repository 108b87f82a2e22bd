"""What a step issues on a GPU, counted: Paddle operations (kernel launches there) and
host reads (device syncs), ours against Paddle's own scaler.

Ours' counts are a budget, stated in docs/benchmarks.md and worked out here from what
the code does: a change that adds an operation fails here, and so does one that makes
ours issue more than Paddle's with an optimizer that reads the flag.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

from paddle_amp_scaler.core import monitoring

import gpu_path_ops

# The stubbed optimizers hold float16 parameters on purpose; they update nothing.
pytestmark = pytest.mark.filterwarnings("ignore:Accumulating with FP16")


def unscale(groups, optimizers):
    """Per optimizer, one unscale per dtype group and the ORs joining their flags."""
    return optimizers * (2 * groups - 1)


def budget(case):
    """Ours per steady-state step (the rule does not act in it): scale() 2 (the loss
    checked for inf/nan, then scaled), and the unscales. An optimizer that reads its flag
    (AdamW) leaves the verdict on the host, where the counters follow it: the update
    issues nothing. Plain SGD skips on the
    device, one zeroing per dtype group and optimizer, without a read; the ORs join the
    optimizers' flags, and the rule runs there: the update kernel and the ``equal`` that
    says whether it acted."""
    groups, optimizers = case.dtype_groups, case.optimizers
    operations = 2 + unscale(groups, optimizers)
    if case.optimizer == "sgd":
        return operations + optimizers * groups + (optimizers - 1) + 2, 0
    return operations, optimizers


def paddles(case):
    """Paddle's per step: scale() 1; per optimizer and dtype group, one unscale and one OR
    (the first with a constant false); each optimizer reads its flag."""
    return 1 + 2 * case.dtype_groups * case.optimizers, case.optimizers


@pytest.mark.parametrize("case", gpu_path_ops.cases(), ids=repr)
def test_a_step_issues_what_the_budget_says(case):
    counts = gpu_path_ops.count_case(case)
    ours, native = counts["ours"], counts["native"]
    assert (native.operations, native.reads) == paddles(case), native.names
    assert (ours.operations, ours.reads) == budget(case), ours.names
    if case.optimizer == "sgd":
        # A launch per dtype group and optimizer, and the rule's one, in place of each
        # optimizer's device sync; and the loss's check.
        assert ours.reads == 0 < native.reads
        assert ours.operations == native.operations + case.optimizers * case.dtype_groups + 2
    else:
        # One OR fewer per optimizer than Paddle's, one more for the loss's check, and the
        # same reads: Paddle's own.
        assert ours.operations == native.operations - case.optimizers + 1
        assert ours.reads == native.reads


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_growth_costs_what_the_budget_says(kind):
    counts = gpu_path_ops.count_growth(kind)
    ours, native = counts["ours"], counts["native"]
    # Paddle's multiplies its scale once more on the host's decision.
    assert native.operations == paddles(gpu_path_ops.Case(kind, 1, 1))[0] + 1
    step = budget(gpu_path_ops.Case(kind, 1, 1))[0]
    if kind == "sgd":
        # The rule runs on the device in every iteration: a growth costs nothing more.
        assert ours.operations == step, ours.names
    else:
        # The counters written back to the device (2), the update kernel and its
        # ``equal`` (2): the verdict's flag is the unscale's own.
        assert ours.operations == step + 4, ours.names


@pytest.mark.parametrize(("kind", "fold"), [("adamw", 50), ("sgd", 52)])
def test_the_statistics_fold_costs_what_the_budget_says(kind, fold):
    # The 128th iteration of a run adds up the statistics of all 128: its step, plus the
    # verdicts, the rule's actions and the losses' checks made three int64 columns (host
    # bools: a cast each; device flags: a concat or a stack and a cast each), the
    # positions of the last skipped, the last finite and the last finite-loss iteration,
    # and the seven new counts: 14 operations more than before the losses were counted.
    assert monitoring._FOLD_EVERY == 128
    count = gpu_path_ops.count_fold(kind)
    step, reads = budget(gpu_path_ops.Case(kind, 1, 1))
    assert (count.operations, count.reads) == (step + fold, reads), count.names


# The headroom rule's device form in a measured iteration, over the interval rule's
# (which issues nothing where the verdict is on the host): the counters written back
# where the host kept them (2, but not in the first iterations, in which the device kept
# them), the update kernel and its ``equal`` (2), the anchor following a back-off the
# loss caused (5), the calibration (4, in the first 3 iterations) and the rest of the
# rule (40).
RULE_OPERATIONS = {"calibrating": 2 + 5 + 4 + 40, "later": 2 + 2 + 5 + 40}


@pytest.mark.parametrize("case", gpu_path_ops.policy_cases(), ids=repr)
def test_the_headroom_policy_costs_what_the_budget_says(case):
    # Over a run's first 100 iterations, calibration included: the policy measures and
    # decides in the first 3 and the 64th, and costs nothing more in the others. Each
    # measured iteration: seven operations per gradient (its magnitude, which elements
    # are nonzero and which below float16's floor, its max and two counts); per
    # optimizer 13: the two bounds, the table made of those (7) and its amax (4); 13
    # more to copy the scale, join the optimizers' amaxes and keep the iteration's
    # totals (7), and to add them to the window, noise left out (6); then the rule.
    measured = gpu_path_ops.measured_iterations()
    assert measured == [1, 2, 3, 64]
    amax = 7 * case.tensors * case.optimizers + 13 * case.optimizers + 13
    rule = 3 * RULE_OPERATIONS["calibrating"] + RULE_OPERATIONS["later"]
    extra, interval, headroom = gpu_path_ops.headroom_extra(case)
    # The interval rule's run: every iteration a steady-state step, the first included.
    step = budget(gpu_path_ops.Case("adamw", 1, case.optimizers))[0]
    assert interval.operations == 100 * step, interval.names
    assert extra == len(measured) * amax + rule, headroom.names
    # And no host read of its own: the same reads as the interval rule's (AdamW's).
    assert headroom.reads == interval.reads == 100 * case.optimizers
