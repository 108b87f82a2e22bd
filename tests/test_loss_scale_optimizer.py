"""TensorFlow/Keras' LossScaleOptimizer over a Paddle optimizer.

The loops of TensorFlow's mixed-precision guide (``minimize``, and the custom loop of
``get_scaled_loss`` / gradients / ``get_unscaled_gradients`` / ``apply_gradients``),
ported by changing names, train to the same bits as the loop without loss scaling and
skip an injected overflow exactly; the scale follows TensorFlow's rule as its source
states it; state dicts carry the scaler; what the wrapper would ignore is refused.
"""

import gc
import math
import warnings

import numpy as np
import paddle
import pytest
from counters import HostReadCounter
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import (
    GradScaler,
    LossScaleOptimizer,
    UnknownArgumentError,
    load_checkpoint,
    save_checkpoint,
)

from helpers import (
    GradInjector,
    assert_arrays_equal,
    batches,
    loss_of,
    make_model,
    optimizer_state_of,
    params_of,
)


class TFRule:
    """``_DynamicLossScaleState.update`` of tf-keras, in float32."""

    def __init__(self, initial_scale, growth_steps):
        self.scale = np.float32(initial_scale)
        self.growth_steps = growth_steps
        self.counter = 0

    def update(self, is_finite):
        if not is_finite:
            self.counter = 0
            self.scale = max(self.scale / np.float32(2), np.float32(1))
        elif self.counter + 1 >= self.growth_steps:
            with np.errstate(over="ignore"):
                grown = self.scale * np.float32(2)
            if np.isfinite(grown):
                self.scale = grown
            self.counter = 0
        else:
            self.counter += 1


def sgd(model):
    return paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())


def adam(model):
    return paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())


def state_of(model, optimizer):
    return params_of(model), optimizer_state_of(optimizer, model.parameters())


def assert_same(actual, expected):
    """Parameters and optimizer state (``state_of``) equal bit for bit."""
    assert_arrays_equal(actual[0], expected[0])
    assert_arrays_equal(actual[1], expected[1])


def train_by_minimize(optimizer, model, steps):
    for batch in steps:
        optimizer.minimize(loss_of(model, batch))
        optimizer.clear_grad()


def wrapped(optimizer, **kwargs):
    # Powers of two scale exactly; two growth steps change the scale during the run.
    kwargs.setdefault("initial_scale", 2.0**12)
    kwargs.setdefault("dynamic_growth_steps", 2)
    return LossScaleOptimizer(optimizer, **kwargs)


# -- the loops, ported ------------------------------------------------------------------


def minimize_loop(make_optimizer, scaled, skip_at=None, callable_loss=False):
    model = make_model()
    inner = make_optimizer(model)
    optimizer = wrapped(inner) if scaled else inner
    injector = GradInjector(model[0].weight)
    for step, batch in enumerate(batches(steps=6)):
        if not scaled and step == skip_at:
            continue  # the reference run never sees the step that overflows
        with injector.inject(math.inf if step == skip_at else None):
            if scaled:
                loss = (lambda batch=batch: loss_of(model, batch)) if callable_loss else None
                optimizer.minimize(loss if callable_loss else loss_of(model, batch))
            else:
                loss = loss_of(model, batch)
                loss.backward()
                optimizer.minimize(loss)
        optimizer.clear_grad()
    return state_of(model, inner), optimizer


def custom_loop(make_optimizer, scaled, skip_at=None):
    """The guide's custom training loop, with paddle.grad for the gradient tape."""
    model = make_model()
    inner = make_optimizer(model)
    optimizer = wrapped(inner) if scaled else inner
    params = model.parameters()
    for step, batch in enumerate(batches(steps=6)):
        if not scaled and step == skip_at:
            continue
        loss = loss_of(model, batch)
        if scaled:
            scaled_grads = paddle.grad(optimizer.get_scaled_loss(loss), params)
            if step == skip_at:
                scaled_grads[2] = paddle.full_like(scaled_grads[2], math.nan)
            grads = optimizer.get_unscaled_gradients(scaled_grads)
            optimizer.apply_gradients(zip(grads, params))
        else:
            grads = paddle.grad(loss, params)
            optimizer.apply_gradients(list(zip(params, grads)))
    return state_of(model, inner), optimizer


