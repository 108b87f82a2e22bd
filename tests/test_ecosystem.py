"""Drop-in for Paddle's ecosystem: the private fields keep Paddle's meaning, and code
that replaces ``_unscale`` or trains with ``main_grad`` (Paddle's master-grad mode) works."""

import math
from types import MethodType

import numpy as np
import paddle
import pytest
from paddle import _C_ops, _legacy_C_ops
from paddle.amp.grad_scaler import OptimizerState

from paddle_amp_scaler import AmpScaler, GradScaler

from helpers import GradInjector, batches, loss_of, make_model, params_of, train_step


def test_private_fields_have_paddles_meaning():
    scaler = GradScaler(init_loss_scaling=1024.0)
    assert isinstance(scaler._scale, paddle.Tensor)
    assert scaler._scale.dtype == paddle.float32 and scaler._scale.shape == [1]
    assert scaler._enable is True and scaler._use_dynamic_loss_scaling is True
    assert scaler._temp_found_inf_value_false.dtype == paddle.bool
    assert not bool(scaler._temp_found_inf_value_false)
    assert not hasattr(scaler, "_cache_founf_inf")

    model = make_model()
    optimizer = paddle.optimizer.Adam(parameters=model.parameters())
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    assert scaler._optimizer_states[id(optimizer)]["state"] is OptimizerState.INIT
    scaler.unscale_(optimizer)
    assert scaler._optimizer_states[id(optimizer)]["state"] is OptimizerState.UNSCALED
    assert scaler._found_inf.dtype == paddle.bool and scaler._found_inf.shape == [1]
    scaler.step(optimizer)
    assert scaler._optimizer_states[id(optimizer)]["state"] is OptimizerState.STEPPED
    assert not scaler._cache_found_inf
    scaler.update()
    assert scaler._optimizer_states[id(optimizer)]["state"] is OptimizerState.INIT


def test_scale_updated_in_place_by_a_client_is_used():
    scaler = GradScaler(init_loss_scaling=1024.0)
    scaler._scale.fill_(64.0)
    loss = paddle.to_tensor(2.0)
    assert float(scaler.scale(loss)) == 128.0


def fleet_style_unscale(self, optimizer):
    """The shape of fleet's distributed_scaler replacement: Paddle's op, bool tensor."""
    if not self._enable:
        return
    grads = [p._grad_ivar() for p in optimizer._parameter_list if p._grad_ivar() is not None]
    found = paddle.to_tensor(np.array([0]).astype(np.bool_))
    _legacy_C_ops.check_finite_and_unscale(grads, self._scale, grads, found)
    self._found_inf = _C_ops.bitwise_or(self._temp_found_inf_value_false, found)
    self.replaced_calls += 1


@pytest.mark.parametrize("inject", [None, math.inf])
def test_a_replaced_unscale_takes_effect_in_step_and_minimize(inject):
    for api in ("step_update", "minimize"):
        model = make_model()
        optimizer = paddle.optimizer.Momentum(learning_rate=0.1, parameters=model.parameters())
        injector = GradInjector(model[0].weight)
        scaler = GradScaler(init_loss_scaling=2.0**10)
        scaler.replaced_calls = 0
        scaler._unscale = MethodType(fleet_style_unscale, scaler)
        before = params_of(model)
        train_step(scaler, model, optimizer, batches(steps=1)[0], api, injector, inject)
        assert scaler.replaced_calls == 1
        changed = [not np.array_equal(a, b) for a, b in zip(before, params_of(model))]
        assert all(changed) if inject is None else not any(changed)
        assert scaler.get_loss_scaling() == (2.0**10 if inject is None else 2.0**9)


def test_a_replaced_unscale_is_still_refused_twice():
    model = make_model()
    optimizer = paddle.optimizer.SGD(parameters=model.parameters())
    scaler = GradScaler()
    scaler.replaced_calls = 0
    scaler._unscale = MethodType(fleet_style_unscale, scaler)
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already"):
        scaler.unscale_(optimizer)


