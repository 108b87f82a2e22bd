"""Paddle's own GradScaler (enabled on CPU) as an oracle: over the same run, scale,
counters and parameters agree step by step wherever API.md says they should."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import GradScaler

from helpers import (
    GradInjector,
    batches,
    make_model,
    oracle_skipped,
    paddle_oracle,
    params_of,
    train_step,
)
from test_training_equivalence import OPTIMIZERS

INJECTED = {"finite": None, "inf": math.inf, "nan": math.nan}


def run_side_by_side(monkeypatch, schedule, optimizer_name, api, **config):
    ours, theirs = GradScaler(**config), paddle_oracle(monkeypatch, **config)
    sides = []
    for scaler in (ours, theirs):
        model = make_model()
        optimizer = OPTIMIZERS[optimizer_name](model.parameters())
        sides.append((scaler, model, optimizer, GradInjector(model[0].weight)))
    data = batches(steps=len(schedule))
    for step, kind in enumerate(schedule):
        for scaler, model, optimizer, injector in sides:
            train_step(scaler, model, optimizer, data[step], api, injector, INJECTED[kind])
        (_, our_model, _, _), (_, their_model, _, _) = sides
        context = f"step {step} ({kind})"
        assert ours.get_loss_scaling() == float(theirs._scale.numpy()[0]), context
        assert ours.get_incr_count() == theirs._incr_count, context
        assert ours.get_decr_count() == theirs._decr_count, context
        assert bool(ours._cache_found_inf) == oracle_skipped(theirs), context
        for a, b in zip(params_of(our_model), params_of(their_model)):
            np.testing.assert_array_equal(a, b, err_msg=context)
    return ours, theirs


SCHEDULE = [
    "finite",
    "finite",
    "inf",
    "finite",
    "finite",
    "finite",
    "nan",
    "nan",
    "finite",
    "finite",
    "finite",
    "finite",
    "inf",
]


@pytest.mark.parametrize("api", ["step_update", "minimize"])
@pytest.mark.parametrize("name", ["sgd", "momentum", "adamw"])
def test_agrees_with_paddle_step_by_step(monkeypatch, name, api):
    run_side_by_side(
        monkeypatch,
        SCHEDULE,
        name,
        api,
        init_loss_scaling=2.0**10,
        incr_every_n_steps=3,
        decr_every_n_nan_or_inf=2,
    )


def test_state_dicts_agree_after_the_run(monkeypatch):
    ours, theirs = run_side_by_side(
        monkeypatch,
        SCHEDULE,
        "adam",
        "step_update",
        init_loss_scaling=2.0**10,
        incr_every_n_steps=3,
        decr_every_n_nan_or_inf=2,
    )
    our_state, their_state = ours.state_dict(), theirs.state_dict()
    # Ours carries its bounds and statistics too (API.md); every key of Paddle's is there
    # and equal.
    assert our_state.keys() - their_state.keys() == {
        "min_loss_scaling",
        "max_loss_scaling",
        "stats",
        "policy",
    }
    for key in their_state:
        np.testing.assert_array_equal(our_state[key], their_state[key], err_msg=key)
        assert type(our_state[key]) is type(their_state[key]), key


def agrees_on(monkeypatch, schedule, incr_every_n_steps, decr_every_n_nan_or_inf):
    # Paddle's scaler has no floor at 1.0: start high enough never to reach it.
    run_side_by_side(
        monkeypatch,
        schedule,
        "momentum",
        "step_update",
        init_loss_scaling=2.0**30,
        incr_every_n_steps=incr_every_n_steps,
        decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
    )


def random_schedules(max_steps):
    return given(
        schedule=st.lists(st.sampled_from(sorted(INJECTED)), min_size=1, max_size=max_steps),
        incr_every_n_steps=st.integers(1, 3),
        decr_every_n_nan_or_inf=st.integers(1, 3),
    )


_QUIET = dict(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
test_random_schedules_agree_with_paddle = settings(max_examples=8, **_QUIET)(
    random_schedules(12)(agrees_on)
)
test_random_schedules_agree_with_paddle_long = pytest.mark.long(
    settings(max_examples=150, **_QUIET)(random_schedules(28)(agrees_on))
)