def step_loop(make_optimizer, scaled):
    model = make_model()
    inner = make_optimizer(model)
    optimizer = wrapped(inner) if scaled else inner
    for batch in batches(steps=6):
        loss = loss_of(model, batch)
        (optimizer.get_scaled_loss(loss) if scaled else loss).backward()
        optimizer.step()
        optimizer.clear_grad()
    return state_of(model, inner), optimizer


@pytest.mark.parametrize("make_optimizer", [sgd, adam])
@pytest.mark.parametrize(
    "loop",
    [minimize_loop, custom_loop, step_loop, lambda m, s: minimize_loop(m, s, callable_loss=True)],
    ids=["minimize", "custom", "step", "minimize_callable"],
)
def test_loops_train_as_without_loss_scaling(loop, make_optimizer):
    plain, _ = loop(make_optimizer, False)
    scaled, optimizer = loop(make_optimizer, True)
    assert_same(scaled, plain)
    assert float(optimizer.loss_scale) == 2.0**15


@pytest.mark.parametrize("make_optimizer", [sgd, adam])
@pytest.mark.parametrize("loop", [minimize_loop, custom_loop])
def test_an_overflow_step_is_skipped_exactly(loop, make_optimizer):
    plain, _ = loop(make_optimizer, False, skip_at=2)
    scaled, optimizer = loop(make_optimizer, True, skip_at=2)
    assert_same(scaled, plain)
    rule = TFRule(2.0**12, 2)
    for step in range(6):
        rule.update(step != 2)
    assert (float(optimizer.loss_scale), optimizer.dynamic_counter) == (rule.scale, rule.counter)


@settings(max_examples=25, deadline=None)
@given(
    overflows=st.lists(st.booleans(), min_size=1, max_size=12),
    growth_steps=st.integers(1, 4),
    initial_scale=st.sampled_from([1.0, 3.0, 2.0**10]),
)
def test_scale_follows_tensorflows_rule(overflows, growth_steps, initial_scale):
    model = make_model()
    optimizer = LossScaleOptimizer(
        sgd(model), initial_scale=initial_scale, dynamic_growth_steps=growth_steps
    )
    injector = GradInjector(model[0].weight)
    rule = TFRule(initial_scale, growth_steps)
    for overflow, batch in zip(overflows, batches(steps=len(overflows))):
        with injector.inject(math.inf if overflow else None):
            optimizer.minimize(loss_of(model, batch))
        optimizer.clear_grad()
        rule.update(not overflow)
        assert (float(optimizer.loss_scale), optimizer.dynamic_counter) == (
            rule.scale,
            rule.counter,
        )


def test_a_fixed_scale_skips_and_never_changes():
    model = make_model()
    optimizer = LossScaleOptimizer(sgd(model), dynamic=False, initial_scale=64.0)
    injector = GradInjector(model[0].weight)
    for step, batch in enumerate(batches(steps=4)):
        before = params_of(model)
        with injector.inject(math.nan if step == 1 else None):
            optimizer.minimize(loss_of(model, batch))
        optimizer.clear_grad()
        changed = not np.array_equal(params_of(model)[0], before[0])
        assert changed == (step != 1)
        assert float(optimizer.loss_scale) == 64.0
    assert (optimizer.dynamic, optimizer.dynamic_counter, optimizer.dynamic_growth_steps) == (
        False,
        None,
        None,
    )


def test_tensorflow_attributes_and_defaults():
    optimizer = LossScaleOptimizer(sgd(make_model()))
    assert optimizer.dynamic is True
    assert (optimizer.initial_scale, optimizer.dynamic_growth_steps) == (2.0**15, 2000)
    assert optimizer.dynamic_counter == 0
    scale = optimizer.loss_scale
    assert (scale.dtype, scale.shape) == (paddle.float32, [])
    scale.fill_(3.0)  # a copy: changing it changes nothing
    assert float(optimizer.loss_scale) == 2.0**15
    assert isinstance(optimizer.scaler, GradScaler)


