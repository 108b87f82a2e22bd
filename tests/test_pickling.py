"""Pickling and deep-copying every scaler and face on every Paddle (Paddle 2.6's tensors do
not pickle): between iterations the copy continues the run exactly; mid-iteration it is
refused, as PyTorch refuses it."""

import copy
import math
import pickle

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler
from paddle_amp_scaler.compat import mindspore, torch

from helpers import GradInjector, batches, loss_of, make_model, params_of

# Iterations at which one gradient holds inf: a back-off, a streak of two, then growth.
POISONED = {2: math.inf, 5: math.nan, 6: math.inf}
STEPS = 12


def make_scaler(kind):
    options = {"report_overflows": True, "stuck_after": 50, "max_loss_scaling": 2.0**20}
    return {
        "AmpScaler": lambda: AmpScaler(init_loss_scaling=2.0**10, incr_every_n_steps=3, **options),
        "GradScaler": lambda: GradScaler(
            init_loss_scaling=2.0**10, incr_every_n_steps=3, **options
        ),
        "fixed": lambda: GradScaler(init_loss_scaling=2.0**10, use_dynamic_loss_scaling=False),
        "torch": lambda: torch.GradScaler(init_scale=2.0**10, growth_interval=3, **options),
        "mindspore cell": lambda: mindspore.DynamicLossScaleManager(
            init_loss_scale=2.0**10, scale_window=3
        ).get_update_cell(),
        "disabled": lambda: GradScaler(enable=False),
        "headroom": lambda: GradScaler(
            init_loss_scaling=2.0**10, incr_every_n_steps=3, policy="headroom", **options
        ),
    }[kind]()


def train(scaler, copy_between_iterations=None):
    """STEPS iterations of a small model; after each one's update the scaler is replaced
    by ``copy_between_iterations(scaler)`` when given. Returns the parameters, the
    Adam state and the scaler's own account of the run."""
    model = make_model()
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model.parameters()[0])
    for step, batch in enumerate(batches(steps=STEPS)):
        with injector.inject(POISONED.get(step)):
            scaled = scaler.scale(loss_of(model, batch))
            scaled.backward()
        if isinstance(scaler, AmpScaler) and not isinstance(scaler, GradScaler):
            scaler.minimize(optimizer, scaled)
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.clear_grad()
        if copy_between_iterations is not None:
            scaler = copy_between_iterations(scaler)
    adam_state = [
        v.numpy() for v in optimizer.state_dict().values() if isinstance(v, paddle.Tensor)
    ]
    return params_of(model), adam_state, scaler


def account(scaler):
    return scaler.state_dict(), scaler.stats(), scaler.get_loss_scaling()


def round_trip(scaler):
    return pickle.loads(pickle.dumps(scaler))


KINDS = ["AmpScaler", "GradScaler", "fixed", "torch", "mindspore cell", "disabled", "headroom"]


@pytest.mark.parametrize("reload", [round_trip, copy.deepcopy], ids=["pickle", "deepcopy"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_after_every_update_continues_the_run_exactly(kind, reload):
    # PyTorch's autocast test pickles and reloads its scaler after every update().
    params, adam, scaler = train(make_scaler(kind))
    copied_params, copied_adam, copied = train(make_scaler(kind), reload)
    for got, want in zip(copied_params + copied_adam, params + adam):
        np.testing.assert_array_equal(got, want)
    state, stats, scale = account(scaler)
    copied_state, copied_stats, copied_scale = account(copied)
    assert copied_stats == stats and copied_scale == scale
    assert copied_state.keys() == state.keys()
    for key in state:
        np.testing.assert_array_equal(copied_state[key], state[key])
    if kind not in ("fixed", "disabled"):
        assert stats.skipped == 3 and stats.backoffs == 3 and stats.growths >= 1


def test_options_and_the_overflow_report_survive_a_pickle():
    scaler = GradScaler(
        init_loss_scaling=64.0,
        min_loss_scaling=2.0,
        max_loss_scaling=128.0,
        stuck_after=7,
        on_stuck="raise",
        report_overflows=True,
        sync_found_inf=False,
    )
    *_, scaler = train(scaler)
    copied = round_trip(scaler)
    assert copied.overflow_report() == scaler.overflow_report() != []
    assert (copied._rule.min_scale, copied._rule.max_scale) == (2.0, 128.0)
    assert (copied._monitors.stuck_policy.stuck_after, copied._monitors.stuck_policy.on_stuck) == (
        7,
        "raise",
    )
    assert copied._stepping.sync.enabled is False
    assert copied._scale.place.is_cpu_place()


@pytest.mark.parametrize(
    "make",
    [
        lambda: mindspore.DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=3),
        lambda: mindspore.StaticLossScaler(scale_value=2**10),
    ],
    ids=["DynamicLossScaler", "StaticLossScaler"],
)
def test_mindspores_functional_scalers_pickle_mid_run(make):
    loss_scaler, reference = make(), make()
    for finite in [True, True, False, True, True, True, True]:
        loss_scaler.adjust(finite)
        reference.adjust(finite)
        loss_scaler = round_trip(loss_scaler)
        assert float(loss_scaler.scale_value) == float(reference.scale_value)
        if hasattr(reference, "counter"):
            assert int(loss_scaler.counter) == int(reference.counter)


def test_mindspores_manager_pickles_with_its_overflow_streak():
    manager, reference = (mindspore.DynamicLossScaleManager(init_loss_scale=8.0) for _ in "ab")
    for overflow in [True, True, False, True]:
        manager.update_loss_scale(overflow)
        reference.update_loss_scale(overflow)
        manager = round_trip(manager)
        assert manager.get_loss_scale() == reference.get_loss_scale()
    assert manager._consecutive_overflows == reference._consecutive_overflows == 1


@pytest.mark.parametrize("copier", [pickle.dumps, copy.deepcopy], ids=["pickle", "deepcopy"])
@pytest.mark.parametrize("stage", ["unscale_", "step"])
@pytest.mark.parametrize("kind", ["GradScaler", "torch"])
def test_mid_iteration_is_refused_and_changes_nothing(kind, stage, copier):
    scaler = make_scaler(kind)
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    getattr(scaler, stage)(optimizer)
    with pytest.raises(RuntimeError, match="beginning of an iteration.*after scaler.update"):
        copier(scaler)
    # The iteration goes on as if nothing had been tried.
    if stage == "unscale_":
        scaler.step(optimizer)
    scaler.update()
    assert scaler.stats().iterations == 1
    assert round_trip(scaler).stats() == scaler.stats()
