"""The update rule's specification, ``rule.adjust``, against worked examples; and its two
device forms (Paddle's update_loss_scaling kernel, the compiled CPU module) against it on
long random sequences."""

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
