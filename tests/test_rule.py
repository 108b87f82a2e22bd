"""The update rule's specification, ``rule.adjust``, against worked examples; and its two
device forms (Paddle's update_loss_scaling kernel, the compiled CPU module) against it on
long random sequences."""

import dataclasses
import subprocess
import sys

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler.core import rule, unscale_paths
from paddle_amp_scaler.core.scale_tensors import ScaleTensors

F32_MAX = float(np.finfo(np.float32).max)


def state(scale, incr=0, decr=0, **policy):
    return rule.LossScaleState(scale, incr, decr, rule.Policy(**policy))


# (state before, found, (scale, incr_count, decr_count, fired) after), worked by hand.
WORKED = {
    "a finite step counts": (state(8.0, incr_every_n_steps=3), False, (8.0, 1, 0, False)),
    "the third finite step grows": (
        state(8.0, 2, incr_every_n_steps=3),
        False,
        (16.0, 0, 0, True),
    ),
    "an overflow backs off": (state(8.0, 2), True, (4.0, 0, 0, True)),
    "an overflow counts toward a period of 2": (
        state(8.0, decr_every_n_nan_or_inf=2),
        True,
        (8.0, 0, 1, False),
    ),
    "the second overflow backs off": (
        state(8.0, 0, 1, decr_every_n_nan_or_inf=2),
        True,
        (4.0, 0, 0, True),
    ),
    "a finite step ends an overflow streak": (
        state(8.0, 0, 1, decr_every_n_nan_or_inf=2),
        False,
        (8.0, 1, 0, False),
    ),
    "the floor is 1": (state(1.5), True, (1.0, 0, 0, True)),
    "a back-off held at the floor still fires": (state(1.0), True, (1.0, 0, 0, True)),
    "a lower floor": (state(1.5, min_scale=0.25), True, (0.75, 0, 0, True)),
    "a higher floor": (state(6.0, min_scale=4.0), True, (4.0, 0, 0, True)),
    "a ceiling": (state(6.0, incr_every_n_steps=1, max_scale=10.0), False, (10.0, 0, 0, True)),
    "no growth past float32, but the rule fired": (
        state(2.0**127, incr_every_n_steps=1),
        False,
        (2.0**127, 0, 0, True),
    ),
    "float32 products": (
        state(3.0, decr_ratio=0.1, min_scale=0.125),
        True,
        (float(np.float32(3.0) * np.float32(0.1)), 0, 0, True),
    ),
    "a float32 state holds a float32 scale": (
        state(0.1),
        False,
        (float(np.float32(0.1)), 1, 0, False),
    ),
    # MindSpore's amp.DynamicLossScaler: float32(100) / float32(3), not 100 * float32(1/3).
    "a back-off that divides": (
        state(100.0, backoff_divisor=3.0, decr_ratio=1 / 3),
        True,
        (float(np.float32(100.0) / np.float32(3.0)), 0, 0, True),
    ),
}


@pytest.mark.parametrize("name", sorted(WORKED))
def test_adjust_gives_the_worked_examples(name):
    before, found, after = WORKED[name]
    adjusted = rule.adjust(before, found)
    assert (adjusted.scale, adjusted.incr_count, adjusted.decr_count, adjusted.fired) == after
    assert adjusted.policy == before.policy


def test_the_division_and_the_reciprocal_differ_where_mindspore_says():
    # The fidelity gap MindSpore's divide closes: 33.333332 against 33.333336.
    divided = rule.adjust(state(100.0, backoff_divisor=3.0, decr_ratio=1 / 3), True).scale
    multiplied = rule.adjust(state(100.0, decr_ratio=1 / 3), True).scale
    assert f"{divided:.6f}" == "33.333332"
    assert f"{multiplied:.6f}" == "33.333336"


