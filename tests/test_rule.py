"""The rules' specifications, ``IntervalRule.adjust`` and ``HeadroomRule.adjust``, against
worked examples; each rule's device form against its pure form on long random sequences;
and ``LossScale``, which keeps the counters on the host while the verdicts arrive there,
against both."""

import dataclasses
import math

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler.core.loss_scale import LossScale
from paddle_amp_scaler.core.rules import HeadroomMemory, HeadroomRule, IntervalRule, Memory
from paddle_amp_scaler.core.step import Verdict
from paddle_amp_scaler.core.validation import FLOAT16_MAX, FLOAT32_MAX

from reference_rule import headroom_adjust, reference_adjust

FLOAT32_TINY = float(np.finfo(np.float32).tiny)
# A few float32 ulps: a quotient an ulp off, carried through the rule's products.
ROUNDING = 2.0**-20


def at(scale, incr=0, decr=0):
    return Memory(np.float32(scale), incr, decr)


# (rule, memory before, found, (scale, incr_count, decr_count, acted) after), worked by hand.
WORKED = {
    "a finite step counts": (
        IntervalRule(incr_every_n_steps=3),
        at(8.0),
        False,
        (8.0, 1, 0, False),
    ),
    "the third finite step grows": (
        IntervalRule(incr_every_n_steps=3),
        at(8.0, 2),
        False,
        (16.0, 0, 0, True),
    ),
    "an overflow backs off": (IntervalRule(), at(8.0, 2), True, (4.0, 0, 0, True)),
    "an overflow counts toward a period of 2": (
        IntervalRule(decr_every_n_nan_or_inf=2),
        at(8.0),
        True,
        (8.0, 0, 1, False),
    ),
    "the second overflow backs off": (
        IntervalRule(decr_every_n_nan_or_inf=2),
        at(8.0, 0, 1),
        True,
        (4.0, 0, 0, True),
    ),
    "a finite step ends an overflow streak": (
        IntervalRule(decr_every_n_nan_or_inf=2),
        at(8.0, 0, 1),
        False,
        (8.0, 1, 0, False),
    ),
    "the floor is 1": (IntervalRule(), at(1.5), True, (1.0, 0, 0, True)),
    "a back-off held at the floor still acts": (IntervalRule(), at(1.0), True, (1.0, 0, 0, True)),
    "a lower floor": (IntervalRule(min_scale=0.25), at(1.5), True, (0.75, 0, 0, True)),
    "a higher floor": (IntervalRule(min_scale=4.0), at(6.0), True, (4.0, 0, 0, True)),
    "a ceiling": (
        IntervalRule(incr_every_n_steps=1, max_scale=10.0),
        at(6.0),
        False,
        (10.0, 0, 0, True),
    ),
    "no growth past float32, but the rule acted": (
        IntervalRule(incr_every_n_steps=1),
        at(2.0**127),
        False,
        (2.0**127, 0, 0, True),
    ),
    "float32 products": (
        IntervalRule(decr_ratio=0.1, min_scale=0.125),
        at(3.0),
        True,
        (float(np.float32(3.0) * np.float32(0.1)), 0, 0, True),
    ),
    "a float32 memory holds a float32 scale": (
        IntervalRule(),
        at(0.1),
        False,
        (float(np.float32(0.1)), 1, 0, False),
    ),
    # MindSpore's amp.DynamicLossScaler: float32(100) / float32(3), not 100 * float32(1/3).
    "a back-off that divides": (
        IntervalRule(backoff_divisor=3.0, decr_ratio=1 / 3),
        at(100.0),
        True,
        (float(np.float32(100.0) / np.float32(3.0)), 0, 0, True),
    ),
}


@pytest.mark.parametrize("name", sorted(WORKED))
def test_adjust_gives_the_worked_examples(name):
    rule, before, found, after = WORKED[name]
    adjusted, acted = rule.adjust(before, found)
    assert (adjusted.scale, adjusted.incr_count, adjusted.decr_count, acted) == after
    assert isinstance(adjusted.scale, np.float32)


