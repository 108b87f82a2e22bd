"""MindSpore's loss-scale names, over this package's scaler.

What this file proves about ``paddle_amp_scaler.compat.mindspore``:

* ``DynamicLossScaleManager.update_loss_scale`` follows MindSpore's host rule, written
  below as its source has it (``cur_iter`` / ``last_overflow_iter`` / ``bad_step``),
  over random and scripted overflow sequences, including the 1000/1001 consecutive
  overflow boundary; the fixed manager never changes its scale.
* ``get_update_cell()`` gives a fresh ``GradScaler`` with the manager's policy, which
  trains a float32 model to the bits of an unscaled run and skips an injected overflow
  exactly, its scale following the manager's rule.
* ``DynamicLossScaler.adjust`` follows ``mindspore.amp``'s select/modulo rule, for a
  Python bool and for the Tensor ``all_finite`` returns; ``StaticLossScaler`` never
  adjusts. The documented functional loop (``paddle.grad`` / ``unscale`` /
  ``all_finite`` / ``adjust``) trains to the bits of the same loop without a scaler and
  skips an overflow step exactly, without the scaler reading the device.
* ``scale``/``unscale``/``all_finite`` keep the structure of their inputs and compute
  what numpy computes; bad arguments get a ``TypeError``/``ValueError`` naming them.

Scales are powers of two throughout, so scaling and unscaling are exact and results can
be compared bit for bit with an unscaled run.
"""

import math
import warnings

import numpy as np
import paddle
import pytest
from counters import HostReadCounter
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import GradScaler, LossScaleStuckError
from paddle_amp_scaler.compat.mindspore import (
    DynamicLossScaleManager,
    DynamicLossScaler,
    FixedLossScaleManager,
    StaticLossScaler,
    all_finite,
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

# -- MindSpore's rules, as its sources state them ------------------------------------------


class ManagerRule:
    """``mindspore.DynamicLossScaleManager.update_loss_scale``: Python floats on the host,
    growth decided by the distance from the last overflow, not by a counter."""

    BAD_STEP_MAX = 1000

    def __init__(self, init_loss_scale, scale_factor, scale_window):
        self.loss_scale = init_loss_scale
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.cur_iter = 1
        self.last_overflow_iter = 0
        self.bad_step = 0

    def update_loss_scale(self, overflow):
        if overflow:
            # MindSpore keeps decrease_ratio = 1 / scale_factor and multiplies by it.
            self.loss_scale = max(self.loss_scale * (1 / self.scale_factor), 1)
            self.last_overflow_iter = self.cur_iter
            self.bad_step += 1
        else:
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                self.loss_scale *= self.scale_factor
            self.bad_step = 0
        if self.bad_step > self.BAD_STEP_MAX:
            raise RuntimeError("Dynamic loss scale Continuous overflow")
        self.cur_iter += 1


class AmpRule:
    """``mindspore.amp.DynamicLossScaler.adjust``: float32 Parameters, nested selects."""

    def __init__(self, scale_value, scale_factor, scale_window):
        self.scale_value = np.float32(scale_value)
        self.scale_factor = np.float32(scale_factor)
        self.scale_window = scale_window
        self.counter = 0

    def adjust(self, grads_finite):
        with np.errstate(over="ignore"):
            scale_mul_factor = self.scale_value * self.scale_factor
        grown = scale_mul_factor if np.isfinite(scale_mul_factor) else self.scale_value
        at_window = self.counter == self.scale_window - 1
        if grads_finite:
            self.scale_value = grown if at_window else self.scale_value
        else:
            self.scale_value = np.maximum(np.float32(1), self.scale_value / self.scale_factor)
        self.counter = ((self.counter + 1) % self.scale_window) * int(grads_finite)
        return True


def manager_outcomes(update, overflows):
    """What each call of ``update`` did: "ok", or "raised" for a RuntimeError."""
    outcomes = []
    for overflow in overflows:
        try:
            update(overflow)
        except RuntimeError:
            outcomes.append("raised")
        else:
            outcomes.append("ok")
    return outcomes


# -- training helpers ------------------------------------------------------------------------


def sgd(model):
    return paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())


def adam(model):
    return paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())


def cell_loop(scaler, make_optimizer, overflow_at=None, value=math.inf, steps=7):
    """``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`` with the
    manager's cell; without a scaler, the plain loop that never sees batch
    ``overflow_at``. Returns (params, optimizer state, scale) after each step."""
    model = make_model()
    optimizer = make_optimizer(model)
    injector = GradInjector(model[0].weight)
    records = []
    for step, batch in enumerate(batches(steps=steps)):
        if scaler is None:
            if step != overflow_at:
                loss_of(model, batch).backward()
                optimizer.step()
        else:
            with injector.inject(value if step == overflow_at else None):
                scaler.scale(loss_of(model, batch)).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.clear_grad()
        scale = None if scaler is None else scaler.get_loss_scaling()
        records.append((params_of(model), optimizer_state_of(optimizer, model.parameters()), scale))
    return records