def test_a_given_scaler_is_used():
    scaler = GradScaler(init_loss_scaling=8.0, incr_every_n_steps=3)
    model = make_model()
    optimizer = LossScaleOptimizer(sgd(model), scaler=scaler)
    optimizer.minimize(loss_of(model, batches(steps=1)[0]))
    assert optimizer.scaler is scaler
    assert (scaler.get_incr_count(), optimizer.dynamic_growth_steps) == (1, 3)


def test_unscaled_gradients_are_new_tensors_with_none_kept():
    optimizer = LossScaleOptimizer(sgd(make_model()), initial_scale=4.0)
    grads = [paddle.to_tensor([8.0, -2.0]), None, paddle.to_tensor([1.0], dtype="float64")]
    unscaled = optimizer.get_unscaled_gradients(grads)
    assert unscaled[1] is None and unscaled[0] is not grads[0]
    np.testing.assert_array_equal(unscaled[0].numpy(), [2.0, -0.5])
    assert unscaled[2].dtype == paddle.float64 and unscaled[2].numpy()[0] == 0.25
    np.testing.assert_array_equal(grads[0].numpy(), [8.0, -2.0])


def test_scaled_loss_of_a_callable_is_a_callable():
    optimizer = LossScaleOptimizer(sgd(make_model()), initial_scale=4.0)
    scaled = optimizer.get_scaled_loss(lambda: paddle.to_tensor(3.0))
    assert callable(scaled) and float(scaled()) == 12.0


# -- device reads -------------------------------------------------------------------------


@pytest.mark.parametrize(("make_optimizer", "paddle_reads"), [(sgd, 0), (adam, 1)])
@pytest.mark.parametrize("loop", ["minimize", "apply_gradients"])
def test_host_reads_are_the_core_figures(loop, make_optimizer, paddle_reads):
    model = make_model()
    optimizer = wrapped(make_optimizer(model))
    params = model.parameters()
    counter = HostReadCounter()
    for step, batch in enumerate(batches(steps=3)):
        loss = loss_of(model, batch)
        with counter.counting():
            if loop == "minimize":
                optimizer.minimize(loss)
                optimizer.clear_grad()
            else:
                grads = paddle.grad(optimizer.get_scaled_loss(loss), params)
                if step == 1:
                    grads[0] = paddle.full_like(grads[0], math.inf)
                optimizer.apply_gradients(zip(optimizer.get_unscaled_gradients(grads), params))
    assert counter.reads["scaler"] == 0, counter.where
    assert counter.total() == 3 * paddle_reads, counter.where


# -- state dicts and delegation -------------------------------------------------------------


def test_state_dict_carries_the_scaler_and_resumes():
    # SGD: Paddle names Adam's moments after a per-process counter, so its own
    # set_state_dict cannot load them into a new Adam (save_checkpoint can, below).
    data = batches(steps=6)
    whole_model = make_model()
    whole = wrapped(sgd(whole_model))
    train_by_minimize(whole, whole_model, data)

    model = make_model()
    first = wrapped(sgd(model))
    train_by_minimize(first, model, data[:3])
    # The same parameters, a new optimizer and scaler configured otherwise.
    resumed = LossScaleOptimizer(sgd(model), initial_scale=1.0, dynamic_growth_steps=5)
    resumed.set_state_dict(first.state_dict())
    assert (resumed.dynamic_growth_steps, float(resumed.loss_scale)) == (2, 2.0**13)
    train_by_minimize(resumed, model, data[3:])
    for got, want in zip(params_of(model), params_of(whole_model)):
        np.testing.assert_array_equal(got, want)
    assert float(resumed.loss_scale) == float(whole.loss_scale)


def test_a_bad_scaler_state_loads_nothing():
    model = make_model()
    optimizer = wrapped(adam(model))
    optimizer.minimize(loss_of(model, batches(steps=1)[0]))
    saved = optimizer.state_dict()
    other = wrapped(adam(model), initial_scale=8.0)
    before = {
        key: value.numpy().copy() for key, value in other.inner_optimizer.state_dict().items()
    }
    saved["LossScaleOptimizer.scaler"]["incr_ratio"] = 0.5
    with pytest.raises(ValueError, match="incr_ratio"):
        other.set_state_dict(saved)
    after = other.inner_optimizer.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(after[key].numpy(), before[key], err_msg=key)
    assert float(other.loss_scale) == 8.0