@pytest.mark.parametrize("name", sorted(WORKED))
def test_count_says_when_adjust_acts_and_moves_the_counters_alike(name):
    rule, before, found, _ = WORKED[name]
    adjusted, acted = rule.adjust(before, found)
    assert rule.count(before.incr_count, before.decr_count, found) == (
        adjusted.incr_count,
        adjusted.decr_count,
        acted,
    )


def test_the_division_and_the_reciprocal_differ_where_mindspore_says():
    # The fidelity gap MindSpore's divide closes: 33.333332 against 33.333336.
    divided, _ = IntervalRule(backoff_divisor=3.0, decr_ratio=1 / 3).adjust(at(100.0), True)
    multiplied, _ = IntervalRule(decr_ratio=1 / 3).adjust(at(100.0), True)
    assert f"{divided.scale:.6f}" == "33.333332"
    assert f"{multiplied.scale:.6f}" == "33.333336"


def test_a_python_float_keeps_mindspores_host_arithmetic():
    # MindSpore's manager multiplies its Python float by 1 / scale_factor.
    rule = IntervalRule(incr_ratio=3.0, decr_ratio=1 / 3, incr_every_n_steps=2)
    host, _ = rule.adjust(Memory(10.0), True)
    assert host.scale == max(10.0 * (1 / 3), 1) == 3.333333333333333
    assert type(host.scale) is float
    device, _ = rule.adjust(at(10.0), True)
    assert device.scale == np.float32(10.0) * np.float32(1 / 3)


def _tensors(memory):
    return dataclasses.replace(
        memory,
        **{
            field.name: paddle.to_tensor(
                [getattr(memory, field.name)],
                dtype="float32" if field.name in memory.FLOATS else "int32",
            )
            for field in dataclasses.fields(memory)
        },
    )


def read(tensors):
    values = {
        field.name: getattr(tensors, field.name).numpy()[0] for field in dataclasses.fields(tensors)
    }
    return type(tensors)(
        **{
            name: np.float32(value) if name in tensors.FLOATS else int(value)
            for name, value in values.items()
        }
    )


def same(got, expected):
    """The device's memory against the reference's: each counter exactly, each float to
    within rounding. Paddle's CPU kernels do not always divide to the correctly rounded
    float NumPy gives: on some processors (AVX-512) a quotient is an ulp off, and below
    float32's smallest normal number (a peak at a scale near float32's largest) a kernel
    may flush to zero. Any choice the rule makes still shows whole: a scale a growth or a
    backoff away, a counter."""
    for field in dataclasses.fields(expected):
        held, wanted = getattr(got, field.name), getattr(expected, field.name)
        if field.name not in expected.FLOATS:
            if held != wanted:
                return False
        elif held != wanted and not np.isclose(held, wanted, rtol=ROUNDING, atol=FLOAT32_TINY):
            return False
    return True


RULES = st.builds(
    IntervalRule,
    incr_ratio=st.sampled_from([2.0, 3.0, 1.5]),
    decr_ratio=st.sampled_from([0.5, 0.25, 0.8]),
    incr_every_n_steps=st.integers(1, 4),
    decr_every_n_nan_or_inf=st.integers(1, 3),
    min_scale=st.sampled_from([1.0, 0.125, 2.0]),
    max_scale=st.sampled_from([None, 2.0**20, FLOAT32_MAX]),
    backoff_divisor=st.sampled_from([None, 3.0, 5.0, 10.0]),
)


def within(start, rule):
    return min(max(start, rule.min_scale), rule.max_scale or FLOAT32_MAX)


@settings(max_examples=40, deadline=None)
@given(
    rule=RULES,
    start=st.sampled_from([2.0, 1024.0, 2.0**100]),
    founds=st.lists(st.booleans(), min_size=100, max_size=300),
)
def test_the_device_form_follows_adjust_on_long_sequences(rule, start, founds):
    expected = at(within(start, rule))
    tensors = _tensors(expected)
    for step, found in enumerate(founds):
        acted = rule.adjust_(tensors, paddle.to_tensor([found]))
        expected, expected_acted = rule.adjust(expected, found)
        assert same(read(tensors), expected), f"step {step}: {rule}"
        assert bool(acted.numpy()[0]) == expected_acted, f"step {step}: {rule}"