def apply_with_adam(model, optimizer, grads):
    optimizer.apply_gradients(list(zip(model.parameters(), grads)))


def apply_by_hand(model, optimizer, grads):
    with paddle.no_grad():
        for param, grad in zip(model.parameters(), grads):
            param.set_value(param - 0.05 * grad)


APPLY = {"adam_apply_gradients": apply_with_adam, "manual_sgd": apply_by_hand}


def poisoned(grads, value):
    # GradInjector's hook sits on the parameter (a leaf), and paddle.grad runs no leaf
    # hooks (Paddle 2.6 and 3.x alike): write the inf/nan into the returned gradient.
    return [paddle.full_like(grads[0], value), *grads[1:]]


def functional_loop(loss_scaler, apply, poison_at=None, value=math.inf, steps=6):
    """The documented ``mindspore.amp`` loop, names changed to Paddle's; without a
    scaler, the same loop unscaled that never sees batch ``poison_at``. Returns
    (params, optimizer state, scale, counter) after each step."""
    model = make_model()
    params = list(model.parameters())
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=params)
    records = []
    for step, batch in enumerate(batches(steps=steps)):
        loss = loss_of(model, batch)
        if loss_scaler is None:
            if step != poison_at:
                apply(model, optimizer, paddle.grad(loss, params))
        else:
            grads = paddle.grad(loss_scaler.scale(loss), params)
            if step == poison_at:
                grads = poisoned(grads, value)
            grads = loss_scaler.unscale(grads)
            finite = all_finite(grads)
            if finite:  # the caller's read
                apply(model, optimizer, grads)
            loss_scaler.adjust(finite)
        state = (
            (None, None)
            if loss_scaler is None
            else (float(loss_scaler.scale_value), int(loss_scaler.counter))
        )
        records.append((params_of(model), optimizer_state_of(optimizer, params), *state))
    return records


# -- DynamicLossScaleManager.update_loss_scale ----------------------------------------------


def manager_scales(manager, overflows):
    scales = []
    for overflow in overflows:
        manager.update_loss_scale(overflow)
        scales.append(manager.get_loss_scale())
    return scales


def rule_scales(rule, overflows):
    scales = []
    for overflow in overflows:
        rule.update_loss_scale(overflow)
        scales.append(rule.loss_scale)
    return scales


@settings(max_examples=30, deadline=None)
@given(
    overflows=st.lists(st.booleans(), min_size=1, max_size=30),
    window=st.integers(1, 5),
    factor=st.sampled_from([2, 4]),
)
def test_manager_follows_mindspores_rule(overflows, window, factor):
    # From 2**20, thirty steps stay inside float32 (where ours refuses to grow) and the
    # floor at 1 is reached often enough with factor 4.
    manager = DynamicLossScaleManager(
        init_loss_scale=2.0**20, scale_factor=factor, scale_window=window
    )
    rule = ManagerRule(2.0**20, factor, window)
    assert manager_scales(manager, overflows) == rule_scales(rule, overflows)


@pytest.mark.parametrize("factor", [3, 1.5, 10])
def test_manager_keeps_mindspores_python_floats(factor):
    # MindSpore's manager holds a Python float on the host: no float32 round trip, so a
    # factor that is no power of two gives MindSpore's own digits.
    overflows = [True, False, False, True, True, False, False, False]
    manager = DynamicLossScaleManager(init_loss_scale=10.0, scale_factor=factor, scale_window=2)
    scales = manager_scales(manager, overflows)
    assert scales == rule_scales(ManagerRule(10.0, factor, 2), overflows)
    assert all(type(scale) is float for scale in scales)
    if factor == 3:
        assert scales[0] == 10.0 * (1 / 3) == 3.333333333333333


def test_manager_scripted_schedule():
    # Worked by hand from the rule, window 2: growth at the 2nd, 4th, ... finite step
    # after the last overflow.
    overflows = [False, False, True, False, False, False, False, True, True]
    by_hand = [2**10, 2**11, 2**10, 2**10, 2**11, 2**11, 2**12, 2**11, 2**10]
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_factor=2, scale_window=2)
    assert rule_scales(ManagerRule(2**10, 2, 2), overflows) == by_hand
    assert manager_scales(manager, overflows) == by_hand


def test_manager_floors_the_scale_at_one():
    manager = DynamicLossScaleManager(init_loss_scale=3.0, scale_factor=2, scale_window=4)
    overflows = [True, True, True, False, False, False, False]
    assert manager_scales(manager, overflows) == rule_scales(ManagerRule(3.0, 2, 4), overflows)


