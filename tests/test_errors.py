"""Bad arguments raise TypeError/ValueError naming the argument; misordered calls raise
RuntimeError saying what to call instead."""

import math

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler, LossScaleOptimizer, UnknownArgumentError
from paddle_amp_scaler.compat import mindspore
from paddle_amp_scaler.compat import torch as torch_face

from helpers import batches, loss_of, make_model, params_of

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
    ("incr_every_n_steps", 1.5, ValueError),
    ("incr_every_n_steps", math.nan, ValueError),
    ("incr_every_n_steps", math.inf, ValueError),
    ("incr_every_n_steps", -2.0, ValueError),
    ("incr_every_n_steps", True, TypeError),
    ("incr_every_n_steps", 2**31, ValueError),
    ("decr_every_n_nan_or_inf", 0, ValueError),
    ("decr_every_n_nan_or_inf", "2", TypeError),
    ("decr_every_n_nan_or_inf", 0.0, ValueError),
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
    ("set_incr_every_n_steps", 2.5, ValueError),
    ("set_decr_every_n_nan_or_inf", np.float32("nan"), ValueError),
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


@pytest.mark.parametrize("whole", [2.0, np.float64(2.0), np.float32(2.0)], ids=repr)
def test_step_periods_take_whole_floats_as_paddles_scaler_does(whole):
    # Paddle's own scaler takes its periods unchecked: code written for it may pass 2.0.
    scaler = GradScaler(incr_every_n_steps=whole, decr_every_n_nan_or_inf=whole)
    assert scaler.get_incr_every_n_steps() == scaler.get_decr_every_n_nan_or_inf() == 2
    assert type(scaler.state_dict()["incr_every_n_steps"]) is int
    scaler.set_incr_every_n_steps(whole * 2)
    scaler.set_decr_every_n_nan_or_inf(whole * 3)
    assert (scaler.get_incr_every_n_steps(), scaler.get_decr_every_n_nan_or_inf()) == (4, 6)
    assert type(scaler.get_incr_every_n_steps()) is int


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


EMPTY_OPTIMIZER_CALLS = {
    "GradScaler.step": lambda optimizer: GradScaler().step(optimizer),
    "disabled GradScaler.step": lambda optimizer: GradScaler(enable=False).step(optimizer),
    "GradScaler.unscale_": lambda optimizer: GradScaler().unscale_(optimizer),
    "disabled AmpScaler.unscale_": lambda optimizer: AmpScaler(enable=False).unscale_(optimizer),
    "AmpScaler.minimize": lambda optimizer: AmpScaler().minimize(optimizer, paddle.ones([1])),
    "torch GradScaler.step": lambda optimizer: torch_face.GradScaler().step(optimizer),
    "LossScaleOptimizer": LossScaleOptimizer,
}


@pytest.mark.parametrize("make", [paddle.optimizer.Adam, paddle.optimizer.SGD], ids=["Adam", "SGD"])
@pytest.mark.parametrize("call", sorted(EMPTY_OPTIMIZER_CALLS))
def test_an_optimizer_with_no_parameters_is_one_value_error_everywhere(call, make):
    # Paddle alone: an IndexError deep in Adam, a silent ([], []) from SGD's minimize.
    optimizer = make(parameters=[])
    with pytest.raises(
        ValueError,
        match=f"the {make.__name__} optimizer has no parameters.*parameters=model.parameters()",
    ):
        EMPTY_OPTIMIZER_CALLS[call](optimizer)


def test_an_optimizer_with_no_parameters_changes_nothing():
    scaler = GradScaler(init_loss_scaling=8.0)
    empty = paddle.optimizer.Adam(parameters=[])
    with pytest.raises(ValueError, match="no parameters"):
        scaler.step(empty)
    assert scaler.stats().iterations == 0
    with pytest.raises(RuntimeError, match="no step"):
        scaler.update()
    model = make_model()
    optimizer = paddle.optimizer.Adam(parameters=model.parameters())
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    scaler.step(optimizer)
    scaler.update()
    assert (scaler.stats().iterations, scaler.get_incr_count()) == (1, 1)


def no_gradient_yet():
    """A model and its optimizer, none of whose parameters has a gradient."""
    model = make_model()
    return model, paddle.optimizer.Adam(learning_rate=0.1, parameters=model.parameters())


@pytest.mark.parametrize("api", ["step", "minimize"])
def test_paddle_faces_step_with_nothing_checked_but_do_not_count_it(api):
    model, optimizer = no_gradient_yet()
    scaler = GradScaler(init_loss_scaling=8.0, incr_every_n_steps=1)
    before = params_of(model)
    with pytest.warns(UserWarning, match="no parameter of this Adam has a gradient"):
        if api == "step":
            scaler.step(optimizer)
            scaler.update()
        else:
            scaler.minimize(optimizer, paddle.ones([1]))
    # Stepped as Paddle's scaler steps it (Adam makes no update without gradients) ...
    for got, want in zip(params_of(model), before):
        np.testing.assert_array_equal(got, want)
    # ... but not a finite iteration: nothing counted, the scale did not grow.
    assert scaler.stats().iterations == 0
    assert (scaler.get_loss_scaling(), scaler.get_incr_count()) == (8.0, 0)
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    scaler.step(optimizer)
    scaler.update()
    assert (scaler.stats().iterations, scaler.get_loss_scaling()) == (1, 16.0)