# -- the headroom policy ---------------------------------------------------------------------


def headroom_step(rule, memory, found, amax=None, iteration=0):
    """One iteration of ``rule``'s device form from ``memory`` (host numbers), read back,
    and whether it acted; held to the reference's at once, so that each worked example
    checks both."""
    tensors = _tensors(memory)
    acted = rule.adjust_(
        tensors,
        paddle.to_tensor([found]),
        None if amax is None else paddle.to_tensor([amax], dtype="float32"),
        iteration,
    )
    expected, expected_acted = headroom_adjust(rule, memory, found, amax, iteration)
    assert same(read(tensors), expected) and bool(acted.numpy()[0]) == expected_acted
    return expected, expected_acted


def test_headroom_calibrates_the_start_in_a_few_iterations():
    # From 2**16, gradients that overflow at every scale above 2**4: the first overflow
    # backs off eight steps at once, and the first finite measurement fits the scale to
    # the calibration's margin below float16's ceiling.
    rule = HeadroomRule()
    memory, acted = headroom_step(rule, HeadroomMemory(np.float32(2.0**16)), True, float("inf"), 1)
    assert memory.scale == 2.0**8 and acted
    memory, _ = headroom_step(rule, memory, True, float("inf"), 2)
    assert memory.scale == 1.0
    # Finite: amax 0.5 at scale 1; the calibration's margin (2 bits) allows 65504 / 4.
    memory, acted = headroom_step(rule, memory, False, 0.5, 3)
    assert memory.scale == 2.0**14 and acted and memory.grown_at == 3
    assert memory.amax == 0.5 and memory.peak == 0.5 and memory.anchor == memory.scale


def fitted(peak, limit, incr_ratio=2.0):
    """The largest scale incr_ratio**k (k an int) with peak * scale <= limit: the fit,
    worked out apart from the rule."""
    k = math.floor(math.log(limit / peak, incr_ratio))
    while peak * incr_ratio ** (k + 1) <= limit:
        k += 1
    while peak * incr_ratio**k > limit:
        k -= 1
    return incr_ratio**k


@pytest.mark.parametrize("amax", [2.0**-3, 1.0, 1000.0, 16376.0, 16377.0, 32752.0, 40000.0])
def test_a_measured_iteration_fits_the_scale_to_the_peak_either_way(amax):
    rule, memory = HeadroomRule(), HeadroomMemory(np.float32(2.0**10))
    after, acted = headroom_step(rule, memory, False, amax, 64)
    peak = amax / 2.0**10
    assert after.peak == np.float32(peak)
    assert after.scale == fitted(peak, FLOAT16_MAX / 2**rule.margin)
    # A fit downward meets growing gradients before they overflow: neither a growth nor
    # a back-off.
    assert acted == (after.scale > memory.scale)


def test_the_peak_forgets_a_bit_per_half_life():
    rule = HeadroomRule()
    memory, _ = headroom_step(rule, HeadroomMemory(np.float32(2.0**10)), False, 30000.0, 64)
    assert memory.scale == 2.0**10
    # The gradients shrink 16-fold at once: the peak, stale, comes down to 2**stale_bits
    # times them, and then forgets a bit per half-life; measured every 64 iterations,
    # the scale climbs one growth per half-life, not all the way at the next measurement.
    grown_at = {}
    for iteration in range(128, 64 * 40, 64):
        amax = 30000.0 / 16 * float(memory.scale) / 2.0**10
        memory, _ = headroom_step(rule, memory, False, amax, iteration)
        grown_at.setdefault(float(memory.scale), iteration)
    apart = [grown_at[2.0 ** (k + 1)] - grown_at[2.0**k] for k in (11, 12)]
    assert all(abs(gap - rule.peak_half_life) <= 64 for gap in apart), grown_at
    assert memory.scale == 2.0**14  # where the shrunk gradients fit: 30000 / 16 * 16 <= 32752