def test_more_than_1000_consecutive_overflows_raise():
    # 1000 overflows pass; a finite step resets the count, so 1000 more pass; the
    # 1001st raises, and so does the next one.
    overflows = [True] * 1000 + [False] + [True] * 1002
    manager = DynamicLossScaleManager(init_loss_scale=2**20, scale_factor=2, scale_window=5)
    rule = ManagerRule(2**20, 2, 5)
    observed = manager_outcomes(manager.update_loss_scale, overflows)
    expected = manager_outcomes(rule.update_loss_scale, overflows)
    assert expected == ["ok"] * 2001 + ["raised"] * 2  # the reference holds the boundary
    assert observed == expected
    assert manager.get_loss_scale() == rule.loss_scale


def test_the_1001st_overflow_raises_without_a_finite_step_between():
    manager = DynamicLossScaleManager(init_loss_scale=2**20, scale_factor=2, scale_window=5)
    assert manager_outcomes(manager.update_loss_scale, [True] * 1001) == ["ok"] * 1000 + ["raised"]


def test_the_raising_call_has_already_reduced_the_scale():
    # A factor close to 1 keeps the scale above the floor after 1000 back-offs, so the
    # 1001st back-off can be seen: 2**20 / 1.01**1000 is about 50.
    manager = DynamicLossScaleManager(init_loss_scale=2**20, scale_factor=1.01, scale_window=5)
    for _ in range(1000):
        manager.update_loss_scale(True)
    before = manager.get_loss_scale()
    with pytest.raises(RuntimeError, match="consecutive overflows"):
        manager.update_loss_scale(True)
    assert before > 1
    assert manager.get_loss_scale() == pytest.approx(before / 1.01, rel=1e-6)


def test_fixed_manager_never_changes_its_scale():
    manager = FixedLossScaleManager(loss_scale=2**7)
    for overflow in [True, False, True, True, False]:
        manager.update_loss_scale(overflow)
        assert manager.get_loss_scale() == 2**7
    assert manager.get_drop_overflow_update() is True
    defaults = FixedLossScaleManager()
    assert (defaults.get_loss_scale(), defaults.get_drop_overflow_update()) == (128.0, True)


def test_dynamic_manager_defaults_and_getters():
    manager = DynamicLossScaleManager()
    assert manager.get_loss_scale() == 2.0**24
    assert manager.get_drop_overflow_update() is True
    cell = manager.get_update_cell()
    assert (cell.get_incr_ratio(), cell.get_incr_every_n_steps()) == (2.0, 2000)


# -- get_update_cell -------------------------------------------------------------------------


def one_cell_step(cell, overflow):
    model = make_model(depth=1)
    optimizer = sgd(model)
    injector = GradInjector(model[0].weight)
    with injector.inject(math.inf if overflow else None):
        cell.scale(loss_of(model, batches(steps=1)[0])).backward()
    cell.step(optimizer)
    cell.update()


def test_get_update_cell_gives_a_new_scaler_with_the_managers_policy():
    # Factor 4 and window 3 differ from GradScaler's defaults, so each getter can fail.
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_factor=4, scale_window=3)
    rule = ManagerRule(2**10, 4, 3)
    for overflow in (True, False):
        manager.update_loss_scale(overflow)
        rule.update_loss_scale(overflow)
    first, second = manager.get_update_cell(), manager.get_update_cell()
    assert isinstance(first, GradScaler) and isinstance(second, GradScaler)
    assert first is not second
    for cell in (first, second):
        assert cell.is_use_dynamic_loss_scaling()
        assert cell.get_loss_scaling() == rule.loss_scale
        assert cell.get_init_loss_scaling() == rule.loss_scale
        assert cell.get_incr_ratio() == 4.0
        assert cell.get_decr_ratio() == 0.25
        assert cell.get_incr_every_n_steps() == 3
        assert cell.get_decr_every_n_nan_or_inf() == 1
    # A new scaler each call: stepping one moves neither the other nor the manager.
    one_cell_step(first, overflow=True)
    assert first.get_loss_scaling() == rule.loss_scale / 4
    assert second.get_loss_scaling() == manager.get_loss_scale() == rule.loss_scale


def test_the_update_cell_gives_up_on_endless_overflows_as_mindspore_does():
    # MindSpore stops after more than 1000 consecutive overflows; the cell reads its
    # streak once every 100 iterations (API.md), so it stops at the first check past
    # 1000: iteration 1100.
    scaler = DynamicLossScaleManager(init_loss_scale=2.0**10, scale_window=2).get_update_cell()
    param = paddle.create_parameter([2], "float32")
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=[param])
    stopped_at = None
    for iteration in range(1, 1201):
        param.grad = paddle.full([2], math.inf)
        scaler.step(optimizer)
        try:
            scaler.update()
        except LossScaleStuckError:
            stopped_at = iteration
            break
    assert stopped_at == 1100
    assert scaler.stats().skip_streak == 1100


