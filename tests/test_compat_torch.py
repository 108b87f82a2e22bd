"""PyTorch's GradScaler by its names.

Loops from PyTorch's "Automatic Mixed Precision examples" page, ported by changing the
imports, train a float32 model to the same bits as the loop without a scaler and skip
an injected overflow exactly; the scale follows PyTorch's update rule as its source
states it; the state dict is PyTorch's; misuse gets PyTorch's errors.
"""

import math
import warnings

import numpy as np
import paddle
import pytest
from counters import HostReadCounter
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import GradScaler as PaddleStyleGradScaler
from paddle_amp_scaler.compat.torch import GradScaler

from helpers import (
    GradInjector,
    assert_arrays_equal,
    batches,
    loss_of,
    make_model,
    optimizer_state_of,
    params_of,
)

# The ported loops keep their auto_cast(), which Paddle makes a no-op on a CPU, saying so.
pytestmark = pytest.mark.filterwarnings("ignore:amp_guard can only be enabled")


class TorchRule:
    """PyTorch's ``_amp_update_scale_`` as its kernels state it, in float32."""

    def __init__(self, init_scale, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale = np.float32(init_scale)
        self.growth_factor = np.float32(growth_factor)
        self.backoff_factor = np.float32(backoff_factor)
        self.growth_interval = growth_interval
        self.growth_tracker = 0

    def update(self, found_inf):
        if found_inf:
            self.scale = self.scale * self.backoff_factor
            self.growth_tracker = 0
            return
        successful = self.growth_tracker + 1
        if successful == self.growth_interval:
            with np.errstate(over="ignore"):
                grown = self.scale * self.growth_factor
            if np.isfinite(grown):
                self.scale = grown
            self.growth_tracker = 0
        else:
            self.growth_tracker = successful


def sgd(model):
    return paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())


def adam(model):
    return paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())


# -- PyTorch's example loops, each with and without the scaler ---------------------------


def backward(scaler, loss, **kwargs):
    (loss if scaler is None else scaler.scale(loss)).backward(**kwargs)


def optimizer_step(scaler, optimizer):
    """``optimizer.step()``, or with a scaler its ``step`` and the ``update`` that ends
    the iteration."""
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()


def typical_loop(scaler, make_optimizer, injector_at=None):
    """The page's "Typical Mixed Precision Training" loop."""
    model = make_model()
    optimizer = make_optimizer(model)
    injector = GradInjector(model[0].weight)
    for index, batch in enumerate(batches(steps=6)):
        optimizer.clear_grad()
        with paddle.amp.auto_cast(), injector.inject(math.inf if index == injector_at else None):
            backward(scaler, loss_of(model, batch))
        optimizer_step(scaler, optimizer)
    return params_of(model), optimizer_state_of(optimizer, model.parameters())


def clipping_loop(scaler):
    """ "Gradient clipping": unscale_, clip the true gradients, then step."""
    model = make_model()
    optimizer = adam(model)
    for batch in batches(steps=6):
        optimizer.clear_grad()
        backward(scaler, loss_of(model, batch))
        if scaler is not None:
            scaler.unscale_(optimizer)
        paddle.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer_step(scaler, optimizer)
    return params_of(model), optimizer_state_of(optimizer, model.parameters())


def accumulation_loop(scaler, iters_to_accumulate=2):
    """ "Gradient accumulation": step every few micro-batches."""
    model = make_model()
    optimizer = sgd(model)
    for i, batch in enumerate(batches(steps=6)):
        backward(scaler, loss_of(model, batch) / iters_to_accumulate)
        if (i + 1) % iters_to_accumulate == 0:
            optimizer_step(scaler, optimizer)
            optimizer.clear_grad()
    return params_of(model), optimizer_state_of(optimizer, model.parameters())


