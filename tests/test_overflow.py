"""A step with inf/nan gradients changes nothing: parameters and every accumulator stay
bit-for-bit as they were; several optimizers each skip on their own verdict."""

import math

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler
from paddle_amp_scaler.testing import emulate_fp16_grads

from helpers import (
    GradInjector,
    batches,
    loss_of,
    make_model,
    optimizer_state_of,
    oracle_skipped,
    paddle_oracle,
    params_of,
    train_step,
)
from test_training_equivalence import OPTIMIZERS


def snapshot(model, optimizer):
    return params_of(model), optimizer_state_of(optimizer, model.parameters())


def assert_unchanged(before, after):
    for old, new in zip(before[0], after[0]):
        np.testing.assert_array_equal(new, old)
    assert before[1].keys() == after[1].keys()
    for key in before[1]:
        np.testing.assert_array_equal(after[1][key], before[1][key], err_msg=key)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("api", ["step_update", "minimize"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_overflow_step_changes_nothing(name, api, value):
    model = make_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = GradScaler(init_loss_scaling=2.0**10)
    data = batches(steps=4)

    # Two real steps first, so that accumulators exist and are non-trivial.
    train_step(scaler, model, optimizer, data[0], api)
    train_step(scaler, model, optimizer, data[1], api)
    before = snapshot(model, optimizer)
    train_step(scaler, model, optimizer, data[2], api, injector, inject=value)
    assert_unchanged(before, snapshot(model, optimizer))
    assert scaler.get_loss_scaling() == 2.0**9
    assert bool(scaler._cache_found_inf)
    # The run goes on normally afterwards.
    train_step(scaler, model, optimizer, data[3], api)
    assert not bool(scaler._cache_found_inf)
    assert any(not np.array_equal(a, b) for a, b in zip(before[0], params_of(model)))


def test_fp16_emulated_overflow_backs_off_until_grads_fit():
    model = make_model()
    emulate_fp16_grads(model)
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
    # Gradients of order 1 times 2**24 cannot fit in float16 (max 65504).
    scaler = GradScaler(init_loss_scaling=2.0**24)
    skipped = []
    for batch in batches(steps=12):
        train_step(scaler, model, optimizer, batch)
        skipped.append(bool(scaler._cache_found_inf))
    assert skipped[0] and not skipped[-1]
    first_good = skipped.index(False)
    assert not any(skipped[first_good:])
    assert scaler.get_loss_scaling() == 2.0 ** (24 - first_good)


def test_each_optimizer_skips_on_its_own_verdict_and_update_sees_all():
    first, second = make_model(seed=1), make_model(seed=2)
    opt_first = paddle.optimizer.Adam(learning_rate=0.01, parameters=first.parameters())
    opt_second = paddle.optimizer.Momentum(learning_rate=0.05, parameters=second.parameters())
    injector = GradInjector(second[0].weight)
    scaler = GradScaler(init_loss_scaling=2.0**10)
    batch = batches(steps=1)[0]
    first_before, second_before = params_of(first), params_of(second)

    with injector.inject(math.inf):
        scaler.scale(loss_of(first, batch) + loss_of(second, batch)).backward()
    # Unscale both before stepping either: Paddle's scaler would step the first with
    # the second's verdict.
    scaler.unscale_(opt_first)
    scaler.unscale_(opt_second)
    scaler.step(opt_first)
    scaler.step(opt_second)
    scaler.update()

    assert all(not np.array_equal(a, b) for a, b in zip(first_before, params_of(first)))
    for old, new in zip(second_before, params_of(second)):
        np.testing.assert_array_equal(new, old)
    assert scaler.get_loss_scaling() == 2.0**9


def test_update_backs_off_when_only_the_first_of_two_optimizers_overflowed():
    first, second = make_model(seed=1), make_model(seed=2)
    opt_first = paddle.optimizer.SGD(learning_rate=0.1, parameters=first.parameters())
    opt_second = paddle.optimizer.SGD(learning_rate=0.1, parameters=second.parameters())
    injector = GradInjector(first[0].weight)
    scaler = GradScaler(init_loss_scaling=2.0**10)
    batch = batches(steps=1)[0]
    with injector.inject(math.nan):
        scaler.scale(loss_of(first, batch) + loss_of(second, batch)).backward()
    scaler.step(opt_first)
    scaler.step(opt_second)
    scaler.update()
    assert scaler.get_loss_scaling() == 2.0**9
    assert scaler.get_decr_count() == 0 and scaler.get_incr_count() == 0


def test_plain_sgd_skip_by_zeroed_grads_is_bit_exact_including_signed_zero_and_nan():
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    # Parameters holding -0.0, tiny subnormals and nan must come out bit-identical.
    weight = model[0].weight
    values = weight.numpy()
    values[0, :3] = [-0.0, np.float32(1e-45), np.nan]
    weight.set_value(values)
    before = [p.numpy().view(np.uint32).copy() for p in model.parameters()]
    injector = GradInjector(model[2].weight)
    scaler = AmpScaler(init_loss_scaling=2.0**10)
    with injector.inject(math.inf):
        scaled = scaler.scale(loss_of(model, batches(steps=1)[0]))
        scaled.backward()
    scaler.minimize(optimizer, scaled)
    for old, param in zip(before, model.parameters()):
        np.testing.assert_array_equal(param.numpy().view(np.uint32), old)


def test_fp16_emulation_rounds_like_float16_and_can_be_removed():
    model = paddle.nn.Linear(1, 1, bias_attr=False)
    model.weight.set_value(np.ones((1, 1), dtype="float32"))
    handles = emulate_fp16_grads(model)
    for x, expected in ((70000.0, np.inf), (1e-8, 0.0), (1.0 + 2**-12, 1.0)):
        model(paddle.to_tensor([[x]])).sum().backward()
        assert model.weight.grad.numpy()[0, 0] == np.float32(expected)
        model.clear_gradients()
    for handle in handles:
        handle.remove()
    model(paddle.to_tensor([[70000.0]])).sum().backward()
    assert model.weight.grad.numpy()[0, 0] == 70000.0


def test_a_skipped_step_leaves_no_flag_behind_in_the_optimizer():
    model = make_model()
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = GradScaler(init_loss_scaling=2.0**10)
    batch = batches(steps=1)[0]
    train_step(scaler, model, optimizer, batch, injector=injector, inject=math.inf)
    assert bool(scaler._cache_found_inf)
    before = params_of(model)
    # Later training without the scaler must not inherit the skip.
    train_step(None, model, optimizer, batch)
    assert all(not np.array_equal(a, b) for a, b in zip(before, params_of(model)))


@pytest.mark.parametrize("value", [math.inf, 1.0])
def test_a_frozen_parameters_gradient_is_checked_as_paddles_scaler_checks_it(monkeypatch, value):
    """A parameter frozen after backward keeps its gradient; Paddle's optimizers leave it
    alone, and Paddle's scaler still checks it. Ours decides as Paddle's does."""
    decisions = []
    for scaler in (
        GradScaler(init_loss_scaling=2.0**10),
        paddle_oracle(monkeypatch, init_loss_scaling=2.0**10),
    ):
        model = make_model()
        optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
        frozen = model[2].bias
        frozen.grad = paddle.full_like(frozen.grad, value)
        frozen.stop_gradient = True
        scaler.step(optimizer)
        scaler.update()
        decisions.append((oracle_skipped(scaler), float(scaler._scale.numpy().reshape(-1)[0])))
    overflowed = value == math.inf
    assert decisions == [(overflowed, 2.0**9 if overflowed else 2.0**10)] * 2