def test_the_rule_needs_no_paddle():
    # The specification stands alone: importable where Paddle is not.
    script = (
        "import sys, importlib.util\n"
        "sys.modules['paddle'] = None\n"
        f"spec = importlib.util.spec_from_file_location('rule', {rule.__file__!r})\n"
        "module = sys.modules['rule'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(module.adjust(module.LossScaleState(8.0), True).scale)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4.0"


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
    backoff_divisor=st.sampled_from([None, 3.0, 5.0, 10.0]),
)


@pytest.mark.parametrize("path", unscale_paths.unscale_paths())
@settings(max_examples=40, deadline=None)
@given(
    policy=POLICIES,
    start=st.sampled_from([2.0, 1024.0, 2.0**100]),
    founds=st.lists(st.booleans(), min_size=100, max_size=300),
)
def test_the_device_forms_follow_adjust_on_long_sequences(path, policy, start, founds):
    start = min(max(start, policy.min_scale), policy.max_scale or F32_MAX)
    expected = rule.LossScaleState(start, policy=policy)
    tensors = ScaleTensors(start, "cpu")
    device_form = unscale_paths.by_name(path)
    for step, found in enumerate(founds):
        fired = device_form.adjust_(paddle.to_tensor([found]), tensors, policy)
        expected = rule.adjust(expected, found)
        on_device = tensors.read(policy)
        got = (on_device.scale, on_device.incr_count, on_device.decr_count, bool(fired.numpy()[0]))
        want = (expected.scale, expected.incr_count, expected.decr_count, expected.fired)
        assert got == want, f"step {step}: {got} != {want} ({path}, {policy})"


# -- the headroom policy ---------------------------------------------------------------------


def headroom(scale, **policy):
    return rule.LossScaleState(scale, policy=rule.Policy(name="headroom", **policy))


def test_headroom_calibrates_the_start_in_a_few_iterations():
    # From 2**16, gradients that overflow at every scale above 2**4: the first overflow
    # backs off eight steps at once, and the first finite measurement grows up to the
    # margin below float16's ceiling.
    state = headroom(2.0**16)
    state = rule.adjust_headroom(state, True, float("inf"))
    assert state.scale == 2.0**8 and state.fired
    state = rule.adjust_headroom(state, True, float("inf"))
    assert state.scale == 1.0
    # Finite: amax 0.5 at scale 1; the margin (2 bits) allows 65504 / 4 = 16376.
    state = rule.adjust_headroom(state, False, 0.5)
    assert state.scale == 2.0**14 and state.fired and state.grown_at == 3
    assert state.amax == 0.5 and state.anchor == state.scale


def test_headroom_never_grows_into_an_overflow_the_amax_predicts():
    state = headroom(2.0**10)
    for amax in (2.0**-3, 2.0**10, 16376.0, 16377.0, 40000.0):
        after = rule.adjust_headroom(state, False, amax)
        grew = after.scale > state.scale
        assert grew == (amax * 2 <= 16376.0)
        if grew:  # the amax the grown scale will see stays under the margin's limit
            assert amax * after.scale / state.scale <= rule.FLOAT16_MAX / 2**state.margin


def test_an_overflow_soon_after_a_growth_widens_the_margin_once():
    state = rule.adjust_headroom(headroom(2.0**10, incr_every_n_steps=100), False, 1.0)
    assert state.grown_at == 1 and state.margin == rule.INITIAL_MARGIN
    state = rule.adjust_headroom(state, True, float("inf"))
    # Backed off now; this look sees it within 100 // 4 iterations of the growth.
    assert state.margin == rule.INITIAL_MARGIN + 1 and state.margin_at == 2
    # A second overflow after the same growth is not charged to it again.
    state = rule.adjust_headroom(state, True, float("inf"))
    assert state.margin == rule.INITIAL_MARGIN + 1 and state.grown_at == rule.NEVER


