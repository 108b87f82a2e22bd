"""min_loss_scaling and max_loss_scaling: applied on the device, validated, kept by
set_init_loss_scaling, carried in state_dict and clamped with a warning on load."""

import math
import warnings

import numpy as np
import paddle
import pytest
from counters import HostReadCounter
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import GradScaler

from reference_rule import ReferenceScaler


def bounded_scaler(init, lower, upper, incr=2, decr=1, **kwargs):
    return GradScaler(
        init_loss_scaling=init,
        incr_every_n_steps=incr,
        decr_every_n_nan_or_inf=decr,
        min_loss_scaling=lower,
        max_loss_scaling=upper,
        **kwargs,
    )


def run(scaler, overflows, observe=True):
    """One SGD iteration per entry; True writes inf into the gradient. Returns the scale
    and counters after each (reading them: ``observe=False`` reads nothing)."""
    param = paddle.create_parameter([4], "float32")
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=[param])
    observed = []
    for overflow in overflows:
        param.grad = paddle.full([4], math.inf if overflow else 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        if observe:
            observed.append(
                (scaler.get_loss_scaling(), scaler.get_incr_count(), scaler.get_decr_count())
            )
    return observed


def expected(overflows, init, lower, upper, incr=2, decr=1, **ratios):
    reference = ReferenceScaler(
        init,
        incr_every_n_steps=incr,
        decr_every_n_nan_or_inf=decr,
        min_scale=lower,
        max_scale=upper,
        **ratios,
    )
    snapshots = []
    for overflow in overflows:
        reference.update(overflow)
        snapshots.append(reference.snapshot())
    return snapshots


BOUNDS = [(1.0, None), (0.125, None), (0.75, 48.0), (4.0, 1024.0), (1.0, 64.0), (2.0**-20, 2.0)]


@settings(max_examples=40, deadline=None)
@given(
    overflows=st.lists(st.booleans(), min_size=1, max_size=30),
    bounds=st.sampled_from(BOUNDS),
    incr=st.integers(1, 3),
    decr=st.integers(1, 2),
    ratios=st.sampled_from([(2.0, 0.5), (3.0, 0.3)]),
    data=st.data(),
)
def test_scale_follows_the_rule_with_bounds(overflows, bounds, incr, decr, ratios, data):
    lower, upper = bounds
    init = data.draw(st.sampled_from([lower, upper or 2.0**20, math.sqrt(lower * (upper or 1e6))]))
    scaler = bounded_scaler(
        init, lower, upper, incr, decr, incr_ratio=ratios[0], decr_ratio=ratios[1]
    )
    assert run(scaler, overflows) == expected(
        overflows, init, lower, upper, incr, decr, incr_ratio=ratios[0], decr_ratio=ratios[1]
    )


def test_long_runs_stay_at_the_bounds():
    # 40 overflows from 2**10 go below 1.0 and stop at the floor; 60 finite steps climb
    # back and stop at the ceiling.
    overflows = [True] * 40 + [False] * 60
    scaler = bounded_scaler(1024.0, 0.125, 4096.0)
    observed = run(scaler, overflows)
    assert observed == expected(overflows, 1024.0, 0.125, 4096.0)
    assert observed[39][0] == 0.125 and observed[-1][0] == 4096.0
    assert scaler.stats().backoffs == 40 and scaler.stats().growths == 30


def test_bounds_cost_no_read():
    scaler = bounded_scaler(8.0, 0.5, 16.0)
    counter = HostReadCounter()
    with counter.counting():
        run(scaler, [True, False, False, True, True, True, False], observe=False)
    assert counter.total() == 0, counter.where


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"min_loss_scaling": 0.0}, ValueError, "min_loss_scaling"),
        ({"min_loss_scaling": "1"}, TypeError, "min_loss_scaling"),
        ({"max_loss_scaling": -1.0}, ValueError, "max_loss_scaling"),
        (
            {"min_loss_scaling": 8.0, "max_loss_scaling": 4.0},
            ValueError,
            "max_loss_scaling.*>= min",
        ),
        ({"min_loss_scaling": 2.0**17}, ValueError, "init_loss_scaling .* must lie within"),
        ({"max_loss_scaling": 2.0**10}, ValueError, "init_loss_scaling .* must lie within"),
    ],
)
def test_bad_bounds(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradScaler(**kwargs)


def test_set_init_loss_scaling_keeps_to_the_bounds():
    scaler = bounded_scaler(8.0, 2.0, 64.0)
    for outside in (1.0, 128.0):
        with pytest.raises(ValueError, match="new_init_loss_scaling"):
            scaler.set_init_loss_scaling(outside)
    assert scaler.get_loss_scaling() == 8.0
    scaler.set_init_loss_scaling(32.0)
    assert scaler.get_loss_scaling() == 32.0


# -- state_dict -----------------------------------------------------------------------


def test_state_dict_carries_the_bounds_and_a_load_restores_them():
    saved = bounded_scaler(8.0, 0.5, 64.0).state_dict()
    assert (saved["min_loss_scaling"], saved["max_loss_scaling"]) == (0.5, 64.0)
    scaler = GradScaler()
    scaler.load_state_dict(saved)
    overflows = [True] * 6 + [False] * 20
    assert run(scaler, overflows) == expected(overflows, 8.0, 0.5, 64.0)


def test_a_dict_without_bounds_keeps_the_scalers_own_and_clamps_its_scale():
    paddle_style = GradScaler(init_loss_scaling=2.0**16).state_dict()
    for key in ("min_loss_scaling", "max_loss_scaling", "stats"):
        del paddle_style[key]
    scaler = bounded_scaler(8.0, 1.0, 1024.0)
    with pytest.warns(UserWarning, match="clamped to 1024.0"):
        scaler.load_state_dict(paddle_style)
    assert (scaler.get_loss_scaling(), scaler.get_init_loss_scaling()) == (1024.0, 1024.0)
    assert run(scaler, [False] * 4)[-1][0] == 1024.0  # and stays there


def test_a_loaded_scale_inside_its_bounds_gives_no_warning():
    saved = bounded_scaler(8.0, 0.5, 64.0).state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GradScaler().load_state_dict(saved)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"min_loss_scaling": 0.0}, r"state_dict\['min_loss_scaling'\]"),
        ({"max_loss_scaling": "big"}, r"state_dict\['max_loss_scaling'\]"),
        ({"min_loss_scaling": 8.0, "max_loss_scaling": 2.0}, r"state_dict\['max_loss_scaling'\]"),
        ({"max_loss_scaling": None, "min_loss_scaling": None}, r"state_dict\['min_loss_scaling'\]"),
    ],
)
def test_bad_bounds_in_a_state_dict_change_nothing(change, match):
    saved = bounded_scaler(8.0, 0.5, 64.0).state_dict()
    saved.update(change)
    scaler = bounded_scaler(4.0, 2.0, 16.0)
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=match):
        scaler.load_state_dict(saved)
    after = scaler.state_dict()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_one_bound_without_the_other_is_refused():
    saved = bounded_scaler(8.0, 0.5, 64.0).state_dict()
    del saved["max_loss_scaling"]
    with pytest.raises(ValueError, match="missing the key 'max_loss_scaling'"):
        GradScaler().load_state_dict(saved)