def test_an_iteration_counts_when_another_optimizer_checked_gradients():
    model, idle = no_gradient_yet()
    busy = paddle.optimizer.SGD(parameters=make_model(seed=1).parameters())
    other = busy._parameter_list[0]
    (other * 2).sum().backward()
    scaler = GradScaler(init_loss_scaling=8.0, incr_every_n_steps=1)
    with pytest.warns(UserWarning, match="nothing was checked"):
        scaler.step(idle)
    scaler.step(busy)
    scaler.update()
    assert (scaler.stats().iterations, scaler.get_loss_scaling()) == (1, 16.0)


def test_the_torch_face_refuses_a_step_with_nothing_checked_as_pytorch_does():
    model, optimizer = no_gradient_yet()
    scaler = torch_face.GradScaler(init_scale=8.0, growth_interval=1)
    for catch in (AssertionError, RuntimeError, torch_face.TorchAssertionError):
        with pytest.raises(
            catch,
            match=r"No inf checks were recorded for this optimizer.*scale\(loss\)\.backward",
        ):
            scaler.step(optimizer)
    with pytest.raises(torch_face.TorchAssertionError, match="prior to update"):
        scaler.update()
    # The refused step left no record: after a backward the iteration runs as usual.
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    scaler.step(optimizer)
    scaler.update()
    assert (scaler.stats().iterations, scaler.get_scale()) == (1, 16.0)


# Every constructor, with a near-miss of one of its own keywords and a name it cannot know.
TYPOS = {
    "AmpScaler": (AmpScaler, "init_loss_scale", "init_loss_scaling"),
    "GradScaler": (GradScaler, "incr_every_n_step", "incr_every_n_steps"),
    "torch GradScaler": (torch_face.GradScaler, "growth_intervals", "growth_interval"),
    "torch GradScaler, core option": (torch_face.GradScaler, "stuck_afterr", "stuck_after"),
    "FixedLossScaleManager": (mindspore.FixedLossScaleManager, "losscale", "loss_scale"),
    "DynamicLossScaleManager": (mindspore.DynamicLossScaleManager, "scale_windows", "scale_window"),
    "StaticLossScaler": (mindspore.StaticLossScaler, "scale_values", "scale_value"),
    "DynamicLossScaler": (mindspore.DynamicLossScaler, "scale_facter", "scale_factor"),
}


@pytest.mark.parametrize("name", sorted(TYPOS))
def test_an_unknown_keyword_says_did_you_mean_and_names_every_unknown_one(name):
    make, typo, meant = TYPOS[name]
    arguments = (
        {"scale_value": 8.0, "scale_factor": 2, "scale_window": 5}
        if name == "DynamicLossScaler"
        else {}
    )
    arguments.pop(meant, None)
    arguments.update({typo: 3, "zzz_unrelated": 1})
    for catch in (ValueError, TypeError, UnknownArgumentError):
        with pytest.raises(catch) as raised:
            make(**arguments)
        message = str(raised.value)
        assert f"{typo!r} (did you mean {meant!r}?)" in message
        assert "'zzz_unrelated' (it takes " in message and meant in message


@pytest.mark.skipif(paddle.device.is_compiled_with_cuda(), reason="this Paddle has CUDA")
@pytest.mark.parametrize("place", ["gpu", "gpu:0", "npu:3", "nowhere"])
def test_a_place_this_paddle_cannot_use_is_a_value_error_naming_it(place):
    with pytest.raises(ValueError, match=f"place '{place}' cannot be used here"):
        GradScaler(place=place)


@pytest.mark.parametrize("place", [3, ["cpu"]])
def test_a_place_of_the_wrong_kind_is_a_type_error(place):
    with pytest.raises(TypeError, match="place must be None, a device string"):
        GradScaler(place=place)


@pytest.mark.parametrize("enable", [True, False])
@pytest.mark.parametrize("call", ["step", "minimize", "unscale_", "torch step"])
def test_a_model_given_for_the_optimizer_is_a_type_error_saying_so(call, enable):
    from paddle_amp_scaler.compat.torch import GradScaler as TorchGradScaler

    model = paddle.nn.Linear(2, 2)
    scaler = TorchGradScaler("cpu", enabled=enable) if call == "torch step" else None
    scaler = scaler or GradScaler(enable=enable)
    method = {"torch step": "step"}.get(call, call)
    arguments = (model, None) if call == "minimize" else (model,)
    model_given = rf"^{method}\(\) takes an optimizer .* got Linear: a model"
    with pytest.raises(TypeError, match=model_given):
        getattr(scaler, method)(*arguments)
    with pytest.raises(TypeError, match=rf"^{method}\(\) takes an optimizer .* got str$"):
        getattr(scaler, method)("adam", *arguments[1:])


@pytest.mark.parametrize("enable", [True, False])
def test_minimize_with_its_arguments_swapped_says_the_optimizer_comes_first(enable):
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = GradScaler(enable=enable)
    scaled = scaler.scale(loss_of(model, batches(steps=1)[0]))
    swapped = r"got Tensor: the optimizer comes first and the scaled loss second, minimize\("
    with pytest.raises(TypeError, match=swapped):
        scaler.minimize(scaled, optimizer)
    # The step, given a Tensor, says only what it got: it takes no loss.
    with pytest.raises(TypeError, match=r"^step\(\) takes an optimizer .* got Tensor$"):
        scaler.step(scaled)
