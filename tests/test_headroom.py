"""The headroom policy in the scaler: what a user sees of it.

The rule itself is held to its pure specification in test_rule.py; here, that the
scaler feeds it the right amax, skips exactly, reports the headroom, saves and loads its
memory, and that install() hands it to the scalers trainers build.
"""

import math

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler, install, uninstall
from paddle_amp_scaler.compat.torch import GradScaler as TorchGradScaler
from paddle_amp_scaler.core import rules
from paddle_amp_scaler.integrations import log_stats

from helpers import (
    GradInjector,
    Writer,
    batches,
    loss_of,
    make_model,
    optimizer_state_of,
    params_of,
    train_step,
)


@pytest.mark.parametrize("value", ["Headroom", "", None, 2, "adaptive"])
def test_a_bad_policy_is_a_value_error_naming_the_argument_and_the_values(value):
    with pytest.raises(ValueError, match="policy must be 'interval' or 'headroom'"):
        GradScaler(policy=value)
    with pytest.raises(ValueError, match="policy must be 'interval' or 'headroom'"):
        AmpScaler(enable=False, policy=value)


class Recorder:
    """The scaled gradients as backward leaves them, for an independent amax."""

    def __init__(self, model):
        self.largest = 0.0
        for param in model.parameters():
            param.register_hook(self._hook)

    def _hook(self, grad):
        self.largest = max(self.largest, float(np.abs(grad.numpy()).max()))
        return grad


def test_the_headroom_reported_is_that_of_the_gradients_measured():
    model = make_model()
    optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(policy="headroom", init_loss_scaling=2.0**6)
    recorder = Recorder(model)
    for batch in batches(steps=3):  # the first iterations are measured
        recorder.largest = 0.0
        scale_then = scaler.stats().scale
        train_step(scaler, model, optimizer, batch)
        # At the scale reported: the policy moves it after measuring.
        stats = scaler.stats()
        amax_now = recorder.largest / scale_then * stats.scale
        assert stats.headroom_bits == pytest.approx(math.log2(65504.0 / amax_now), rel=1e-6)
    # Under the interval rule there is nothing to report.
    assert GradScaler().stats().headroom_bits is None


def test_headroom_grows_at_once_where_the_interval_rule_waits():
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(policy="headroom", init_loss_scaling=2.0)
    recorder = Recorder(model)
    train_step(scaler, model, optimizer, batches(steps=1)[0])
    grown = scaler.get_loss_scaling()
    # Up to the calibration's margin below float16's ceiling, in powers of two, in one
    # iteration.
    bits = math.log2(65504.0 / recorder.largest)
    expected_steps = math.floor(bits - rules.HeadroomRule().calibration_margin)
    assert grown == 2.0 * 2.0**expected_steps
    assert scaler.stats().growths == 1


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_skipped_steps_leave_parameters_and_accumulators_bit_identical(name):
    from test_training_equivalence import OPTIMIZERS

    model = make_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = GradScaler(policy="headroom", init_loss_scaling=2.0**4)
    for step, batch in enumerate(batches(steps=6)):
        before = params_of(model), optimizer_state_of(optimizer, model.parameters())
        inject = math.inf if step in (2, 4) else None
        train_step(scaler, model, optimizer, batch, injector=injector, inject=inject)
        if inject is not None:
            for old, new in zip(before[0], params_of(model)):
                np.testing.assert_array_equal(new, old)
            after = optimizer_state_of(optimizer, model.parameters())
            assert after.keys() == before[1].keys()
            for key in after:
                np.testing.assert_array_equal(after[key], before[1][key], err_msg=key)
    assert scaler.stats().skipped == 2