def two_optimizers_loop(scaler):
    """ "Working with Multiple Models, Losses, and Optimizers": one update() for both."""
    model0, model1 = make_model(seed=0), make_model(seed=1)
    optimizer0, optimizer1 = adam(model0), sgd(model1)
    for batch in batches(steps=6):
        optimizer0.clear_grad()
        optimizer1.clear_grad()
        output0, output1 = model0(batch[0]), model1(batch[0])
        loss0 = paddle.nn.functional.mse_loss(2 * output0 + 3 * output1, batch[1])
        loss1 = paddle.nn.functional.mse_loss(3 * output0 - 5 * output1, batch[1])
        backward(scaler, loss0, retain_graph=True)
        backward(scaler, loss1)
        if scaler is None:
            optimizer0.step()
            optimizer1.step()
        else:
            scaler.unscale_(optimizer0)
            scaler.step(optimizer0)
            scaler.step(optimizer1)
            scaler.update()
    return params_of(model0) + params_of(model1)


def a_scaler(**kwargs):
    # Powers of two scale and unscale exactly; growth_interval=2 changes the scale
    # during the run, also exactly.
    return GradScaler("cpu", init_scale=2.0**12, growth_interval=2, **kwargs)


@pytest.mark.parametrize("make_optimizer", [sgd, adam])
def test_typical_loop_trains_as_without_a_scaler(make_optimizer):
    scaler = a_scaler()
    plain = typical_loop(None, make_optimizer)
    scaled = typical_loop(scaler, make_optimizer)
    assert_arrays_equal(scaled[0], plain[0])
    assert_arrays_equal(scaled[1], plain[1])
    assert scaler.get_scale() == 2.0**15


@pytest.mark.parametrize(
    "loop", [clipping_loop, accumulation_loop, two_optimizers_loop], ids=lambda f: f.__name__
)
def test_example_loops_train_as_without_a_scaler(loop):
    plain = loop(None)
    scaled = loop(a_scaler())
    if isinstance(plain, tuple):
        assert_arrays_equal(scaled[0], plain[0])
        assert_arrays_equal(scaled[1], plain[1])
    else:
        assert_arrays_equal(scaled, plain)


@pytest.mark.parametrize("make_optimizer", [sgd, adam])
def test_an_overflow_step_is_skipped_exactly(make_optimizer):
    # Training with an overflow at step 3 equals training that never saw batch 3.
    def without_step(skipped):
        model = make_model()
        optimizer = make_optimizer(model)
        for step, batch in enumerate(batches(steps=6)):
            if step != skipped:
                loss_of(model, batch).backward()
                optimizer.step()
                optimizer.clear_grad()
        return params_of(model), optimizer_state_of(optimizer, model.parameters())

    scaler = GradScaler("cpu", init_scale=2.0**12, growth_interval=100)
    scaled = typical_loop(scaler, make_optimizer, injector_at=3)
    reference = without_step(3)
    assert_arrays_equal(scaled[0], reference[0])
    assert_arrays_equal(scaled[1], reference[1])
    assert scaler.get_scale() == 2.0**11
    assert scaler.state_dict()["_growth_tracker"] == 2


# -- the update rule ------------------------------------------------------------------


def run_schedule(scaler, overflows):
    """One SGD step per entry of ``overflows``; True writes inf into a gradient."""
    model = make_model()
    optimizer = sgd(model)
    injector = GradInjector(model[0].weight)
    observed = []
    for overflow, batch in zip(overflows, batches(steps=len(overflows))):
        with injector.inject(math.inf if overflow else None):
            scaler.scale(loss_of(model, batch)).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        observed.append((scaler.get_scale(), scaler.state_dict()["_growth_tracker"]))
    return observed


def expected_schedule(rule, overflows):
    expected = []
    for overflow in overflows:
        rule.update(overflow)
        expected.append((float(rule.scale), rule.growth_tracker))
    return expected


@settings(max_examples=25, deadline=None)
@given(
    overflows=st.lists(st.booleans(), min_size=1, max_size=14),
    interval=st.integers(1, 4),
    factors=st.sampled_from([(2.0, 0.5), (4.0, 0.25), (3.0, 0.5), (2.0, 0.75)]),
)
def test_scale_follows_pytorch_rule(overflows, interval, factors):
    # From 2**30, fourteen back-offs, even by 0.25, stay above 1.0, where ours and
    # PyTorch's agree; fourteen growths, even by 4, stay within float32.
    growth, backoff = factors
    scaler = GradScaler(
        "cpu",
        init_scale=2.0**30,
        growth_factor=growth,
        backoff_factor=backoff,
        growth_interval=interval,
    )
    rule = TorchRule(2.0**30, growth, backoff, interval)
    assert run_schedule(scaler, overflows) == expected_schedule(rule, overflows)