def test_fixed_manager_cell():
    cell = FixedLossScaleManager(loss_scale=2**7).get_update_cell()
    assert isinstance(cell, GradScaler)
    assert not cell.is_use_dynamic_loss_scaling()
    assert cell.get_loss_scaling() == 2**7
    assert FixedLossScaleManager(drop_overflow_update=False).get_update_cell() is None


# -- the manager's cell in a training loop ------------------------------------------------


@pytest.mark.parametrize("make_optimizer", [sgd, adam])
def test_cell_trains_as_without_a_scaler(make_optimizer):
    cell = DynamicLossScaleManager(
        init_loss_scale=2**10, scale_factor=2, scale_window=2
    ).get_update_cell()
    plain = cell_loop(None, make_optimizer)
    scaled = cell_loop(cell, make_optimizer)
    for (plain_params, plain_state, _), (params, state, _) in zip(plain, scaled):
        assert_arrays_equal(params, plain_params)
        assert_arrays_equal(state, plain_state)
    # Seven finite steps, window 2: the manager's rule grows three times.
    rule = ManagerRule(2**10, 2, 2)
    assert [scale for *_, scale in scaled] == rule_scales(rule, [False] * 7)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("make_optimizer", [sgd, adam])
def test_cell_skips_an_overflow_step_exactly(make_optimizer, value):
    cell = DynamicLossScaleManager(
        init_loss_scale=2**10, scale_factor=2, scale_window=2
    ).get_update_cell()
    scaled = cell_loop(cell, make_optimizer, overflow_at=2, value=value)
    # Nothing moved at step 2: parameters and accumulators as after step 1.
    assert_arrays_equal(scaled[2][0], scaled[1][0])
    assert_arrays_equal(scaled[2][1], scaled[1][1])
    # And the run as a whole is the unscaled run that never saw batch 2.
    reference = cell_loop(None, make_optimizer, overflow_at=2)
    assert_arrays_equal(scaled[-1][0], reference[-1][0])
    assert_arrays_equal(scaled[-1][1], reference[-1][1])
    overflows = [step == 2 for step in range(7)]
    assert [scale for *_, scale in scaled] == rule_scales(ManagerRule(2**10, 2, 2), overflows)


def test_fixed_manager_cell_skips_an_overflow_step_at_a_fixed_scale():
    cell = FixedLossScaleManager(loss_scale=2**7).get_update_cell()
    scaled = cell_loop(cell, adam, overflow_at=3)
    reference = cell_loop(None, adam, overflow_at=3)
    assert_arrays_equal(scaled[3][0], scaled[2][0])
    assert_arrays_equal(scaled[3][1], scaled[2][1])
    assert_arrays_equal(scaled[-1][0], reference[-1][0])
    assert_arrays_equal(scaled[-1][1], reference[-1][1])
    assert [scale for *_, scale in scaled] == [2**7] * 7


# -- mindspore.amp: adjust -------------------------------------------------------------------

# Each step: None for finite gradients, else the bad value; and whether grads_finite is
# handed over as a Python bool or as the Tensor all_finite returns.
STEPS = st.tuples(st.sampled_from([None, math.inf, -math.inf, math.nan]), st.booleans())


def grads_finite_flag(bad_value, as_tensor):
    if not as_tensor:
        return bad_value is None
    values = [1.0, 2.0] if bad_value is None else [1.0, bad_value]
    return all_finite([paddle.to_tensor(values)])


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(STEPS, min_size=1, max_size=25),
    window=st.integers(1, 4),
    factor=st.sampled_from([2, 4]),
    # 2**126 reaches float32's top, where a growth must be refused.
    init=st.sampled_from([1.0, 2.0**10, 2.0**126]),
)
def test_adjust_follows_mindspores_rule(steps, window, factor, init):
    loss_scaler = DynamicLossScaler(scale_value=init, scale_factor=factor, scale_window=window)
    rule = AmpRule(init, factor, window)
    for bad_value, as_tensor in steps:
        assert loss_scaler.adjust(grads_finite_flag(bad_value, as_tensor)) is True
        rule.adjust(bad_value is None)
        assert float(loss_scaler.scale_value) == float(rule.scale_value)
        assert int(loss_scaler.counter) == rule.counter


@settings(max_examples=12, deadline=None)
@given(
    finite=st.lists(st.booleans(), min_size=200, max_size=400),
    window=st.integers(1, 6),
    factor=st.sampled_from([2, 3, 5, 10]),
    init=st.sampled_from([100.0, 1000.0, 2.0**20, 7.0]),
)
def test_adjust_matches_mindspores_float32_arithmetic_at_any_factor(finite, window, factor, init):
    # MindSpore divides its float32 scale by the factor; a multiply by float32(1 / factor)
    # drifts from it at factors that are not powers of two.
    loss_scaler = DynamicLossScaler(scale_value=init, scale_factor=factor, scale_window=window)
    rule = AmpRule(init, factor, window)
    for step, grads_finite in enumerate(finite):
        loss_scaler.adjust(grads_finite)
        rule.adjust(grads_finite)
        got = (float(loss_scaler.scale_value), int(loss_scaler.counter))
        assert got == (float(rule.scale_value), rule.counter), f"step {step}"