def test_checkpoints_take_the_wrapper(tmp_path):
    data = batches(steps=5)
    model = make_model()
    optimizer = wrapped(adam(model))
    train_by_minimize(optimizer, model, data[:3])
    path = tmp_path / "run.ckpt"
    save_checkpoint(path, model=model, optimizer=optimizer, scaler=optimizer.scaler, step=3)
    train_by_minimize(optimizer, model, data[3:])

    fresh_model = make_model(seed=5)
    fresh = wrapped(adam(fresh_model), initial_scale=2.0)
    assert load_checkpoint(path, model=fresh_model, optimizer=fresh, scaler=fresh.scaler) == 3
    train_by_minimize(fresh, fresh_model, data[3:])
    assert float(fresh.loss_scale) == float(optimizer.loss_scale)
    assert_same(
        state_of(fresh_model, fresh.inner_optimizer), state_of(model, optimizer.inner_optimizer)
    )


def test_delegated_methods_reach_the_inner_optimizer():
    model = make_model()
    inner = sgd(model)
    optimizer = LossScaleOptimizer(inner)
    optimizer.set_lr(0.25)
    assert optimizer.get_lr() == inner.get_lr() == 0.25
    loss_of(model, batches(steps=1)[0]).backward()
    optimizer.clear_grad()
    assert all(p.grad is None or not p.grad.numpy().any() for p in model.parameters())
    scheduler = paddle.optimizer.lr.StepDecay(learning_rate=0.5, step_size=1)
    inner_with_scheduler = paddle.optimizer.SGD(
        learning_rate=scheduler, parameters=model.parameters()
    )
    LossScaleOptimizer(inner_with_scheduler).set_lr_scheduler(
        paddle.optimizer.lr.StepDecay(learning_rate=0.125, step_size=1)
    )
    assert inner_with_scheduler.get_lr() == 0.125


def test_anything_else_names_the_inner_optimizer():
    optimizer = LossScaleOptimizer(sgd(make_model()))
    with pytest.raises(AttributeError, match="inner_optimizer._parameter_list.*SGD"):
        optimizer._parameter_list  # noqa: B018