def test_a_state_dict_resumes_the_policy_and_its_memory_exactly():
    def run(scaler, steps, model, optimizer, injector):
        data = batches(steps=12)
        for step in steps:
            inject = math.inf if step in (3, 8) else None
            train_step(scaler, model, optimizer, data[step], injector=injector, inject=inject)

    def fresh():
        model = make_model()
        optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
        return model, optimizer, GradInjector(model[0].weight)

    model, optimizer, injector = fresh()
    straight = GradScaler(policy="headroom", incr_every_n_steps=4)
    run(straight, range(12), model, optimizer, injector)

    model, optimizer, injector = fresh()
    first = GradScaler(policy="headroom", incr_every_n_steps=4)
    run(first, range(6), model, optimizer, injector)
    saved = first.state_dict()
    assert saved["policy"] == "headroom" and set(saved["headroom"]) == {
        "peak",
        "overflow_peak",
        "anchor",
        "grown_at",
        "amax",
    }
    resumed = GradScaler(incr_every_n_steps=4)  # the interval rule: the dict says headroom
    with pytest.warns(UserWarning, match="saved under policy='headroom'.*follows the dict"):
        resumed.load_state_dict(saved)
    run(resumed, range(6, 12), model, optimizer, injector)
    a, b = resumed.state_dict(), straight.state_dict()
    np.testing.assert_array_equal(a.pop("scale"), b.pop("scale"))
    assert a == b


def test_paddles_and_pytorchs_dicts_load_into_the_policys_defaults():
    scaler = GradScaler(policy="headroom")
    scaler.load_state_dict(
        {
            "scale": np.array([1024.0], dtype=np.float32),
            "incr_ratio": 2.0,
            "decr_ratio": 0.5,
            "incr_every_n_steps": 100,
            "decr_every_n_nan_or_inf": 1,
            "incr_count": 5,
            "decr_count": 0,
            "use_dynamic_loss_scaling": True,
        }
    )
    saved = scaler.state_dict()
    assert saved["policy"] == "headroom"
    assert saved["headroom"] == {
        "peak": 0.0,
        "overflow_peak": 0.0,
        "anchor": 0.0,
        "grown_at": rules.NEVER,
        "amax": 0.0,
    }
    torch_face = TorchGradScaler("cpu", policy="headroom")
    torch_face.load_state_dict(
        {
            "scale": 512.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 10,
            "_growth_tracker": 3,
        }
    )
    assert torch_face.get_scale() == 512.0 and torch_face.get_incr_count() == 3


# A valid memory: each case below spoils one thing of it.
MEMORY = {"peak": 0.5, "overflow_peak": 0.0, "anchor": 1.0, "grown_at": 0, "amax": 1.0}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"policy": "fast"}, "state_dict\\['policy'\\] must be"),
        ({"headroom": {**MEMORY, "amax": None}}, "amax"),
        ({"headroom": {key: MEMORY[key] for key in ("peak", "anchor")}}, "must be a dict"),
        # The memory of the policy's first, unreleased version, which learned a margin.
        (
            {"headroom": {"margin": 1, "margin_at": 3, "anchor": 1.0, "grown_at": 3, "amax": 1.0}},
            "the keys \\['amax', 'anchor', 'grown_at', 'overflow_peak', 'peak'\\]",
        ),
        ({"headroom": {**MEMORY, "peak": -1.0}}, "peak"),
        ({"headroom": {**MEMORY, "anchor": -1.0}}, "anchor"),
        ({"headroom": {**MEMORY, "overflow_peak": math.nan}}, "overflow_peak"),
        ({"headroom": {**MEMORY, "grown_at": 2.5}}, "grown_at"),
    ],
)
def test_a_bad_headroom_dict_names_the_key_and_changes_nothing(change, message):
    source = GradScaler(policy="headroom")
    saved = {**source.state_dict(), **change}
    target = GradScaler(init_loss_scaling=8.0)
    before = target.state_dict()
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(saved)
    after = target.state_dict()
    np.testing.assert_array_equal(after.pop("scale"), before.pop("scale"))
    assert after == before


def test_the_interval_rules_dict_names_its_policy_and_keeps_no_headroom_memory():
    state = GradScaler().state_dict()
    assert state["policy"] == "interval" and "headroom" not in state