def test_scale_never_falls_below_one_where_pytorch_would():
    # A documented difference: PyTorch would go on to 0.5 and 0.25.
    scaler = GradScaler("cpu", init_scale=2.0)
    assert [scale for scale, _ in run_schedule(scaler, [True, True, True])] == [1.0, 1.0, 1.0]


def test_update_with_new_scale_sets_it_and_keeps_the_tracker():
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=3)
    rule = TorchRule(8.0, growth_interval=3)
    assert run_schedule(scaler, [False]) == expected_schedule(rule, [False])
    scaler.update(1024.0)
    assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == (1024.0, 1)
    counter = HostReadCounter()
    with counter.counting():
        scaler.update(paddle.to_tensor([64.0]))  # copied on the device, not read
    assert counter.total() == 0, counter.where
    assert scaler.get_scale() == 64.0
    # The iteration ended and a new one may step; the rule goes on from the new scale.
    rule.scale = np.float32(64.0)
    assert run_schedule(scaler, [False, False]) == expected_schedule(rule, [False, False])


def test_update_with_new_scale_keeps_to_the_scalers_bounds():
    # PyTorch has no bounds; this scaler has, and a scale set by hand keeps to them too:
    # a number outside is refused before anything changes, a tensor (which checking
    # would read) is clamped into them on the device.
    scaler = GradScaler("cpu", init_scale=8.0, max_loss_scaling=256.0)
    for outside in (0.5, 512.0):
        with pytest.raises(ValueError, match="new_scale .* must lie within"):
            scaler.update(outside)
        assert scaler.get_scale() == 8.0
    for asked, clamped in ((0.25, 1.0), (4096.0, 256.0), (16.0, 16.0)):
        counter = HostReadCounter()
        with counter.counting():
            scaler.update(paddle.to_tensor([asked]))
        assert counter.total() == 0, counter.where
        assert scaler.get_scale() == clamped


def test_update_with_new_scale_still_counts_the_iteration():
    scaler = GradScaler("cpu", init_scale=8.0)
    run_schedule(scaler, [True])
    model = make_model()
    optimizer = sgd(model)
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    scaler.step(optimizer)
    scaler.update(2.0)
    stats = scaler.stats()
    assert (stats.iterations, stats.skipped, stats.scale) == (2, 1, 2.0)


# -- reads, return values, disabled -------------------------------------------------------


@pytest.mark.parametrize(("make_optimizer", "paddle_reads"), [(sgd, 0), (adam, 1)])
def test_host_reads_are_the_core_figures(make_optimizer, paddle_reads):
    model = make_model()
    optimizer = make_optimizer(model)
    injector = GradInjector(model[0].weight)
    scaler = a_scaler()
    counter = HostReadCounter()
    for step, batch in enumerate(batches(steps=3)):
        loss = loss_of(model, batch)
        with counter.counting(), injector.inject(math.inf if step == 1 else None):
            scaler.scale([loss, (loss,)])[1][0].backward()
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            optimizer.clear_grad()
    assert counter.reads["scaler"] == 0, counter.where
    assert counter.total() == 3 * paddle_reads, counter.where


class HandMadeSGD:
    """An optimizer of the user's own that takes no found-inf flag and returns a value."""

    def __init__(self, model):
        self._parameter_list = list(model.parameters())

    def step(self, scale=1.0):
        with paddle.no_grad():
            for param in self._parameter_list:
                param.set_value(param - 0.05 * scale * param.grad)
        return "stepped"


def test_step_returns_what_the_optimizer_returned_and_none_when_skipped():
    model = make_model()
    optimizer = HandMadeSGD(model)
    injector = GradInjector(model[0].weight)
    scaler = a_scaler()
    results = []
    for step, batch in enumerate(batches(steps=2)):
        with injector.inject(math.inf if step == 1 else None):
            scaler.scale(loss_of(model, batch)).backward()
        results.append(scaler.step(optimizer, scale=0.5))
        scaler.update()
        model.clear_gradients()
    assert results == ["stepped", None]


class ReportingAdam(paddle.optimizer.Adam):
    """A Paddle optimizer, so it takes the found-inf flag, whose step returns a value."""

    def step(self):
        super().step()
        return "stepped"