# -- misuse -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dynamic": 1}, TypeError, "dynamic must be a bool"),
        ({"dynamic": False}, ValueError, "initial_scale is required when dynamic=False"),
        (
            {"dynamic": False, "initial_scale": 8.0, "dynamic_growth_steps": 10},
            ValueError,
            "dynamic_growth_steps must be None when dynamic=False",
        ),
        ({"initial_scale": -1.0}, ValueError, "initial_scale"),
        ({"dynamic_growth_steps": 0}, ValueError, "dynamic_growth_steps"),
        ({"scaler": GradScaler(), "initial_scale": 8.0}, ValueError, "either scaler="),
        ({"scaler": "big"}, TypeError, "scaler must be"),
        ({"learning_rate": 0.1}, TypeError, "'learning_rate' \\(set it on the inner.*SGD\\(\\.\\."),
        ({"dynamic_growth_steps": 2.5}, ValueError, "dynamic_growth_steps must be a whole"),
        ({"dynamic_growth_steps": math.nan}, ValueError, "dynamic_growth_steps"),
        ({"dynamic_growth_steps": -2.0}, ValueError, "dynamic_growth_steps"),
        ({"dynamic_growth_steps": True}, TypeError, "dynamic_growth_steps"),
        ({"dynamic_growth_steps": "2"}, TypeError, "dynamic_growth_steps"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        LossScaleOptimizer(sgd(make_model()), **kwargs)


def test_unknown_arguments_are_one_error_naming_each_with_its_fix():
    # Keras 3's own test: unknown names give a ValueError naming all of them; tf-keras and
    # Python give a TypeError. One error that both catch.
    for catch in (ValueError, TypeError, UnknownArgumentError):
        with pytest.raises(catch) as raised:
            LossScaleOptimizer(
                sgd(make_model()), foo=True, bar=3, dynamic_growth_step=100, learning_rate=0.1
            )
        message = str(raised.value)
        assert "'foo' (it takes inner_optimizer, dynamic" in message and "'bar' (" in message
        assert "'dynamic_growth_step' (did you mean 'dynamic_growth_steps'?)" in message
        assert "'learning_rate' (set it on the inner optimizer instead: SGD(" in message


# Keras 3's base-optimizer arguments, each with the value its own test passes and what
# our message must name on Paddle's side.
KERAS_OPTIMIZER_ARGUMENTS = [
    ("weight_decay", 0.5, "weight_decay=... on the inner optimizer"),
    ("clipnorm", 0.5, "grad_clip=paddle.nn.ClipGradByNorm(...)"),
    ("global_clipnorm", 0.5, "grad_clip=paddle.nn.ClipGradByGlobalNorm(...)"),
    ("clipvalue", 0.5, "grad_clip=paddle.nn.ClipGradByValue(...)"),
    ("use_ema", True, "Paddle's optimizers keep no moving average"),
    ("ema_momentum", 0.5, "Paddle's optimizers keep no moving average"),
    ("ema_overwrite_frequency", 2, "Paddle's optimizers keep no moving average"),
    ("loss_scale_factor", 0.5, "initial_scale=..."),
    ("gradient_accumulation_steps", 2, "get_scaled_loss(loss).backward()"),
]


KERAS_IDS = [name for name, _, _ in KERAS_OPTIMIZER_ARGUMENTS]


@pytest.mark.parametrize(("name", "value", "on_paddle"), KERAS_OPTIMIZER_ARGUMENTS, ids=KERAS_IDS)
def test_keras_base_optimizer_arguments_are_refused_as_keras_refuses_them(name, value, on_paddle):
    # Keras 3's test_init_base_optimizer_unsupported_args, with its values: a ValueError
    # saying that the argument goes on the inner optimizer.
    inner = sgd(make_model())
    with pytest.raises(ValueError, match="on the inner optimizer"):
        LossScaleOptimizer(inner, **{name: value})
    LossScaleOptimizer(inner)  # a refused wrapper did not mark the optimizer as wrapped


@pytest.mark.parametrize(("name", "value", "on_paddle"), KERAS_OPTIMIZER_ARGUMENTS, ids=KERAS_IDS)
def test_keras_base_optimizer_arguments_say_where_they_live_in_keras_then_in_paddle(
    name, value, on_paddle
):
    with pytest.raises(UnknownArgumentError, match=f"'{name}' \\(") as raised:
        LossScaleOptimizer(sgd(make_model()), **{name: value})
    advice = str(raised.value).split(f"{name!r} (", 1)[1]
    in_keras, in_paddle = advice.split("; ", 1)
    assert in_keras == "in Keras it is set on the inner optimizer", advice
    assert on_paddle in in_paddle, advice


@pytest.mark.parametrize("steps", [2.0, np.float64(2.0)], ids=["float", "numpy"])
def test_a_whole_float_growth_period_is_taken_as_tf_keras_takes_it(steps):
    # tf-keras' testCheckpoint builds both wrappers with dynamic_growth_steps=2.0.
    data = batches(steps=6)
    model = make_model()
    optimizer = LossScaleOptimizer(sgd(model), initial_scale=1.0, dynamic_growth_steps=steps)
    assert optimizer.dynamic_growth_steps == 2 and type(optimizer.dynamic_growth_steps) is int
    assert optimizer.state_dict()["LossScaleOptimizer.scaler"]["incr_every_n_steps"] == 2
    train_by_minimize(optimizer, model, data[:3])
    resumed = LossScaleOptimizer(sgd(model), initial_scale=1.0, dynamic_growth_steps=steps)
    resumed.set_state_dict(optimizer.state_dict())
    train_by_minimize(resumed, model, data[3:])
    rule = TFRule(1.0, 2)
    for _ in data:
        rule.update(True)
    assert float(resumed.loss_scale) == float(rule.scale) == 8.0


def hand_written_step(optimizer, model, scale_loss, unscale_grads):
    """One step of TensorFlow's custom loop, with either call left out."""
    params = list(model.parameters())
    loss = loss_of(model, batches(steps=1)[0])
    grads = paddle.grad(optimizer.get_scaled_loss(loss) if scale_loss else loss, params)
    if unscale_grads:
        grads = optimizer.get_unscaled_gradients(grads)
    optimizer.apply_gradients(zip(grads, params))


@pytest.mark.parametrize(
    ("scale_loss", "unscale_grads", "missed"),
    [
        (False, False, "without get_scaled_loss\\(\\) and get_unscaled_gradients\\(\\) having"),
        (False, True, "without get_scaled_loss\\(\\) having"),
        (True, False, "without get_unscaled_gradients\\(\\) having"),
    ],
)
@pytest.mark.parametrize("dynamic", [True, False])
def test_apply_gradients_warns_once_naming_the_forgotten_calls(
    dynamic, scale_loss, unscale_grads, missed
):
    # tf-keras' testScalingWarning: unscaled gradients are applied loss_scale times
    # too large, a loss never scaled may underflow. Once per wrapper.
    model = make_model()
    optimizer = LossScaleOptimizer(
        sgd(model), dynamic=dynamic, initial_scale=2.0**12 if not dynamic else None
    )
    with pytest.warns(UserWarning, match=f"apply_gradients\\(\\) was called {missed}"):
        hand_written_step(optimizer, model, scale_loss, unscale_grads)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hand_written_step(optimizer, model, scale_loss, unscale_grads)


@pytest.mark.parametrize("loop", ["both calls", "minimize", "step", "disabled"])
def test_no_scaling_warning_where_the_loss_was_scaled_and_the_gradients_unscaled(loop):
    model = make_model()
    scaler = GradScaler(enable=False) if loop == "disabled" else None
    optimizer = LossScaleOptimizer(sgd(model), scaler=scaler)
    loss = loss_of(model, batches(steps=1)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if loop == "minimize":
            optimizer.minimize(loss)
        elif loop == "step":
            optimizer.get_scaled_loss(loss).backward()
            optimizer.step()
        else:
            hand_written_step(optimizer, model, loop == "both calls", loop == "both calls")


def test_an_optimizer_is_wrapped_once_whether_or_not_the_first_wrapper_lives():
    inner = sgd(make_model())
    first = LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="already wrapped by a LossScaleOptimizer.*keep the first"):
        LossScaleOptimizer(inner)
    del first
    gc.collect()
    with pytest.raises(ValueError, match="already wrapped"):
        LossScaleOptimizer(inner, dynamic=False, initial_scale=8.0)
    with pytest.raises(TypeError, match="cannot wrap another LossScaleOptimizer"):
        LossScaleOptimizer(LossScaleOptimizer(sgd(make_model())))


def test_bad_inner_optimizers():
    with pytest.raises(TypeError, match="cannot wrap another LossScaleOptimizer"):
        LossScaleOptimizer(LossScaleOptimizer(sgd(make_model())))
    with pytest.raises(TypeError, match="inner_optimizer must be a paddle.optimizer.Optimizer"):
        LossScaleOptimizer(object())


def test_bad_calls():
    model = make_model()
    optimizer = LossScaleOptimizer(sgd(model))
    with pytest.raises(TypeError, match="loss must be a Tensor"):
        optimizer.minimize(3.0)
    with pytest.raises(TypeError, match="loss must be a Tensor"):
        optimizer.get_scaled_loss("loss")
    with pytest.raises(TypeError, match="grads must be a list"):
        optimizer.get_unscaled_gradients(paddle.to_tensor([1.0]))
    with pytest.raises(TypeError, match="\\(grad, param\\) pairs"):
        optimizer.apply_gradients([paddle.to_tensor([1.0])])
    weight = model.parameters()[0]
    with pytest.raises(TypeError, match="each gradient must be a Tensor"):
        optimizer.apply_gradients([(1.0, weight)])
