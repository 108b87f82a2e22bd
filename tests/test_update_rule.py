"""The scale and counters follow API.md's update rule, step by step, on real training steps."""

import math

import numpy as np
import paddle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import AmpScaler, GradScaler

from helpers import GradInjector, batches, make_model, train_step
from reference_rule import ReferenceScaler

INJECTED = {"finite": None, "inf": math.inf, "nan": math.nan}


def train(scaler, schedule, api, loss_factor=1.0):
    """One training step per schedule entry; yields the scaler's (scale, incr, decr)."""
    model = make_model(depth=1)
    optimizer = paddle.optimizer.Momentum(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model[-1].weight)
    data = batches(steps=4)
    for step, kind in enumerate(schedule):
        train_step(
            scaler,
            model,
            optimizer,
            data[step % len(data)],
            api,
            injector,
            INJECTED[kind],
            loss_factor,
        )
        yield scaler.get_loss_scaling(), scaler.get_incr_count(), scaler.get_decr_count()


def assert_follows_reference(scaler, reference, schedule, api, loss_factor=1.0):
    observed = list(train(scaler, schedule, api, loss_factor))
    expected = []
    for kind in schedule:
        reference.update(kind != "finite")
        expected.append(reference.snapshot())
    for step, (got, want) in enumerate(zip(observed, expected)):
        assert got == want, f"step {step} ({schedule[step]}): got {got}, expected {want}"


SCRIPTS = {
    "grow twice": ["finite"] * 7,
    "streak broken by inf": ["finite", "finite", "inf", "finite", "finite", "finite"],
    "back off every second": ["inf", "nan", "inf", "finite", "inf", "inf", "nan"],
    "alternating": ["finite", "inf"] * 5,
    "mixed": [
        "finite",
        "finite",
        "finite",
        "nan",
        "finite",
        "inf",
        "inf",
        "finite",
        "finite",
        "finite",
        "finite",
        "nan",
        "nan",
    ],
}


@pytest.mark.parametrize("api", ["step_update", "minimize"])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_scripted_schedules_follow_the_rule(api, script):
    config = dict(
        init_loss_scaling=2.0**10,
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=3,
        decr_every_n_nan_or_inf=2,
    )
    scaler = GradScaler(**config)
    reference = ReferenceScaler(
        scale=config["init_loss_scaling"],
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=3,
        decr_every_n_nan_or_inf=2,
    )
    assert_follows_reference(scaler, reference, SCRIPTS[script], api)


def test_non_power_of_two_ratios_round_like_float32():
    scaler = GradScaler(
        init_loss_scaling=1000.0,
        incr_ratio=1.7,
        decr_ratio=0.3,
        incr_every_n_steps=2,
        decr_every_n_nan_or_inf=1,
    )
    reference = ReferenceScaler(
        scale=1000.0,
        incr_ratio=1.7,
        decr_ratio=0.3,
        incr_every_n_steps=2,
        decr_every_n_nan_or_inf=1,
    )
    assert_follows_reference(
        scaler, reference, ["finite"] * 4 + ["inf", "finite", "finite"], "step_update"
    )


def test_scale_never_falls_below_one():
    scaler = GradScaler(init_loss_scaling=4.0, decr_ratio=0.25)
    reference = ReferenceScaler(scale=4.0, decr_ratio=0.25, incr_every_n_steps=2000)
    assert_follows_reference(scaler, reference, ["inf"] * 4, "step_update")
    assert scaler.get_loss_scaling() == 1.0


def test_growth_that_would_overflow_float32_leaves_scale_unchanged():
    top = float(np.float32(2.0**127))
    scaler = AmpScaler(init_loss_scaling=top, incr_every_n_steps=1)
    reference = ReferenceScaler(scale=top, incr_every_n_steps=1)
    # Zero loss: finite (zero) grads whatever the scale.
    assert_follows_reference(scaler, reference, ["finite"] * 3, "minimize", loss_factor=0.0)
    assert scaler.get_loss_scaling() == top


@pytest.mark.parametrize("api", ["step_update", "minimize"])
def test_fixed_mode_never_changes_the_scale_but_still_skips(api):
    scaler = GradScaler(
        init_loss_scaling=256.0, use_dynamic_loss_scaling=False, incr_every_n_steps=1
    )
    observed = list(train(scaler, ["finite", "inf", "finite", "nan"], api))
    assert [scale for scale, _, _ in observed] == [256.0] * 4


def follows_the_rule_on(
    schedule, incr_every_n_steps, decr_every_n_nan_or_inf, incr_ratio, decr_ratio, api
):
    config = dict(
        init_loss_scaling=64.0,
        incr_ratio=incr_ratio,
        decr_ratio=decr_ratio,
        incr_every_n_steps=incr_every_n_steps,
        decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
    )
    reference = ReferenceScaler(
        scale=64.0,
        incr_ratio=incr_ratio,
        decr_ratio=decr_ratio,
        incr_every_n_steps=incr_every_n_steps,
        decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
    )
    assert_follows_reference(GradScaler(**config), reference, schedule, api)


def random_runs(max_steps, ratios):
    return given(
        schedule=st.lists(
            st.sampled_from(["finite", "inf", "nan"]), min_size=1, max_size=max_steps
        ),
        incr_every_n_steps=st.integers(1, 5),
        decr_every_n_nan_or_inf=st.integers(1, 3),
        incr_ratio=ratios(1.0, 4.0).filter(lambda r: r > 1.0),
        decr_ratio=ratios(0.0, 1.0).filter(lambda r: 0.0 < r < 1.0),
        api=st.sampled_from(["step_update", "minimize"]),
    )


_QUIET = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_random_schedules_follow_the_rule = settings(max_examples=15, **_QUIET)(
    random_runs(16, lambda low, high: st.sampled_from([0.25, 0.5, 0.8, 1.5, 2.0, 3.0]))(
        follows_the_rule_on
    )
)
test_random_schedules_follow_the_rule_long = pytest.mark.long(
    settings(max_examples=400, **_QUIET)(
        random_runs(60, lambda low, high: st.floats(low, high))(follows_the_rule_on)
    )
)


def test_shortening_a_period_below_the_streak_grows_at_the_next_finite_step():
    scaler = GradScaler(init_loss_scaling=8.0, incr_every_n_steps=10)
    for _ in train(scaler, ["finite"] * 5, "step_update"):
        pass
    assert scaler.get_incr_count() == 5
    scaler.set_incr_every_n_steps(3)
    assert scaler.get_incr_count() == 2
    observed = list(train(scaler, ["finite"], "step_update"))
    assert observed == [(16.0, 0, 0)]


def test_shortening_the_back_off_period_clamps_the_inf_streak():
    scaler = GradScaler(init_loss_scaling=8.0, decr_every_n_nan_or_inf=5)
    for _ in train(scaler, ["inf"] * 3, "step_update"):
        pass
    scaler.set_decr_every_n_nan_or_inf(2)
    assert scaler.get_decr_count() == 1
    assert list(train(scaler, ["inf"], "step_update")) == [(4.0, 0, 0)]
