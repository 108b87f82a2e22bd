"""The update rule's specification, ``rule.adjust``, against worked examples; and its two
device forms (Paddle's update_loss_scaling kernel, the compiled CPU module) against it on
long random sequences."""

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import kernels, rule

F32_MAX = float(np.finfo(np.float32).max)


def state(scale, incr=0, decr=0, **policy):
    return rule.LossScaleState(scale, incr, decr, rule.Policy(**policy))


# (state before, found, (scale, incr_count, decr_count) after), worked by hand.
WORKED = {
    "a finite step counts": (state(8.0, incr_every_n_steps=3), False, (8.0, 1, 0)),
    "the third finite step grows": (state(8.0, 2, incr_every_n_steps=3), False, (16.0, 0, 0)),
    "an overflow backs off": (state(8.0, 2), True, (4.0, 0, 0)),
    "an overflow counts toward a period of 2": (
        state(8.0, decr_every_n_nan_or_inf=2),
        True,
        (8.0, 0, 1),
    ),
    "the second overflow backs off": (
        state(8.0, 0, 1, decr_every_n_nan_or_inf=2),
        True,
        (4.0, 0, 0),
    ),
    "a finite step ends an overflow streak": (
        state(8.0, 0, 1, decr_every_n_nan_or_inf=2),
        False,
        (8.0, 1, 0),
    ),
    "the floor is 1": (state(1.5), True, (1.0, 0, 0)),
    "a lower floor": (state(1.5, min_scale=0.25), True, (0.75, 0, 0)),
    "a higher floor": (state(6.0, min_scale=4.0), True, (4.0, 0, 0)),
    "a ceiling": (state(6.0, incr_every_n_steps=1, max_scale=10.0), False, (10.0, 0, 0)),
    "no growth past float32": (state(2.0**127, incr_every_n_steps=1), False, (2.0**127, 0, 0)),
    "float32 products": (
        state(3.0, decr_ratio=0.1, min_scale=0.125),
        True,
        (float(np.float32(3.0) * np.float32(0.1)), 0, 0),
    ),
    "a float32 state holds a float32 scale": (state(0.1), False, (float(np.float32(0.1)), 1, 0)),
}


@pytest.mark.parametrize("name", sorted(WORKED))
def test_adjust_gives_the_worked_examples(name):
    before, found, after = WORKED[name]
    adjusted = rule.adjust(before, found)
    assert (adjusted.scale, adjusted.incr_count, adjusted.decr_count) == after
    assert adjusted.policy == before.policy


def test_adjust_in_python_floats_is_mindspores_host_arithmetic():
    # MindSpore's manager multiplies its Python float by 1 / scale_factor.
    policy = rule.Policy(incr_ratio=3.0, decr_ratio=1 / 3, incr_every_n_steps=2)
    host = rule.LossScaleState(10.0, policy=policy, float32=False)
    assert rule.adjust(host, True).scale == max(10.0 * (1 / 3), 1) == 3.333333333333333
    assert rule.adjust(rule.LossScaleState(10.0, policy=policy), True).scale == float(
        np.float32(10.0) * np.float32(1 / 3)
    )


POLICIES = st.builds(
    rule.Policy,
    incr_ratio=st.sampled_from([2.0, 3.0, 1.5]),
    decr_ratio=st.sampled_from([0.5, 0.25, 0.8]),
    incr_every_n_steps=st.integers(1, 4),
    decr_every_n_nan_or_inf=st.integers(1, 3),
    min_scale=st.sampled_from([1.0, 0.125, 2.0]),
    max_scale=st.sampled_from([None, 2.0**20, F32_MAX]),
)


@pytest.mark.parametrize("path", kernels.unscale_paths())
@settings(max_examples=40, deadline=None)
@given(
    policy=POLICIES,
    start=st.sampled_from([2.0, 1024.0, 2.0**100]),
    founds=st.lists(st.booleans(), min_size=100, max_size=300),
)
def test_the_device_forms_follow_adjust_on_long_sequences(path, policy, start, founds):
    start = min(max(start, policy.min_scale), policy.max_scale or F32_MAX)
    expected = rule.LossScaleState(start, policy=policy)
    scale = paddle.to_tensor([start], dtype="float32")
    incr = paddle.to_tensor([0], dtype="int32")
    decr = paddle.to_tensor([0], dtype="int32")
    with kernels.using_unscale_path(path):
        for step, found in enumerate(founds):
            flag = paddle.to_tensor([found])
            rule.adjust_on_device_(flag, scale, incr, decr, policy)
            expected = rule.adjust(expected, found)
            got = (float(scale.numpy()[0]), int(incr.numpy()[0]), int(decr.numpy()[0]))
            want = (expected.scale, expected.incr_count, expected.decr_count)
            assert got == want, f"step {step}: {got} != {want} ({path}, {policy})"