def test_one_overflow_at_factor_3_divides_as_mindspore_does():
    loss_scaler = DynamicLossScaler(scale_value=100, scale_factor=3, scale_window=50)
    loss_scaler.adjust(False)
    assert loss_scaler.scale_value.numpy().item() == np.float32(100) / np.float32(3)
    assert f"{float(loss_scaler.scale_value):.6f}" == "33.333332"


def test_adjust_goes_through_the_scalers_iteration_end():
    # Statistics (and with them the stuck policy) see every adjust.
    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=2)
    for grads_finite in (True, True, False, True):
        loss_scaler.adjust(grads_finite)
    stats = loss_scaler._scaler.stats()
    assert (stats.iterations, stats.skipped, stats.growths, stats.backoffs) == (4, 1, 1, 1)
    assert stats.scale == 2**10


def test_adjust_refuses_to_grow_past_float32():
    # Hand-worked: window 1 grows at every finite step until the next growth would be
    # inf, and from then on stays at 2**127.
    loss_scaler = DynamicLossScaler(scale_value=2.0**126, scale_factor=2, scale_window=1)
    scales = []
    for _ in range(3):
        loss_scaler.adjust(True)
        scales.append(float(loss_scaler.scale_value))
    assert scales == [2.0**127] * 3


@pytest.mark.parametrize("as_tensor", [False, True], ids=["bool", "tensor"])
def test_static_adjust_returns_false_and_keeps_the_scale(as_tensor):
    loss_scaler = StaticLossScaler(scale_value=2**10)
    for bad_value in [None, math.inf, None, math.nan, None]:
        assert loss_scaler.adjust(grads_finite_flag(bad_value, as_tensor)) is False
        assert float(loss_scaler.scale_value) == 2**10


def test_scale_value_and_counter_are_0d_copies():
    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=3)
    value, counter = loss_scaler.scale_value, loss_scaler.counter
    assert (value.dtype, value.ndim, counter.dtype, counter.ndim) == (
        paddle.float32,
        0,
        paddle.int32,
        0,
    )
    loss_scaler.adjust(True)
    loss_scaler.adjust(False)
    # Copies: what was handed out earlier does not follow the scaler.
    assert (float(value), int(counter)) == (2**10, 0)
    assert float(loss_scaler.scale_value) == 2**9


def finite_grads_flag():
    """all_finite of real, finite gradients, as MindSpore's own test computes it."""
    model = make_model()
    grads = paddle.grad(loss_of(model, batches(steps=1)[0]), list(model.parameters()))
    return all_finite(grads)


@pytest.mark.parametrize(
    "counter",
    [49, np.int32(49), paddle.to_tensor(49, dtype="int32"), paddle.to_tensor([49])],
    ids=["int", "numpy", "tensor", "tensor[1]"],
)
def test_assigned_counter_and_scale_value_take_effect_as_in_mindspores_test(counter):
    # MindSpore's test_dynamic_loss_scaler: the counter set one short of the window, the
    # next finite adjust doubles the scale; the scale set back, the next one keeps it.
    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=50)
    finite = finite_grads_flag()
    loss_scaler.counter = counter
    assert int(loss_scaler.counter) == 49
    loss_scaler.adjust(finite)
    assert (float(loss_scaler.scale_value), int(loss_scaler.counter)) == (2048.0, 0)
    loss_scaler.scale_value = paddle.to_tensor(2**10, dtype="float32")
    loss_scaler.adjust(finite)
    assert (float(loss_scaler.scale_value), int(loss_scaler.counter)) == (1024.0, 1)


@pytest.mark.parametrize("make_scaler", [StaticLossScaler, DynamicLossScaler])
@pytest.mark.parametrize(
    "value",
    [64, 64.0, np.float32(64), paddle.to_tensor(64.0), paddle.to_tensor([64])],
    ids=["int", "float", "numpy", "tensor", "int tensor[1]"],
)
def test_an_assigned_scale_value_scales_and_unscales_from_then_on(make_scaler, value):
    loss_scaler = (
        make_scaler(2**10) if make_scaler is StaticLossScaler else make_scaler(2**10, 2, 5)
    )
    loss_scaler.scale_value = value
    assert loss_scaler.scale(paddle.to_tensor([3.0])).numpy().tolist() == [192.0]
    assert loss_scaler.unscale(paddle.to_tensor([192.0])).numpy().tolist() == [3.0]
    assert float(loss_scaler.scale_value) == 64.0


