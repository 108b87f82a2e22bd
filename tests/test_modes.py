"""Disabled scalers, bfloat16 auto-disable, and scale()'s dtype and shape rules."""

import warnings

import numpy as np
import paddle
import pytest
from paddle.amp.auto_cast import amp_global_state

from paddle_amp_scaler import AmpScaler, GradScaler, auto_cast

from helpers import batches, loss_of, make_model, params_of


@pytest.mark.parametrize("cls", [AmpScaler, GradScaler])
def test_disabled_scaler_is_transparent(cls):
    scaler = cls(enable=False, init_loss_scaling=1024.0, incr_ratio=3.0, incr_every_n_steps=7)
    model, reference = make_model(), make_model()
    opt = paddle.optimizer.Adam(parameters=model.parameters())
    ref_opt = paddle.optimizer.Adam(parameters=reference.parameters())
    for batch in batches(steps=3):
        loss = loss_of(model, batch)
        assert scaler.scale(loss) is loss
        loss.backward()
        scaler.unscale_(opt)
        if cls is GradScaler:
            scaler.step(opt)
            scaler.update()
            scaler.update()  # nothing to refuse when disabled
        else:
            scaler.minimize(opt, loss)
        opt.clear_grad()
        loss_of(reference, batch).backward()
        ref_opt.step()
        ref_opt.clear_grad()
    for a, b in zip(params_of(model), params_of(reference)):
        np.testing.assert_array_equal(a, b)
    assert not scaler.is_enable()
    assert scaler.get_init_loss_scaling() == 1.0 and scaler.get_loss_scaling() == 1.0
    assert (scaler.get_incr_ratio(), scaler.get_incr_every_n_steps()) == (3.0, 7)
    assert scaler.state_dict() == {}


def test_bfloat16_autocast_switches_a_dynamic_scaler_off_with_one_warning():
    scaler = GradScaler()
    with auto_cast(dtype="bfloat16"):
        loss = paddle.to_tensor(2.0)
    with pytest.warns(UserWarning, match="bfloat16"):
        assert scaler.scale(loss) is loss
    # As Paddle's own (its test_amp_api.py checks both).
    assert not scaler.is_enable()
    assert not scaler.is_use_dynamic_loss_scaling()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.scale(loss)
    assert scaler.get_loss_scaling() == 1.0


def test_fixed_scale_stays_on_under_bfloat16():
    scaler = GradScaler(use_dynamic_loss_scaling=False, init_loss_scaling=4.0)
    with auto_cast(dtype="bfloat16"):
        loss = paddle.to_tensor(2.0)
    assert float(scaler.scale(loss)) == 8.0


def test_no_autocast_at_all_keeps_the_scaler_on():
    # Paddle's own scaler turns off here, because the global AMP dtype reads float32.
    assert amp_global_state().amp_dtype == "float32"
    scaler = GradScaler(init_loss_scaling=4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(scaler.scale(paddle.to_tensor(2.0))) == 8.0
    assert scaler.is_enable()


def test_float16_autocast_keeps_the_scaler_on():
    scaler = GradScaler(init_loss_scaling=4.0)
    with auto_cast(dtype="float16"):
        loss = paddle.to_tensor(2.0)
    assert float(scaler.scale(loss)) == 8.0 and scaler.is_enable()


@pytest.mark.parametrize("shape", [[], [1], [3], [2, 3]])
@pytest.mark.parametrize(
    "dtype,expected",
    [("float32", "float32"), ("float64", "float64"), ("float16", "float32"), ("int32", "float32")],
)
def test_scale_keeps_shape_and_promotes_dtype(shape, dtype, expected):
    scaler = GradScaler(init_loss_scaling=8.0)
    var = paddle.full(shape, 3, dtype=dtype)
    scaled = scaler.scale(var)
    assert scaled.shape == var.shape
    assert scaled.dtype == getattr(paddle, expected)
    np.testing.assert_array_equal(scaled.numpy(), np.full(shape, 24.0, dtype=expected))


def test_scale_is_differentiable():
    scaler = GradScaler(init_loss_scaling=8.0)
    x = paddle.to_tensor([1.0, 2.0], stop_gradient=False)
    scaler.scale((x * x).sum()).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [16.0, 32.0])


def test_setting_the_initial_scale_resets_the_current_scale():
    scaler = GradScaler()
    scaler.set_init_loss_scaling(32.0)
    assert scaler.get_init_loss_scaling() == 32.0 and scaler.get_loss_scaling() == 32.0


def test_defaults_match_paddle():
    import inspect

    for ours, theirs in ((AmpScaler, paddle.amp.AmpScaler), (GradScaler, paddle.amp.GradScaler)):
        ours_params = inspect.signature(ours.__init__).parameters.values()
        their_params = inspect.signature(theirs.__init__).parameters.values()
        # Paddle's arguments in Paddle's order; ours add keyword-only ones after them.
        positional = [p for p in ours_params if p.kind is not p.KEYWORD_ONLY]
        assert [(p.name, p.default) for p in positional] == [
            (p.name, p.default) for p in their_params
        ]


def test_same_public_methods_as_paddle():
    for ours, theirs in ((AmpScaler, paddle.amp.AmpScaler), (GradScaler, paddle.amp.GradScaler)):
        public = {name for name in dir(theirs) if not name.startswith("_")}
        assert public <= set(dir(ours)), public - set(dir(ours))
