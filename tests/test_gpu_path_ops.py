"""What one step issues on the path a GPU takes, counted: Paddle operations (kernel
launches there) and host reads (device syncs), ours against Paddle's own scaler.

Ours' counts are a budget, stated in docs/benchmarks.md: a change that adds an
operation to the path fails here, and so does one that makes ours issue more than
Paddle's with an optimizer that reads the flag.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))

from paddle_amp_scaler import statistics

import gpu_path_ops

# The stubbed optimizers hold float16 parameters on purpose; they update nothing.
pytestmark = pytest.mark.filterwarnings("ignore:Accumulating with FP16")


def budget(case):
    """Ours per step: scale() 1; per optimizer, one unscale per dtype group and the ORs
    joining their flags; the ORs joining the optimizers' flags; the update 1 and the
    statistics' copy of the rule's counter 1; plain SGD skips on the device, one zeroing
    per dtype group and optimizer, where the others read the flag once per optimizer."""
    groups, optimizers = case.dtype_groups, case.optimizers
    operations = 1 + optimizers * (2 * groups - 1) + (optimizers - 1) + 2
    if case.optimizer == "sgd":
        return operations + optimizers * groups, 0
    return operations, optimizers


@pytest.mark.parametrize("case", gpu_path_ops.cases(), ids=repr)
def test_a_step_issues_what_the_budget_says(case):
    counts = gpu_path_ops.count_case(case)
    ours, native = counts["ours"], counts["native"]
    assert (ours.operations, ours.reads) == budget(case), ours.names
    # The statistics' one operation a step is the price of counting with no read.
    if case.optimizer == "sgd":
        # One launch per dtype group more than Paddle's, in place of its device sync.
        assert ours.reads == 0 < native.reads
        assert ours.operations == native.operations + 1 + case.optimizers * case.dtype_groups
    else:
        assert ours.operations <= native.operations + 1, (ours.names, native.names)
        assert ours.reads <= native.reads


def test_the_statistics_fold_costs_what_the_budget_says():
    # The 128th iteration of a run adds up the statistics of all 128: its step (one
    # unscale, one update, the rule's firing flag; the optimizer's read) plus the sums:
    # two concats and the casts that make the verdicts and the firings into integers,
    # the positions of the last skipped and the last finite iteration, and the five new
    # counts.
    assert statistics._FOLD_EVERY == 128
    count = gpu_path_ops.count_fold()
    assert (count.operations, count.reads) == (3 + 38, 1), count.names


@pytest.mark.parametrize("case", gpu_path_ops.policy_cases(), ids=repr)
def test_the_headroom_policy_costs_at_most_two_operations_and_one_per_eight_tensors(case):
    # Averaged over a run's first 100 iterations, calibration included: the policy
    # measures and decides in a few of them, and costs nothing more in the others.
    extra, interval, headroom = gpu_path_ops.headroom_extra(case)
    assert extra <= 2 + case.tensors * case.optimizers / 8, headroom.names
    # And no host read of its own: the same reads as the interval rule's (AdamW's).
    assert headroom.reads == interval.reads == 100 * case.optimizers
