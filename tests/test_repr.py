"""A readable repr for every scaler and dialect: the state as it stands, in the names of
the framework imitated, and the options that differ from their defaults."""

import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler, LossScaleOptimizer
from paddle_amp_scaler.compat import mindspore, torch

from helpers import GradInjector, batches, make_model, train_step


def after_a_back_off(scaler):
    """``scaler`` after a finite step and an overflowing one (scale halved)."""
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    injector = GradInjector(model[0].weight)
    api = "minimize" if type(scaler) is AmpScaler else "step_update"
    for batch, value in zip(batches(steps=3), [None, float("inf"), None]):
        train_step(scaler, model, optimizer, batch, api, injector, value)
    return scaler


def test_the_core_scalers_show_their_state_in_paddles_names():
    scaler = after_a_back_off(GradScaler(init_loss_scaling=1024.0, incr_every_n_steps=5))
    assert repr(scaler) == (
        "GradScaler(scale=512.0, incr_count=1, decr_count=0, incr_ratio=2.0, decr_ratio=0.5, "
        "incr_every_n_steps=5, decr_every_n_nan_or_inf=1)"
    )
    amp = after_a_back_off(AmpScaler(init_loss_scaling=64.0))
    assert repr(amp).startswith("AmpScaler(scale=32.0, incr_count=1, decr_count=0,")


@pytest.mark.parametrize(
    ("options", "shown"),
    [
        ({"max_loss_scaling": 2.0**20}, "max_loss_scaling=1048576.0"),
        ({"min_loss_scaling": 0.5}, "min_loss_scaling=0.5"),
        ({"stuck_after": 10, "on_stuck": "raise"}, "stuck_after=10, on_stuck='raise'"),
        ({"report_overflows": True}, "report_overflows=True"),
        ({"sync_found_inf": False}, "sync_found_inf=False"),
        ({"use_dynamic_loss_scaling": False}, "use_dynamic_loss_scaling=False"),
    ],
)
def test_an_option_shows_only_when_it_differs_from_its_default(options, shown):
    text = repr(GradScaler(**options))
    assert text.endswith(f", {shown})")
    for default in ("min_loss_scaling=1.0", "stuck_after=None", "report_overflows=False"):
        assert default not in text


def test_a_disabled_scaler_says_so_in_each_dialect():
    assert repr(GradScaler(enable=False)) == "GradScaler(enable=False)"
    assert repr(torch.GradScaler(enabled=False)) == "GradScaler(enabled=False)"


def test_the_pytorch_face_shows_pytorchs_names():
    scaler = torch.GradScaler(init_scale=256.0, growth_interval=4, stuck_after=3)
    scaler = after_a_back_off(scaler)
    assert repr(scaler) == (
        "GradScaler(scale=128.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=4, "
        "growth_tracker=1, stuck_after=3)"
    )


def test_the_mindspore_names():
    manager = mindspore.DynamicLossScaleManager(init_loss_scale=10.0, scale_factor=3)
    manager.update_loss_scale(True)
    assert repr(manager) == (
        f"DynamicLossScaleManager(loss_scale={10.0 * (1 / 3)!r}, scale_factor=3.0, "
        "scale_window=2000)"
    )
    assert repr(mindspore.FixedLossScaleManager(loss_scale=64.0, drop_overflow_update=False)) == (
        "FixedLossScaleManager(loss_scale=64.0, drop_overflow_update=False)"
    )
    loss_scaler = mindspore.DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=50)
    loss_scaler.adjust(False)  # an overflow: halved
    loss_scaler.adjust(True)  # a finite step: counted
    assert repr(loss_scaler) == (
        "DynamicLossScaler(scale_value=512.0, scale_factor=2, scale_window=50, counter=1)"
    )
    assert repr(mindspore.StaticLossScaler(8.0)) == "StaticLossScaler(scale_value=8.0)"


def test_the_keras_names():
    model = make_model()
    dynamic = LossScaleOptimizer(
        paddle.optimizer.SGD(parameters=model.parameters()), initial_scale=8.0
    )
    assert repr(dynamic) == (
        "LossScaleOptimizer(SGD, dynamic=True, loss_scale=8.0, dynamic_growth_steps=2000, "
        "dynamic_counter=0)"
    )
    fixed = LossScaleOptimizer(
        paddle.optimizer.Adam(parameters=make_model().parameters()),
        dynamic=False,
        initial_scale=4.0,
    )
    assert repr(fixed) == "LossScaleOptimizer(Adam, dynamic=False, loss_scale=4.0)"