def test_a_flag_taking_optimizer_that_returns_a_value_gives_none_when_skipped():
    # Such an optimizer is called even when it skips (it reads the flag itself);
    # PyTorch's step() returns None for a skipped step all the same.
    model = make_model()
    optimizer = ReportingAdam(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = a_scaler()
    results = []
    for step, batch in enumerate(batches(steps=3)):
        with injector.inject(math.inf if step == 1 else None):
            scaler.scale(loss_of(model, batch)).backward()
        results.append(scaler.step(optimizer))
        scaler.update()
        optimizer.clear_grad()
    assert results == ["stepped", None, "stepped"]


def test_scale_keeps_the_structure_of_its_outputs():
    scaler = GradScaler("cpu", init_scale=4.0)
    x, y = paddle.to_tensor([1.0, -2.0]), paddle.to_tensor(3.0)
    scaled = scaler.scale([x, (y, [x])])
    assert isinstance(scaled, list) and isinstance(scaled[1], tuple)
    np.testing.assert_array_equal(scaled[0].numpy(), [4.0, -8.0])
    np.testing.assert_array_equal(scaled[1][0].numpy(), 12.0)
    np.testing.assert_array_equal(scaled[1][1][0].numpy(), [4.0, -8.0])


def test_a_gpu_device_without_a_gpu_warns_and_disables_as_pytorch_does():
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.warns(UserWarning, match="'cuda' is not available.*disabled"):
        scaler = GradScaler("cuda")
    model = make_model()
    optimizer = sgd(model)
    loss = loss_of(model, batches(steps=1)[0])
    assert scaler.scale(loss) is loss
    loss.backward()
    before = params_of(model)
    assert scaler.step(optimizer) is None
    scaler.update()
    assert not np.array_equal(params_of(model)[0], before[0])
    assert (scaler.is_enabled(), scaler.get_scale(), scaler.state_dict()) == (False, 1.0, {})


@pytest.mark.parametrize(("device", "expected"), [(None, "cpu"), ("cpu", "cpu"), ("CPU", "cpu")])
def test_device_names(device, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler = GradScaler(device)
    assert scaler.is_enabled()
    assert str(scaler._scale.place).lower().startswith(f"place({expected}")


# -- state_dict -------------------------------------------------------------------------


def test_state_dict_has_pytorchs_five_keys_as_python_numbers():
    schedule = [False, False, True, False]
    scaler = GradScaler("cpu", init_scale=256.0, growth_factor=4.0, growth_interval=3)
    run_schedule(scaler, schedule)
    rule = TorchRule(256.0, growth_factor=4.0, growth_interval=3)
    expected_schedule(rule, schedule)
    state = scaler.state_dict()
    assert state == {
        "scale": float(rule.scale),
        "growth_factor": 4.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "_growth_tracker": rule.growth_tracker,
    }
    assert [type(state[key]) for key in state] == [float, float, float, int, int]


@pytest.mark.parametrize("into", [GradScaler, PaddleStyleGradScaler])
def test_state_dict_resumes_in_either_scaler(into):
    schedule = [False, True, False, False, False, True, False, False]
    whole = GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    run_schedule(whole, schedule)
    first = GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    run_schedule(first, schedule[:3])
    resumed = into()
    resumed.load_state_dict(first.state_dict())
    model = make_model()
    optimizer = sgd(model)
    injector = GradInjector(model[0].weight)
    for overflow, batch in zip(schedule[3:], batches(steps=len(schedule) - 3)):
        with injector.inject(math.inf if overflow else None):
            resumed.scale(loss_of(model, batch)).backward()
        resumed.step(optimizer)
        resumed.update()
        optimizer.clear_grad()
    # Both faces have Paddle's getters; the resumed run ends where the whole run did.
    assert (resumed.get_loss_scaling(), resumed.get_incr_count()) == (
        whole.get_loss_scaling(),
        whole.get_incr_count(),
    )
    assert resumed.get_incr_every_n_steps() == 2


def test_state_dict_of_a_disabled_scaler_is_empty_and_cannot_be_loaded_into_an_enabled_one():
    assert GradScaler(enabled=False).state_dict() == {}
    with pytest.raises(RuntimeError, match="empty"):
        GradScaler("cpu").load_state_dict({})


def test_a_paddle_state_dict_that_is_not_pytorchs_rule_is_refused_unchanged():
    paddle_style = PaddleStyleGradScaler(
        init_loss_scaling=512.0, decr_every_n_nan_or_inf=2
    ).state_dict()
    scaler = GradScaler("cpu", init_scale=8.0)
    before = scaler.state_dict()
    with pytest.raises(ValueError, match="backs off after 2 overflows"):
        scaler.load_state_dict(paddle_style)
    assert scaler.state_dict() == before
    paddle_style["decr_every_n_nan_or_inf"] = 1
    scaler.load_state_dict(paddle_style)
    assert scaler.get_scale() == 512.0


# -- misuse -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"device": "tpu"}, ValueError, "device must be one of"),
        ({"device": 0}, TypeError, "device must be a string"),
        ({"init_scale": 0.0}, ValueError, "init_scale"),
        ({"init_scale": "big"}, TypeError, "init_scale"),
        ({"growth_factor": 1.0}, ValueError, "growth_factor"),
        ({"backoff_factor": 1.0}, ValueError, "backoff_factor"),
        ({"growth_interval": 0}, ValueError, "growth_interval"),
        ({"growth_interval": 2.5}, TypeError, "growth_interval"),
        ({"enabled": "yes"}, TypeError, "enabled"),
        ({"no_such_option": 1.0}, TypeError, "no_such_option"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradScaler(**kwargs)


@pytest.mark.parametrize(
    ("setter", "value", "error"),
    [
        ("set_growth_factor", 0.5, ValueError),
        ("set_backoff_factor", 2.0, ValueError),
        ("set_growth_interval", 0, ValueError),
        ("set_growth_interval", 1.5, TypeError),
    ],
)
def test_bad_setter_values_name_the_argument(setter, value, error):
    scaler = GradScaler("cpu")
    name = "new_interval" if "interval" in setter else "new_factor"
    with pytest.raises(error, match=name):
        getattr(scaler, setter)(value)


def test_the_core_scalers_options_pass_through():
    scaler = GradScaler(
        "cpu", init_scale=8.0, growth_interval=1, max_loss_scaling=8.0, stuck_after=3
    )
    assert run_schedule(scaler, [False] * 4)[-1][0] == 8.0  # held at the ceiling
    assert scaler.stats().iterations == 4


def test_setters_and_getters_round_trip():
    scaler = GradScaler("cpu")
    scaler.set_growth_factor(3.0)
    scaler.set_backoff_factor(0.25)
    scaler.set_growth_interval(7)
    assert (
        scaler.get_growth_factor(),
        scaler.get_backoff_factor(),
        scaler.get_growth_interval(),
    ) == (3.0, 0.25, 7)


@pytest.mark.parametrize(
    ("new_scale", "error", "match"),
    [
        (-1.0, ValueError, "new_scale"),
        ("2", TypeError, "new_scale"),
        ([2.0], TypeError, "new_scale"),
    ],
)
def test_bad_new_scale(new_scale, error, match):
    with pytest.raises(error, match=match):
        GradScaler("cpu").update(new_scale)


@pytest.mark.parametrize(
    "tensor", [paddle.to_tensor([1.0, 2.0]), paddle.to_tensor([4], dtype="int32")]
)
def test_bad_new_scale_tensor(tensor):
    with pytest.raises(ValueError, match="one-element floating-point Tensor"):
        GradScaler("cpu").update(tensor)


def test_closure_is_refused_with_what_to_do_instead():
    model = make_model()
    scaler = a_scaler()
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    with pytest.raises(RuntimeError, match="closure.*scaler.scale\\(loss\\).backward"):
        scaler.step(sgd(model), closure=lambda: None)


def test_scale_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match="scale\\(\\) takes a Tensor.*as outputs, found a float"):
        GradScaler("cpu").scale([paddle.to_tensor(1.0), 2.0])


def test_misordered_calls_say_what_to_call():
    model = make_model()
    optimizer = sgd(model)
    scaler = a_scaler()
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="at most once"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="call scaler.update"):
        scaler.step(optimizer)
    scaler.update()
    with pytest.raises(RuntimeError, match="prior to update.*call scaler.step"):
        scaler.update()