def test_install_hands_the_policy_to_the_scalers_trainers_build():
    try:
        install(policy="headroom")
        built = paddle.amp.GradScaler(init_loss_scaling=1024)
        assert isinstance(built, GradScaler) and built.state_dict()["policy"] == "headroom"
        assert paddle.amp.AmpScaler().state_dict()["policy"] == "headroom"
        # An argument the call gives still wins.
        assert paddle.amp.GradScaler(policy="interval").state_dict()["policy"] == "interval"
    finally:
        uninstall()
    assert not issubclass(paddle.amp.GradScaler, GradScaler)


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ({"policy": "fast"}, "install\\(\\): policy must be"),
        ({"polcy": "headroom"}, "did you mean 'policy'"),
        ({"min_loss_scaling": -1.0}, "min_loss_scaling"),
    ],
)
def test_install_refuses_a_bad_default_naming_it(defaults, message):
    before = paddle.amp.GradScaler
    with pytest.raises(ValueError, match=message):
        install(**defaults)
    assert paddle.amp.GradScaler is before


def test_log_stats_writes_the_headroom_under_the_policy_only():
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    for policy, expected in (("interval", False), ("headroom", True)):
        scaler = GradScaler(policy=policy)
        train_step(scaler, model, optimizer, batches(steps=1)[0])
        writer = Writer()
        stats = log_stats(writer, scaler, 1)
        assert ("amp/headroom_bits" in writer.scalars) == expected
        if expected:
            assert writer.scalars["amp/headroom_bits"] == stats.headroom_bits


def test_a_fixed_scale_has_no_policy():
    with pytest.raises(ValueError, match="policy='headroom'.*use_dynamic_loss_scaling=False"):
        GradScaler(policy="headroom", use_dynamic_loss_scaling=False)
    # A fixed scale is measured where asked, and stays fixed.
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(use_dynamic_loss_scaling=False, measure_every=1)
    train_step(scaler, model, optimizer, batches(steps=1)[0])
    assert scaler.get_loss_scaling() == 2.0**16 and scaler.stats().headroom_bits is not None


def test_loss_of_a_run_matches_the_interval_rule_where_nothing_overflows():
    # Exact powers of two: unscaled gradients are the same bits at any scale, so the two
    # policies train identically while neither skips.
    def run(policy):
        model = make_model()
        optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
        scaler = GradScaler(policy=policy, init_loss_scaling=2.0**4)
        for batch in batches(steps=5):
            train_step(scaler, model, optimizer, batch)
        return params_of(model), float(loss_of(model, batches(steps=1)[0]))

    (params_a, loss_a), (params_b, loss_b) = run("interval"), run("headroom")
    assert loss_a == loss_b
    for a, b in zip(params_a, params_b):
        np.testing.assert_array_equal(a, b)


def headroom_run(bad_at, loss_overflows, steps=80, every=8):
    """The scale after each iteration of a headroom run whose one gradient (true value
    1e-3) is set directly; in the iterations ``bad_at`` the gradient overflows, and the
    loss handed to ``scale()`` is inf too where ``loss_overflows`` (a forward overflow)."""
    scaler = GradScaler(init_loss_scaling=2.0**10, policy="headroom", measure_every=every)
    param = paddle.create_parameter([4], "float32")
    optimizer = paddle.optimizer.Momentum(learning_rate=0.0, momentum=0.0, parameters=[param])
    scales = []
    for step in range(steps):
        bad = step in bad_at
        scaler.scale(paddle.to_tensor(math.inf if bad and loss_overflows else 1.0))
        scale = scaler.get_loss_scaling()
        param.grad = paddle.full([4], math.inf if bad else 1e-3 * scale)
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        scales.append(scaler.get_loss_scaling())
    return scales


def test_a_forward_overflow_does_not_hold_the_headroom_scale_down():
    # Three inf-loss batches soon after the scale settled: each backs off, as every skip
    # does, but none is evidence that the scale was too high. By the second measured
    # iteration after them the scale is where the run without them has it (or a growth
    # above): not held a growth below for incr_every_n_steps.
    bad, every = (41, 45, 49), 8
    clean = headroom_run((), loss_overflows=False, every=every)
    forward = headroom_run(bad, loss_overflows=True, every=every)
    second_measured = [n for n in range(50, 80) if (n + 1) % every == 0][1]
    assert forward[second_measured] in (clean[second_measured], 2 * clean[second_measured])
    # The same skips with a finite loss are the gradients': there the policy holds the
    # scale a growth below, which is what tells the two apart.
    gradients = headroom_run(bad, loss_overflows=False, every=every)
    assert gradients[second_measured] < clean[second_measured]
