"""Bad arguments raise TypeError/ValueError naming the argument; misordered calls raise
RuntimeError saying what to call instead."""

import math

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler

from helpers import batches, loss_of, make_model

BAD_ARGUMENTS = [
    ("enable", 1, TypeError),
    ("enable", "yes", TypeError),
    ("init_loss_scaling", 0.0, ValueError),
    ("init_loss_scaling", -1.0, ValueError),
    ("init_loss_scaling", math.inf, ValueError),
    ("init_loss_scaling", math.nan, ValueError),
    ("init_loss_scaling", 1e39, ValueError),
    ("init_loss_scaling", "big", TypeError),
    ("init_loss_scaling", None, TypeError),
    ("incr_ratio", 1.0, ValueError),
    ("incr_ratio", 0.5, ValueError),
    ("incr_ratio", math.inf, ValueError),
    ("incr_ratio", None, TypeError),
    ("decr_ratio", 1.0, ValueError),
    ("decr_ratio", 0.0, ValueError),
    ("decr_ratio", 1.5, ValueError),
    ("decr_ratio", math.nan, ValueError),
    ("incr_every_n_steps", 0, ValueError),
    ("incr_every_n_steps", 1.5, TypeError),
    ("incr_every_n_steps", True, TypeError),
    ("incr_every_n_steps", 2**31, ValueError),
    ("decr_every_n_nan_or_inf", 0, ValueError),
    ("decr_every_n_nan_or_inf", "2", TypeError),
    ("use_dynamic_loss_scaling", "no", TypeError),
    ("use_dynamic_loss_scaling", 0, TypeError),
]


@pytest.mark.parametrize("enable", [True, False])
@pytest.mark.parametrize("cls", [AmpScaler, GradScaler])
@pytest.mark.parametrize(
    "name,value,error", BAD_ARGUMENTS, ids=[f"{n}={v!r}" for n, v, _ in BAD_ARGUMENTS]
)
def test_bad_constructor_argument(cls, enable, name, value, error):
    kwargs = {"enable": enable, name: value}
    with pytest.raises(error, match=name) as raised:
        cls(**kwargs)
    assert repr(value) in str(raised.value)


SETTERS = [
    ("set_init_loss_scaling", 0.0, ValueError),
    ("set_init_loss_scaling", "x", TypeError),
    ("set_incr_ratio", 1.0, ValueError),
    ("set_decr_ratio", 1.0, ValueError),
    ("set_incr_every_n_steps", 0, ValueError),
    ("set_incr_every_n_steps", 2.0, TypeError),
    ("set_decr_every_n_nan_or_inf", -3, ValueError),
    ("set_incr_count", -1, ValueError),
    ("set_incr_count", 1.0, TypeError),
    ("set_incr_count", 2000, ValueError),
    ("set_decr_count", -1, ValueError),
    ("set_decr_count", 1, ValueError),
]


@pytest.mark.parametrize("setter,value,error", SETTERS, ids=[f"{s}({v!r})" for s, v, _ in SETTERS])
def test_bad_setter_argument_changes_nothing(setter, value, error):
    scaler = GradScaler()
    before = scaler.state_dict()
    argument = "new_" + setter[len("set_") :]
    with pytest.raises(error, match=argument):
        getattr(scaler, setter)(value)
    after = scaler.state_dict()
    assert after.keys() == before.keys()
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_setters_and_getters_round_trip():
    scaler = GradScaler()
    scaler.set_init_loss_scaling(512.0)
    scaler.set_incr_ratio(3.0)
    scaler.set_decr_ratio(0.25)
    scaler.set_incr_every_n_steps(10)
    scaler.set_decr_every_n_nan_or_inf(4)
    scaler.set_incr_count(9)
    scaler.set_decr_count(3)
    assert (
        scaler.get_init_loss_scaling(),
        scaler.get_loss_scaling(),
        scaler.get_incr_ratio(),
        scaler.get_decr_ratio(),
        scaler.get_incr_every_n_steps(),
        scaler.get_decr_every_n_nan_or_inf(),
        scaler.get_incr_count(),
        scaler.get_decr_count(),
    ) == (512.0, 512.0, 3.0, 0.25, 10, 4, 9, 3)


def test_scale_rejects_a_non_tensor():
    with pytest.raises(TypeError, match="var"):
        GradScaler().scale(1.0)


@pytest.fixture
def setup():
    model = make_model()
    optimizer = paddle.optimizer.Adam(parameters=model.parameters())
    scaler = GradScaler()
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    return scaler, optimizer


def test_unscale_twice(setup):
    scaler, optimizer = setup
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already been called.*at most once"):
        scaler.unscale_(optimizer)


def test_unscale_after_step(setup):
    scaler, optimizer = setup
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="after step.*before step"):
        scaler.unscale_(optimizer)


def test_step_twice_before_update(setup):
    scaler, optimizer = setup
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="call scaler.update"):
        scaler.step(optimizer)
    scaler.update()
    scaler.step(optimizer)


@pytest.mark.parametrize("dynamic", [True, False])
def test_update_without_step(setup, dynamic):
    scaler, optimizer = setup
    if not dynamic:
        scaler = GradScaler(use_dynamic_loss_scaling=False)
    with pytest.raises(RuntimeError, match="no step.*call scaler.step"):
        scaler.update()
    scaler.step(optimizer)
    scaler.update()
    with pytest.raises(RuntimeError, match="no step"):
        scaler.update()


def test_unscale_only_does_not_count_as_a_step(setup):
    scaler, optimizer = setup
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="no step"):
        scaler.update()


def test_optimizer_without_parameters_is_a_type_error():
    with pytest.raises(TypeError, match="optimizer"):
        GradScaler().unscale_(object())


@pytest.mark.skipif(paddle.device.is_compiled_with_cuda(), reason="this Paddle has CUDA")
@pytest.mark.parametrize("place", ["gpu", "gpu:0", "npu:3", "nowhere"])
def test_a_place_this_paddle_cannot_use_is_a_value_error_naming_it(place):
    with pytest.raises(ValueError, match=f"place '{place}' cannot be used here"):
        GradScaler(place=place)


@pytest.mark.parametrize("place", [3, ["cpu"]])
def test_a_place_of_the_wrong_kind_is_a_type_error(place):
    with pytest.raises(TypeError, match="place must be None, a device string"):
        GradScaler(place=place)