BAD_ASSIGNMENTS = {
    "negative counter": ("counter", -1, ValueError),
    "counter at the window": ("counter", 5, ValueError),
    "counter past the window": ("counter", np.int64(7), ValueError),
    "counter as a float": ("counter", 2.5, TypeError),
    "counter as a two-element tensor": ("counter", paddle.to_tensor([1, 2]), ValueError),
    "scale inf": ("scale_value", math.inf, ValueError),
    "scale nan tensor": ("scale_value", paddle.to_tensor(math.nan), ValueError),
    "scale zero": ("scale_value", 0.0, ValueError),
    "scale negative": ("scale_value", np.float32(-8), ValueError),
    "scale below one": ("scale_value", 0.5, ValueError),
    "scale as a string": ("scale_value", "8", TypeError),
}


@pytest.mark.parametrize("name", sorted(BAD_ASSIGNMENTS))
def test_a_bad_assignment_names_the_state_and_changes_nothing(name):
    attribute, value, error = BAD_ASSIGNMENTS[name]
    loss_scaler = DynamicLossScaler(scale_value=8, scale_factor=2, scale_window=5)
    loss_scaler.adjust(True)
    with pytest.raises(error, match=attribute):
        setattr(loss_scaler, attribute, value)
    assert (float(loss_scaler.scale_value), int(loss_scaler.counter)) == (8.0, 1)
    for _ in range(4):
        loss_scaler.adjust(True)
    assert (float(loss_scaler.scale_value), int(loss_scaler.counter)) == (16.0, 0)


# -- mindspore.amp: the documented functional loop ---------------------------------------


@pytest.mark.parametrize("apply", sorted(APPLY))
def test_functional_loop_trains_as_without_a_scaler(apply):
    # Window 2 instead of the documented 50, so that the scale also grows during the run.
    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=2)
    plain = functional_loop(None, APPLY[apply])
    scaled = functional_loop(loss_scaler, APPLY[apply])
    for (plain_params, plain_state, *_), (params, state, *_) in zip(plain, scaled):
        assert_arrays_equal(params, plain_params)
        assert_arrays_equal(state, plain_state)
    rule = AmpRule(2**10, 2, 2)
    expected = []
    for _ in range(6):
        rule.adjust(True)
        expected.append((float(rule.scale_value), rule.counter))
    assert [(scale, counter) for *_, scale, counter in scaled] == expected


@pytest.mark.parametrize("value", [math.inf, math.nan], ids=["inf", "nan"])
@pytest.mark.parametrize("apply", sorted(APPLY))
def test_functional_loop_skips_an_overflow_step_exactly(apply, value):
    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=50)
    scaled = functional_loop(loss_scaler, APPLY[apply], poison_at=3, value=value)
    before, after = scaled[2], scaled[3]
    assert_arrays_equal(after[0], before[0])
    assert_arrays_equal(after[1], before[1])
    # Halved, and the finite streak starts again.
    assert (after[2], after[3]) == (before[2] / 2, 0)
    reference = functional_loop(None, APPLY[apply], poison_at=3)
    assert_arrays_equal(scaled[-1][0], reference[-1][0])
    assert_arrays_equal(scaled[-1][1], reference[-1][1])


@pytest.mark.parametrize("make_scaler", [StaticLossScaler, DynamicLossScaler])
def test_functional_loop_reads_nothing_from_the_device(make_scaler):
    loss_scaler = (
        StaticLossScaler(2**10)
        if make_scaler is StaticLossScaler
        else DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=2)
    )
    model = make_model()
    params = list(model.parameters())
    counter = HostReadCounter()
    for step, batch in enumerate(batches(steps=3)):
        loss = loss_of(model, batch)
        with counter.counting():
            scaled = loss_scaler.scale([loss])[0]
        grads = paddle.grad(scaled, params)
        if step == 1:
            grads = poisoned(grads, math.inf)
        with counter.counting():
            grads = loss_scaler.unscale(grads)
            finite = all_finite(grads)
            loss_scaler.adjust(finite)
            loss_scaler.adjust(True)
            _ = loss_scaler.scale_value  # a copy, which must not read either
        if finite:  # the caller's read, outside the count
            apply_by_hand(model, None, grads)
    assert counter.reads["scaler"] == 0, counter.where
    assert counter.total() == 0, counter.where


# -- scale, unscale, all_finite ----------------------------------------------------------