@pytest.fixture
def single_rank_hcg(monkeypatch):
    # MixPrecisionScaler asks fleet for the hybrid group; one process has none.
    from paddle.distributed import fleet

    monkeypatch.setattr(fleet, "get_hybrid_communicate_group", lambda: None)


def master_grad_run(scaler_wrapper, inject_on_steps, steps=4):
    """Paddle's MixPrecisionLayer/Optimizer: grads accumulate into param.main_grad."""
    from paddle.distributed.fleet.utils.mix_precision_utils import (
        MixPrecisionLayer,
        MixPrecisionOptimizer,
    )

    model = make_model()
    # The dtype is only checked: the layers stay float32, which the CPU can run.
    wrapped = MixPrecisionLayer(model, dtype="float16")
    optimizer = MixPrecisionOptimizer(
        paddle.optimizer.AdamW(learning_rate=0.01, parameters=wrapped.parameters())
    )
    scaler = scaler_wrapper(GradScaler(init_loss_scaling=2.0**10))
    history = []
    for step, batch in enumerate(batches(steps=steps)):
        loss = loss_of(wrapped, batch)
        if step in inject_on_steps:
            # An inf gradient for this one weight. (A gradient hook cannot be used here:
            # Paddle would accumulate its result into param.grad beside main_grad.)
            loss = loss + (model[0].weight * math.inf).sum()
        scaler.scale(loss).backward()
        assert all(p.main_grad is not None for p in model.parameters())
        before = params_of(model)
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        after = params_of(model)
        history.append((before, after, float(scaler._scale.numpy()[0])))
    return history


@pytest.mark.parametrize("wrapper", ["plain", "MixPrecisionScaler"])
def test_main_grad_is_unscaled_and_checked(single_rank_hcg, wrapper):
    from paddle.distributed.fleet.utils.mix_precision_utils import MixPrecisionScaler

    wrap = (lambda s: s) if wrapper == "plain" else MixPrecisionScaler
    history = master_grad_run(wrap, inject_on_steps={1})
    for step, (before, after, scale) in enumerate(history):
        changed = [not np.array_equal(a, b) for a, b in zip(before, after)]
        if step == 1:
            assert not any(changed), "an overflow in main_grad must skip the step"
            assert scale == 2.0**9
        else:
            assert all(changed)
        assert all(np.isfinite(p).all() for p in after)


def test_main_grad_training_equals_unscaled_master_grad_training(single_rank_hcg):
    scaled = master_grad_run(lambda s: s, inject_on_steps=set())
    unscaled = master_grad_run(lambda s: GradScaler(enable=False), inject_on_steps=set())
    for (_, ours, _), (_, reference, _) in zip(scaled, unscaled):
        for a, b in zip(ours, reference):
            np.testing.assert_array_equal(a, b)


def test_host_side_verdict_from_a_wrapper_skips_without_calling_the_optimizer():
    class CountingSGD(paddle.optimizer.SGD):
        calls = 0

        def step(self):
            CountingSGD.calls += 1
            super().step()

    model = make_model()
    optimizer = CountingSGD(learning_rate=0.1, parameters=model.parameters())
    scaler = AmpScaler()

    def int_verdict_unscale(self, opt):
        self._found_inf = 1  # what MixPrecisionScaler writes after an all-reduce

    scaler._unscale = MethodType(int_verdict_unscale, scaler)
    scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
    scale_before = scaler.get_loss_scaling()
    assert scaler.minimize(optimizer) == (None, None)
    assert CountingSGD.calls == 0 and scaler._cache_found_inf is True
    assert scaler.get_loss_scaling() == scale_before / 2


def test_paddles_own_scaler_misses_main_grad_overflow(single_rank_hcg, monkeypatch):
    # The contrast that makes the test above meaningful: Paddle's scaler checks only
    # .grad, which master-grad mode leaves empty, so the overflow reaches the weights.
    from helpers import paddle_oracle

    oracle = paddle_oracle(monkeypatch, init_loss_scaling=2.0**10)
    history = master_grad_run(lambda _: oracle, inject_on_steps={1}, steps=2)
    _, after_overflow, _ = history[1]
    assert not all(np.isfinite(p).all() for p in after_overflow)