def test_a_spike_long_after_the_last_growth_is_climbed_back_at_once():
    state = rule.adjust_headroom(headroom(2.0**10, incr_every_n_steps=100), False, 1.0)
    top = state.scale
    for _ in range(30):  # 30 quiet iterations, past 100 // 4; no room for a doubling
        state = rule.adjust_headroom(state, False, 9000.0)
    assert state.scale == top
    state = rule.adjust_headroom(state, True, float("inf"))
    assert state.scale == top / 2 and state.margin == rule.INITIAL_MARGIN
    state = rule.adjust_headroom(state, False, 4500.0)  # the same gradients, at half scale
    assert state.scale == top


def test_the_margin_narrows_a_bit_once_it_stood_a_period_spikes_or_not():
    state = headroom(2.0**10, incr_every_n_steps=4)
    for _ in range(3):
        state = rule.adjust_headroom(state, False, 9000.0)
    assert state.margin == rule.INITIAL_MARGIN
    # A spike (no growth before it) does not restart the margin's stretch.
    state = rule.adjust_headroom(state, True, float("inf"))
    state = rule.adjust_headroom(state, False, 9000.0)
    assert state.margin == rule.INITIAL_MARGIN - 1 and state.margin_at == 5
    for _ in range(8):
        state = rule.adjust_headroom(state, False, 30000.0)
    assert state.margin == rule.MIN_MARGIN


def test_unmeasured_iterations_only_back_off():
    state = headroom(2.0**10)
    assert rule.adjust_headroom(state, False, None).scale == 2.0**10
    backed = rule.adjust_headroom(state, True, None)
    assert backed.scale == 2.0**9 and backed.fired and backed.anchor == state.anchor


def test_the_schedule_measures_the_first_iterations_and_then_every_few():
    assert [n for n in range(1, 200) if rule.measured(n, 64)] == [1, 2, 3, 64, 128, 192]
    assert all(rule.measured(n, 1) for n in range(1, 50))


def amaxes():
    """What an unscale hands the rule: tiny to large magnitudes, zero, and inf."""
    return st.one_of(
        st.floats(-40, 20).map(lambda e: float(np.float32(2.0**e))),
        st.sampled_from([0.0, float("inf"), 16376.0, 8188.0, 65504.0]),
    )


HEADROOM_POLICIES = st.builds(
    rule.Policy,
    incr_ratio=st.sampled_from([2.0, 4.0, 1.5]),
    decr_ratio=st.sampled_from([0.5, 0.25, 0.8]),
    incr_every_n_steps=st.sampled_from([4, 8, 40]),
    decr_every_n_nan_or_inf=st.integers(1, 2),
    min_scale=st.sampled_from([1.0, 0.125, 2.0]),
    max_scale=st.sampled_from([None, 2.0**40]),
    name=st.just("headroom"),
)


@pytest.mark.parametrize("path", unscale_paths.unscale_paths())
@settings(max_examples=30, deadline=None)
@given(
    policy=HEADROOM_POLICIES,
    start=st.sampled_from([2.0, 2.0**16, 2.0**100]),
    steps=st.lists(st.tuples(st.booleans(), amaxes()), min_size=100, max_size=250),
)
def test_the_device_forms_follow_adjust_headroom_on_long_sequences(path, policy, start, steps):
    start = min(max(start, policy.min_scale), policy.max_scale or F32_MAX)
    expected = rule.LossScaleState(start, policy=policy)
    tensors = ScaleTensors(start, "cpu")
    device_form = unscale_paths.by_name(path)
    for iteration, (found, amax) in enumerate(steps, start=1):
        measured = rule.measured(iteration, device_form.measure_every)
        given_amax = amax if measured else None
        fired = device_form.adjust_(
            paddle.to_tensor([found]),
            tensors,
            policy,
            amax=None if given_amax is None else paddle.to_tensor([given_amax], dtype="float32"),
            iteration=iteration,
        )
        expected = rule.adjust_headroom(expected, found, given_amax)
        got = dataclasses.replace(tensors.read(policy, iteration), fired=bool(fired.numpy()[0]))
        assert got == expected, f"iteration {iteration} ({path}, {policy})"