@pytest.mark.parametrize(
    "make_scaler",
    [lambda: StaticLossScaler(8), lambda: DynamicLossScaler(8, 2, 5)],
    ids=["static", "dynamic"],
)
def test_scale_and_unscale_keep_the_structure(make_scaler):
    loss_scaler = make_scaler()
    a, b = np.array([1.5, -3.0, 0.0], dtype="float32"), np.array(0.25, dtype="float32")
    x, y = paddle.to_tensor(a), paddle.to_tensor(b)
    # What numpy computes: exact, as 8 is a power of two.
    for method, times in ((loss_scaler.scale, 8.0), (loss_scaler.unscale, 1 / 8)):
        out = method([x, (y, [x])])
        assert isinstance(out, list) and isinstance(out[1], tuple)
        assert isinstance(out[1][1], list)
        assert out[0] is not x and out[1][1][0] is not x and out[1][0] is not y
        np.testing.assert_array_equal(out[0].numpy(), a * np.float32(times))
        np.testing.assert_array_equal(out[1][1][0].numpy(), a * np.float32(times))
        assert out[1][0].ndim == 0
        np.testing.assert_array_equal(out[1][0].numpy(), b * np.float32(times))
        single = method(x)
        assert isinstance(single, paddle.Tensor) and single is not x
        np.testing.assert_array_equal(single.numpy(), a * np.float32(times))
    # New tensors: the inputs are left as they were.
    np.testing.assert_array_equal(x.numpy(), a)
    np.testing.assert_array_equal(y.numpy(), b)


def test_unscale_keeps_float16():
    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=5)
    values = np.array([3.0, -5.0, 1024.0, 65504.0], dtype="float16")
    out = loss_scaler.unscale([paddle.to_tensor(values)])[0]
    assert out.dtype == paddle.float16
    np.testing.assert_array_equal(out.numpy(), values / np.float16(2**10))


def nest(arrays):
    """The arrays as Tensors, nested as [t0, (t1, [t2, ...])]; and the Tensors in order."""
    tensors = [paddle.to_tensor(a) for a in arrays]
    return [tensors[0], (tensors[1], tensors[2:])], tensors


ALL_FINITE_CASES = {
    "finite": [np.array([1.0, -0.0, 3.0e38], "float32"), np.array(2.0, "float32")],
    "inf deep inside": [
        np.ones(3, "float32"),
        np.ones((2, 2), "float32"),
        np.array([1.0, np.inf], "float32"),
    ],
    "-inf": [np.array([-np.inf], "float32"), np.ones(2, "float32"), np.ones(1, "float32")],
    "nan 0-d": [np.ones(2, "float32"), np.array(np.nan, "float32"), np.ones(1, "float32")],
    "nan float64": [np.ones(2, "float32"), np.ones(2, "float32"), np.array([np.nan, 1.0])],
    "empty tensor beside finite": [np.zeros((0, 3), "float32"), np.ones(2, "float32")],
    "denormal": [np.array([1e-45, -1e-40], "float32"), np.ones(2, "float32")],
}


@pytest.mark.parametrize("name", sorted(ALL_FINITE_CASES))
def test_all_finite(name):
    arrays = ALL_FINITE_CASES[name]
    inputs, tensors = nest(arrays)
    flag = all_finite(inputs)
    assert isinstance(flag, paddle.Tensor)
    assert (flag.dtype, flag.ndim) == (paddle.bool, 0)
    assert bool(flag) == all(np.isfinite(a).all() for a in arrays)
    # all_finite must not touch its inputs: same bits, -0.0 and nan included.
    for tensor, array in zip(tensors, arrays):
        assert tensor.numpy().tobytes() == array.tobytes()


def test_all_finite_of_one_tensor_and_of_nothing():
    assert bool(all_finite(paddle.to_tensor([1.0, 2.0]))) is True
    assert bool(all_finite(paddle.to_tensor([1.0, math.nan]))) is False
    empty = all_finite([])
    assert (empty.dtype, empty.ndim, bool(empty)) == (paddle.bool, 0, True)


def test_all_finite_of_float16_on_cpu():
    half = [np.array([1.0, 2.0], "float16"), np.array([1.0, np.inf], "float16")]
    assert bool(all_finite([paddle.to_tensor(half[0])])) is True
    assert bool(all_finite([paddle.to_tensor(h) for h in half])) is False


def test_scale_and_unscale_agree_under_bfloat16_auto_cast():
    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=50)
    x = paddle.to_tensor([3.0], stop_gradient=False)
    with warnings.catch_warnings():
        # Paddle's auto_cast is a no-op on a CPU (it says so); the scaler may warn too.
        warnings.simplefilter("ignore")
        with paddle.amp.auto_cast(dtype="bfloat16"):
            scaled = loss_scaler.scale((x * x).sum())
    (grad,) = paddle.grad(scaled, [x])
    # d(x*x)/dx at 3 is 6, exactly, once unscaled.
    np.testing.assert_array_equal(loss_scaler.unscale(grad).numpy(), [6.0])


# -- argument checks -----------------------------------------------------------------------