def test_a_peak_far_above_the_gradients_is_stale():
    rule = HeadroomRule()
    memory, _ = headroom_step(rule, HeadroomMemory(np.float32(2.0**10)), False, 30000.0, 64)
    # The gradients shrink 1024-fold: the peak comes down to 2**stale_bits times the
    # new amax at once, rather than forgetting one bit per half-life.
    memory, _ = headroom_step(rule, memory, False, 30000.0 / 1024, 128)
    latest = np.float32(30000.0 / 1024) / np.float32(2.0**10)
    assert memory.peak == latest * np.float32(2**rule.stale_bits)
    assert memory.scale == fitted(float(memory.peak), FLOAT16_MAX / 2**rule.margin)
    assert memory.scale == 2.0**17


def test_an_overflow_soon_after_a_growth_holds_the_scale_a_growth_below_it():
    rule = HeadroomRule(incr_every_n_steps=1000)
    memory, _ = headroom_step(rule, HeadroomMemory(np.float32(2.0**10)), False, 1.0, 64)
    top = memory.scale
    assert memory.grown_at == 64
    memory, _ = headroom_step(rule, memory, True, None, 100)  # within 1000 // 4 of the growth
    assert memory.scale == top / 2
    memory, _ = headroom_step(rule, memory, False, 0.5, 128)  # room to grow, but it overflowed
    assert memory.overflow_peak == FLOAT16_MAX * 2 / 2 / top and memory.scale == top / 2
    # What the overflow proved falls a growth per 1000 iterations; the gradients keep room.
    for iteration in range(192, 1300, 64):
        memory, _ = headroom_step(rule, memory, False, float(memory.scale) / 2**15, iteration)
        assert memory.scale == (top if iteration >= 128 + 1000 else top / 2), iteration


def test_a_spike_long_after_the_last_growth_is_climbed_back_at_once():
    rule = HeadroomRule(incr_every_n_steps=100)
    memory, _ = headroom_step(rule, HeadroomMemory(np.float32(2.0**10)), False, 1.0, 64)
    top = memory.scale
    memory, _ = headroom_step(rule, memory, False, 20000.0, 128)  # no room to grow
    assert memory.scale == top
    memory, _ = headroom_step(rule, memory, True, None, 180)  # long after the growth at 64
    assert memory.scale == top / 2
    memory, _ = headroom_step(
        rule, memory, False, 10000.0, 192
    )  # the same gradients, at half scale
    assert memory.scale == top and memory.overflow_peak == 0


def test_gradients_that_are_not_float16_hold_the_scale():
    # Finite beyond 65504: float32 gradients (amp_guard off, as on a CPU) or a sum over
    # several backward passes. The rule holds; headroom_bits says how far beyond.
    rule = HeadroomRule()
    memory, acted = headroom_step(rule, HeadroomMemory(np.float32(2.0**16)), False, 2.0**17, 1)
    assert memory.scale == 2.0**16 and not acted and memory.peak == 0
    assert memory.amax == 2.0**17 > FLOAT16_MAX  # what stats() would show as negative bits
    memory, _ = headroom_step(rule, memory, False, 2.0**10, 2)  # float16's again: it fits
    assert memory.scale == fitted(2.0**10 / 2.0**16, FLOAT16_MAX / 4)


def test_unmeasured_iterations_only_back_off():
    rule, memory = HeadroomRule(), HeadroomMemory(np.float32(2.0**10))
    assert headroom_step(rule, memory, False, None, 5)[0].scale == 2.0**10
    backed, acted = headroom_step(rule, memory, True, None, 5)
    assert backed.scale == 2.0**9 and acted and backed.anchor == memory.anchor


def test_the_rule_measures_the_first_iterations_and_then_every_few():
    assert [n for n in range(1, 200) if HeadroomRule().measures(n)] == [1, 2, 3, 64, 128, 192]
    assert not any(IntervalRule().measures(n) for n in range(1, 200))


def amaxes():
    """What an unscale hands the rule: tiny to large magnitudes, zero, inf, or nothing (an
    iteration not measured)."""
    return st.one_of(
        st.floats(-40, 20).map(lambda e: float(np.float32(2.0**e))),
        st.sampled_from([0.0, float("inf"), 16376.0, 8188.0, 65504.0, None]),
    )