BAD_ARGUMENTS = {
    "fixed loss_scale < 1": (
        lambda: FixedLossScaleManager(loss_scale=0.5),
        ValueError,
        "loss_scale",
    ),
    "fixed loss_scale str": (
        lambda: FixedLossScaleManager(loss_scale="128"),
        TypeError,
        "loss_scale",
    ),
    "fixed drop_overflow_update int": (
        lambda: FixedLossScaleManager(drop_overflow_update=1),
        TypeError,
        "drop_overflow_update",
    ),
    "dynamic init_loss_scale < 1": (
        lambda: DynamicLossScaleManager(init_loss_scale=0.5),
        ValueError,
        "init_loss_scale",
    ),
    # MindSpore's check_positive_int refuses a float window too (unlike tf-keras' int()).
    "dynamic scale_window float": (
        lambda: DynamicLossScaleManager(scale_window=2.0),
        TypeError,
        "scale_window",
    ),
    "dynamic scale_window bool": (
        lambda: DynamicLossScaleManager(scale_window=True),
        TypeError,
        "scale_window",
    ),
    "dynamic scale_window 0": (
        lambda: DynamicLossScaleManager(scale_window=0),
        ValueError,
        "scale_window",
    ),
    "dynamic scale_window -3": (
        lambda: DynamicLossScaleManager(scale_window=-3),
        ValueError,
        "scale_window",
    ),
    "dynamic scale_factor 1": (
        lambda: DynamicLossScaleManager(scale_factor=1),
        ValueError,
        "scale_factor",
    ),
    "dynamic scale_factor 0.5": (
        lambda: DynamicLossScaleManager(scale_factor=0.5),
        ValueError,
        "scale_factor",
    ),
    "static scale_value bool": (lambda: StaticLossScaler(True), TypeError, "scale_value"),
    "static scale_value str": (lambda: StaticLossScaler("2"), TypeError, "scale_value"),
    "static scale_value < 1": (lambda: StaticLossScaler(0.5), ValueError, "scale_value"),
    "amp scale_value bool": (lambda: DynamicLossScaler(True, 2, 5), TypeError, "scale_value"),
    "amp scale_value str": (lambda: DynamicLossScaler("2", 2, 5), TypeError, "scale_value"),
    "amp scale_value < 1": (lambda: DynamicLossScaler(0.5, 2, 5), ValueError, "scale_value"),
    "amp scale_factor 1": (lambda: DynamicLossScaler(8, 1, 5), ValueError, "scale_factor"),
    "amp scale_factor 2.5": (lambda: DynamicLossScaler(8, 2.5, 5), TypeError, "scale_factor"),
    "amp scale_window 0": (lambda: DynamicLossScaler(8, 2, 0), ValueError, "scale_window"),
    "fixed update_loss_scale int": (
        lambda: FixedLossScaleManager().update_loss_scale(1),
        TypeError,
        "overflow",
    ),
    "dynamic update_loss_scale None": (
        lambda: DynamicLossScaleManager().update_loss_scale(None),
        TypeError,
        "overflow",
    ),
    "dynamic update_loss_scale tensor": (
        lambda: DynamicLossScaleManager().update_loss_scale(paddle.to_tensor(True)),
        TypeError,
        "overflow",
    ),
    "adjust str": (
        lambda: DynamicLossScaler(8, 2, 5).adjust("yes"),
        TypeError,
        "grads_finite",
    ),
    "adjust float32 tensor": (
        lambda: DynamicLossScaler(8, 2, 5).adjust(paddle.to_tensor(1.0)),
        TypeError,
        "grads_finite",
    ),
    "adjust two-element bool tensor": (
        lambda: DynamicLossScaler(8, 2, 5).adjust(paddle.to_tensor([True, True])),
        TypeError,
        "grads_finite",
    ),
    "static adjust str": (
        lambda: StaticLossScaler(8).adjust("yes"),
        TypeError,
        "grads_finite",
    ),
    "scale of a float": (lambda: StaticLossScaler(8).scale([1.0]), TypeError, r"^scale\(\)"),
    "unscale of a float": (
        lambda: DynamicLossScaler(8, 2, 5).unscale([paddle.ones([1]), (2.0,)]),
        TypeError,
        r"^unscale\(\)",
    ),
    "all_finite of a float": (lambda: all_finite([1.0]), TypeError, r"^all_finite\(\)"),
}


@pytest.mark.parametrize("name", sorted(BAD_ARGUMENTS))
def test_bad_arguments(name):
    call, error, match = BAD_ARGUMENTS[name]
    with pytest.raises(error, match=match):
        call()


def test_a_refused_adjust_changes_nothing():
    loss_scaler = DynamicLossScaler(scale_value=8, scale_factor=2, scale_window=2)
    loss_scaler.adjust(True)
    with pytest.raises(TypeError, match="grads_finite"):
        loss_scaler.adjust(paddle.to_tensor([1.0]))
    assert (float(loss_scaler.scale_value), int(loss_scaler.counter)) == (8.0, 1)