HEADROOM_RULES = st.builds(
    HeadroomRule,
    incr_ratio=st.sampled_from([2.0, 4.0, 1.5]),
    decr_ratio=st.sampled_from([0.5, 0.25, 0.8]),
    incr_every_n_steps=st.sampled_from([4, 8, 40]),
    decr_every_n_nan_or_inf=st.integers(1, 2),
    min_scale=st.sampled_from([1.0, 0.125, 2.0]),
    max_scale=st.sampled_from([None, 2.0**40]),
)


@settings(max_examples=30, deadline=None)
@given(
    rule=HEADROOM_RULES,
    start=st.sampled_from([2.0, 2.0**16, 2.0**100]),
    steps=st.lists(st.tuples(st.booleans(), amaxes()), min_size=100, max_size=250),
)
def test_the_headroom_device_form_follows_adjust_on_long_sequences(rule, start, steps):
    expected = HeadroomMemory(np.float32(within(start, rule)))
    tensors = _tensors(expected)
    for iteration, (found, amax) in enumerate(steps, start=1):
        acted = rule.adjust_(
            tensors,
            paddle.to_tensor([found]),
            None if amax is None else paddle.to_tensor([amax], dtype="float32"),
            iteration,
        )
        expected, expected_acted = reference_adjust(rule, expected, found, amax, iteration)
        assert same(read(tensors), expected), f"iteration {iteration}: {rule}"
        assert bool(acted.numpy()[0]) == expected_acted, f"iteration {iteration}: {rule}"


# -- LossScale: counters on the host while the verdicts are there --------------------------


@settings(max_examples=30, deadline=None)
@given(
    rule=st.one_of(RULES, HEADROOM_RULES),
    steps=st.lists(
        st.tuples(st.booleans(), st.booleans(), amaxes(), st.sampled_from([None, True, False])),
        min_size=50,
        max_size=200,
    ),
    read_every=st.integers(3, 60),
)
def test_loss_scale_follows_adjust_whether_verdicts_come_on_the_host_or_the_device(
    rule, steps, read_every
):
    # Verdicts come as host bools or as tensors in any order, reads come between them:
    # the counters the host keeps and the device's must never part. Each iteration's loss
    # was finite, not, or not seen (None).
    start = within(2.0**16, rule)
    loss_scale = LossScale(rule, start, "cpu")
    expected = rule.memory_type(np.float32(start))
    for iteration, (found, on_host, amax, loss) in enumerate(steps, start=1):
        amax = amax if rule.measures(iteration) else None
        measured = None if amax is None else paddle.to_tensor([amax], dtype="float32")
        loss_finite = None if loss is None else paddle.to_tensor(loss)
        flag = paddle.to_tensor([found])
        verdict = Verdict(flag, found if on_host else None, measured, loss_finite)
        acted = loss_scale.update(verdict, iteration)
        expected, expected_acted = reference_adjust(
            rule, expected, found, amax, iteration, loss_finite=loss is not False
        )
        acted = acted if isinstance(acted, bool) else bool(acted.numpy()[0])
        assert acted == expected_acted, f"iteration {iteration}"
        if iteration % read_every == 0:
            assert same(loss_scale.read()[0], expected), f"iteration {iteration}"
        # The scale tensor is current at every iteration, read or not.
        assert np.isclose(loss_scale.scale.numpy()[0], expected.scale, rtol=ROUNDING)
    # A verdict known on the device only brings the device's counters up to date first.
    iteration = len(steps) + 1
    loss_scale.update(Verdict(paddle.to_tensor([False])), iteration)
    expected, _ = reference_adjust(rule, expected, False, None, iteration)
    assert same(read(loss_scale.memory), expected)


def test_verdicts_on_the_host_cost_no_device_operation_until_the_rule_acts():
    from counters import OperationCounter

    loss_scale = LossScale(IntervalRule(incr_every_n_steps=5), 1024.0, "cpu")
    quiet, acting = OperationCounter(), OperationCounter()
    finite = Verdict(paddle.to_tensor([False]), False)
    with quiet.counting():
        for iteration in range(1, 5):
            assert loss_scale.update(finite, iteration) is False
    with acting.counting():
        assert loss_scale.update(finite, 5) is True
    assert quiet.total() == 0, quiet.operations
    assert acting.total() > 0 and loss_scale.scale.numpy()[0] == 2048.0
