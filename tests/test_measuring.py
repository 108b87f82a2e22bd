"""Measuring the gradients under either policy (API.md, "Measuring the gradients"), and the
policy explicit: read-only, refused with a fixed scale, and followed with a warning where
a state dict was saved under the other one."""

import math
import pickle
import warnings
from typing import NamedTuple

import numpy as np
import paddle
import pytest
from counters import HostReadCounter

from paddle_amp_scaler import AmpScaler, GradScaler
from paddle_amp_scaler.compat import torch as torch_face
from paddle_amp_scaler.core.reports import Measured
from paddle_amp_scaler.core.rules import HeadroomRule, IntervalRule

from helpers import GradInjector, Writer, batches, loss_of, make_model

FLOAT16_MAX, FLOAT16_TINY = 65504.0, 2.0**-14


def expected_row(scaled_grad):
    """What the scaler should measure of one scaled gradient, from NumPy alone."""
    magnitude = np.abs(scaled_grad.astype(np.float64))
    nonzero = int((magnitude > 0).sum())
    subnormal = int(((magnitude > 0) & (magnitude < FLOAT16_TINY)).sum())
    return float(magnitude.max()), subnormal, nonzero


def run(scaler, steps, injector=None, inject_at=(), dim=1e-6, seed=0):
    """Train ``steps`` iterations, the loss dimmed so that some scaled gradients sit in
    float16's subnormal range; return the model and, per iteration, the scale and the
    scaled gradients as backward left them (by parameter name)."""
    model = make_model(seed)
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    injector = injector or GradInjector(model[0].weight)
    seen = []
    for step, batch in enumerate(batches(seed, steps=steps)):
        scale = scaler.stats().scale
        with injector.inject(math.inf if step in inject_at else None):
            scaler.scale(loss_of(model, batch) * dim).backward()
        seen.append(Seen(scale, {p.name: p.grad.numpy().copy() for p in model.parameters()}))
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
    return model, seen


class Seen(NamedTuple):
    scale: float
    grads: dict


def totals_of(seen, scale_now):
    """The headroom (at ``scale_now``) and the subnormal share of one iteration ``seen``."""
    rows = [expected_row(grad) for grad in seen.grads.values()]
    amax = max(row[0] for row in rows)
    share = sum(row[1] for row in rows) / sum(row[2] for row in rows)
    return bits_at(amax, seen.scale, scale_now), share


def bits_at(scaled_amax, scale_then, scale_now):
    """The headroom of gradients whose amax was ``scaled_amax`` at ``scale_then``, referred
    to ``scale_now``: doublings left before 65504."""
    return math.log2(FLOAT16_MAX / (scaled_amax / scale_then * scale_now))


@pytest.mark.parametrize("value", [0, -3, 2.5, "64", True])
def test_measure_every_is_a_positive_int(value):
    with pytest.raises((ValueError, TypeError), match="measure_every"):
        GradScaler(measure_every=value)


def test_the_interval_rule_measures_nothing_by_default():
    scaler = GradScaler(init_loss_scaling=2.0**10)
    run(scaler, 4)
    stats = scaler.stats()
    assert (stats.headroom_bits, stats.subnormal_fraction) == (None, None)
    with pytest.raises(RuntimeError, match="measure_every=N"):
        scaler.underflow_report()


def test_which_iterations_are_measured():
    assert [n for n in range(1, 40) if IntervalRule(measure_every=10).measures(n)] == [
        1,
        2,
        3,
        10,
        20,
        30,
    ]
    # Under the headroom policy the same argument sets the period, and the peak's memory
    # follows it.
    rule = HeadroomRule(measure_every=16)
    assert [n for n in range(1, 40) if rule.measures(n)] == [1, 2, 3, 16, 32]
    assert rule.peak_half_life == 8 * 16 and HeadroomRule().peak_half_life == 512
    assert GradScaler(policy="headroom", measure_every=16).measure_every == 16


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, None), ({"measure_every": 10}, 10), ({"policy": "headroom"}, 64)],
)
def test_measure_every_is_readable_on_every_scaler_and_not_assignable(options, expected):
    from paddle_amp_scaler.compat.torch import GradScaler as TorchGradScaler

    for scaler in (GradScaler(**options), AmpScaler(**options), TorchGradScaler(**options)):
        assert scaler.measure_every == expected
        # Assigned, it would measure nothing new: the rule was built with the period.
        with pytest.raises(AttributeError):
            scaler.measure_every = 5
        assert scaler.measure_every == expected


@pytest.mark.parametrize("measure_every", [1, 2, 3])
def test_the_numbers_are_those_of_the_last_measured_iteration(measure_every):
    # Iterations 1-3 are always measured; with steps=5 the last measured one is 3, 4 or 3.
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=measure_every)
    _, seen = run(scaler, 5)
    last = max(n for n in range(1, 6) if scaler._rule.measures(n))
    stats = scaler.stats()
    bits, fraction = totals_of(seen[last - 1], stats.scale)
    assert 0 < fraction < 1, "the workload puts some gradients near float16's floor"
    assert stats.headroom_bits == pytest.approx(bits, rel=1e-6)
    assert stats.subnormal_fraction == pytest.approx(fraction, rel=1e-12)


def test_an_iteration_with_inf_keeps_the_last_finite_measurement():
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=1)
    model, seen = run(scaler, 4, inject_at=(3,))
    stats = scaler.stats()
    assert stats.last_skipped == 4 and stats.scale < seen[2].scale
    assert stats.subnormal_fraction == pytest.approx(totals_of(seen[2], stats.scale)[1], rel=1e-12)
    # And so does the per-gradient report.
    by_name = {p.name: name for name, p in model.named_parameters()}
    report = {entry.name: entry for entry in scaler.underflow_report(model)}
    for paddle_name, grad in seen[2].grads.items():
        amax, subnormal, nonzero = expected_row(grad)
        entry = report[by_name[paddle_name]]
        assert (entry.subnormal, entry.nonzero) == (subnormal, nonzero)
        # Referred, as stats()' headroom, to the scale the scaler has now.
        expected_bits = bits_at(amax, seen[2].scale, stats.scale)
        assert entry.headroom_bits == pytest.approx(expected_bits, rel=1e-6)
        assert entry.shape == grad.shape and entry.dtype == "float32"


def test_the_report_puts_the_lowest_gradients_first_named_as_the_overflow_report():
    model = make_model()
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=1, report_overflows=model)
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    loss = loss_of(model, batches(steps=1)[0])
    scaler.scale(loss * 1e-6).backward()
    scaler.step(optimizer)
    scaler.update()
    report = scaler.underflow_report()
    assert {entry.name for entry in report} == {name for name, _ in model.named_parameters()}
    shares = [entry.subnormal_fraction for entry in report]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0
    unnamed = GradScaler(measure_every=1)
    run(unnamed, 1)
    assert all(entry.name.startswith("linear_") for entry in unnamed.underflow_report())


@pytest.mark.parametrize("stranger", ["relu", "another model"])
def test_a_report_refuses_a_model_that_holds_none_of_the_parameters(stranger):
    # A model that holds none of the optimizer's parameters would name nothing: every
    # entry would fall back to Paddle's names, and say nothing was wrong.
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=1, report_overflows=True)
    model, _ = run(scaler, 2, inject_at=(1,))
    other = paddle.nn.ReLU() if stranger == "relu" else make_model()
    for report in (scaler.underflow_report, scaler.overflow_report):
        with pytest.raises(ValueError, match="holds none of the parameters"):
            report(other)
        # The model that holds them names them all.
        names = {name for name, _ in model.named_parameters()}
        assert {entry.name for entry in report(model)} <= names
        assert report(model)


def test_measuring_never_changes_what_the_interval_rule_does():
    plain, measured = (
        GradScaler(init_loss_scaling=2.0**20),
        GradScaler(init_loss_scaling=2.0**20, measure_every=2),
    )
    model_a, _ = run(plain, 8, inject_at=(2, 5), dim=1.0)
    model_b, _ = run(measured, 8, inject_at=(2, 5), dim=1.0)
    a, b = plain.state_dict(), measured.state_dict()
    np.testing.assert_array_equal(a.pop("scale"), b.pop("scale"))
    assert b.pop("measured")["nonzero"] > 0 and a == b  # all but what was measured
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


@pytest.mark.parametrize("policy", ["interval", "headroom"])
def test_a_measured_step_reads_nothing_back(policy):
    # Plain SGD takes its flag on the device: any read would be the scaler's own.
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(policy=policy, measure_every=1)
    counter = HostReadCounter()
    for batch in batches(steps=4):
        with counter.counting():
            scaler.scale(loss_of(model, batch)).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.clear_grad()
    assert counter.reads["scaler"] == 0, counter.reads
    assert scaler.stats().subnormal_fraction is not None


def test_measurements_survive_a_pickle_as_totals():
    scaler = GradScaler(measure_every=1)
    run(scaler, 2)
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.stats() == scaler.stats()
    assert copy.underflow_report() == []  # the rows name parameters, which stay behind


@pytest.mark.parametrize("face", [GradScaler, AmpScaler, torch_face.GradScaler])
def test_every_scaler_and_face_shows_its_policy_read_only(face):
    assert face().policy == "interval"
    scaler = face(policy="headroom")
    assert scaler.policy == "headroom"
    with pytest.raises(AttributeError):
        scaler.policy = "interval"


def test_a_fixed_scale_has_no_policy():
    with pytest.raises(ValueError, match="use_dynamic_loss_scaling=False"):
        AmpScaler(policy="headroom", use_dynamic_loss_scaling=False)
    assert AmpScaler(use_dynamic_loss_scaling=False).policy == "interval"


@pytest.mark.parametrize(("saved", "loaded"), [("headroom", "interval"), ("interval", "headroom")])
def test_a_dict_of_the_other_policy_is_followed_with_a_warning_both_ways(saved, loaded):
    source = GradScaler(policy=saved, init_loss_scaling=2.0**10)
    run(source, 4)
    target = GradScaler(policy=loaded)
    with pytest.warns(UserWarning, match=f"saved under policy='{saved}'.*policy='{loaded}'"):
        target.load_state_dict(source.state_dict())
    assert target.policy == saved
    a, b = source.state_dict(), target.state_dict()
    np.testing.assert_array_equal(a.pop("scale"), b.pop("scale"))
    assert a == b
    # The same policy loads in silence; so does Paddle's own format, which names none.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GradScaler(policy=saved).load_state_dict(source.state_dict())
        paddles = {k: v for k, v in source.state_dict().items() if k not in ("policy", saved)}
        GradScaler(policy=loaded).load_state_dict(paddles)


@pytest.mark.parametrize("measure_every", [None, 4])
def test_the_logs_show_the_measured_numbers_where_there_are_some(measure_every):
    from paddle_amp_scaler.integrations import log_stats

    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=measure_every)
    run(scaler, 2)
    writer = Writer()
    stats = log_stats(writer, scaler, step=2)
    measured = {"amp/headroom_bits", "amp/subnormal_fraction"}
    assert (measured <= set(writer.scalars)) == (measure_every is not None)
    if measure_every is not None:
        assert writer.scalars["amp/subnormal_fraction"] == stats.subnormal_fraction


@pytest.mark.parametrize("policy", ["interval", "headroom"])
def test_a_resume_keeps_the_measured_numbers(policy):
    scaler = GradScaler(policy=policy, init_loss_scaling=2.0**10, measure_every=2)
    run(scaler, 4)
    state = scaler.state_dict()
    assert set(state["measured"]) == set(WINDOW_KEYS)
    resumed = GradScaler(policy=policy, measure_every=2)
    resumed.load_state_dict(state)
    assert resumed.stats() == scaler.stats()
    assert resumed.state_dict()["measured"] == pytest.approx(state["measured"], rel=1e-12)
    assert resumed.losing_gradients() == scaler.losing_gradients()
    # A scaler that measured nothing writes no such key; Paddle's dict has none.
    assert "measured" not in GradScaler().state_dict()


def test_a_dict_saved_before_the_window_starts_it_at_its_last_measurement():
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=1)
    run(scaler, 3)
    state = scaler.state_dict()
    state["measured"] = {key: state["measured"][key] for key in ("amax", "subnormal", "nonzero")}
    resumed = GradScaler(measure_every=1)
    resumed.load_state_dict(state)
    assert resumed.stats() == scaler.stats()
    window = resumed.state_dict()["measured"]
    assert (window["subnormal_window"], window["nonzero_window"]) == (
        window["subnormal"],
        window["nonzero"],
    )


WINDOW_KEYS = ("amax", "subnormal", "nonzero", "subnormal_window", "nonzero_window")


def window_of(seen, measured):
    """The window's counts from NumPy alone: over the iterations ``measured`` (1-based)
    whose gradients were all finite, each weighing 3/4 of the one after it, leaving out
    the gradients all of whose nonzero elements are subnormal."""
    subnormal = nonzero = 0.0
    for number in measured:
        grads = seen[number - 1].grads.values()
        if all(np.isfinite(grad).all() for grad in grads):
            rows = [row for row in map(expected_row, grads) if row[1] < row[2]]
            subnormal = 0.75 * subnormal + sum(row[1] for row in rows)
            nonzero = 0.75 * nonzero + sum(row[2] for row in rows)
    return subnormal, nonzero


@pytest.mark.parametrize("policy", ["interval", "headroom"])
def test_the_window_weighs_the_finite_measured_iterations_of_late(policy):
    scaler = GradScaler(policy=policy, init_loss_scaling=2.0**10, measure_every=2)
    _, seen = run(scaler, 9, inject_at=(3, 5))
    measured = [n for n in range(1, 10) if scaler._rule.measures(n)]
    subnormal, nonzero = window_of(seen, measured)
    state = scaler.state_dict()["measured"]
    assert state["subnormal_window"] == pytest.approx(subnormal, rel=1e-12)
    assert state["nonzero_window"] == pytest.approx(nonzero, rel=1e-12)
    # The fields of stats() are still the last finite measured iteration's alone.
    last = max(n for n in measured if n - 1 not in (3, 5))
    assert scaler.stats().subnormal_fraction == pytest.approx(
        totals_of(seen[last - 1], 1.0)[1], rel=1e-12
    )


def test_the_headroom_is_referred_to_the_scale_stats_reports():
    # Measured in iterations 1 to 3; the scale grows every iteration after: by the end,
    # the gradients measured have 2 doublings fewer left at the scale reported.
    scaler = GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=1, measure_every=100)
    _, seen = run(scaler, 5)
    stats = scaler.stats()
    assert stats.scale == 2.0**15 and seen[2].scale == 2.0**12
    bits, _ = totals_of(seen[2], stats.scale)
    assert stats.headroom_bits == pytest.approx(bits, rel=1e-6)
    assert stats.headroom_bits == pytest.approx(totals_of(seen[2], seen[2].scale)[0] - 3, rel=1e-6)


@pytest.mark.parametrize(
    ("share", "bits", "starts"),
    [
        (0.99e-4, 9.0, "no:"),
        (1e-4, 2.01, "yes, and a higher scale keeps some"),
        (1e-2, 8.0, "yes, and a higher scale keeps some"),
        (1e-4, 2.0, "yes, and no scale keeps them"),
        (1e-2, 0.0, "yes, and no scale keeps them"),
        (1e-2, -0.5, "not as float16 would"),
    ],
)
def test_the_bottom_line_reads_the_recipe_with_no_gap(share, bits, starts):
    # Only the window's share and the headroom decide; the last iteration's share does not.
    amax = FLOAT16_MAX / 2.0**bits
    measured = Measured(amax, 0, 1, share * 1e6, 1e6)
    reading = measured.reading("interval")
    assert reading.verdict.startswith(starts) and str(reading) == reading.verdict
    assert f"{share:.1e}" in reading.verdict
    assert reading.subnormal_fraction == pytest.approx(share, rel=1e-12)
    assert reading.headroom_bits == pytest.approx(bits, abs=1e-12)
    assert Measured().reading("interval") == (None, None, Measured().reading("headroom").verdict)
    assert Measured().reading("interval").verdict.startswith("not known yet")
    # Under the headroom policy the remedy is the policy's own: it says why it waits.
    under_headroom = measured.reading("headroom").verdict
    assert ('policy="headroom"' in reading.verdict) == starts.endswith("keeps some")
    assert 'policy="headroom"' not in under_headroom


def test_losing_gradients_is_the_bottom_line_of_the_numbers_measured():
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=1)
    _, seen = run(scaler, 4)
    stats = scaler.stats()
    bits, _ = totals_of(seen[3], stats.scale)
    subnormal, nonzero = window_of(seen, [1, 2, 3, 4])
    reading = scaler.losing_gradients()
    assert reading.subnormal_fraction == pytest.approx(subnormal / nonzero, rel=1e-12)
    assert reading.headroom_bits == pytest.approx(bits, rel=1e-6) == stats.headroom_bits
    expected = Measured(FLOAT16_MAX / 2.0**bits, 0, 1, subnormal, nonzero).reading("interval")
    assert expected.verdict.startswith("yes"), "the workload puts gradients near the floor"
    assert reading.verdict == expected.verdict
    with pytest.raises(RuntimeError, match="measure_every=N"):
        GradScaler().losing_gradients()


@pytest.mark.parametrize(
    "measured",
    [{"amax": 1.0, "subnormal": 2}, {"amax": -1.0, "subnormal": 0, "nonzero": 1}, "x"],
)
def test_a_bad_measurement_in_a_state_dict_is_refused_and_changes_nothing(measured):
    source = GradScaler(measure_every=1)
    run(source, 2)
    target = GradScaler(init_loss_scaling=8.0)
    before = target.state_dict()
    with pytest.raises(ValueError, match=r"state_dict\['measured'\]"):
        target.load_state_dict({**source.state_dict(), "measured": measured})
    after = target.state_dict()
    np.testing.assert_array_equal(after.pop("scale"), before.pop("scale"))
    assert after == before


def test_optimizers_of_other_parameters_in_turn_each_get_their_report():
    # Two models with as many parameters, stepped in turn: the report follows the last.
    first, second = make_model(seed=1), make_model(seed=2)
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=1)
    for model in (first, second, first, second):
        optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
        scaler.scale(loss_of(model, batches(steps=1)[0]) * 1e-6).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
    names = {p.name for p in second.parameters()}
    assert {entry.name for entry in scaler.underflow_report()} == names


class Attention(paddle.nn.Layer):
    """Self-attention and a classifier: the key projection's bias has a true gradient of
    zero (softmax is blind to a constant added to every score of a row), so what backward
    leaves in it is rounding noise."""

    def __init__(self):
        super().__init__()
        self.attention = paddle.nn.MultiHeadAttention(16, 2)
        self.head = paddle.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.attention(x, x, x).mean(1))


def test_the_report_puts_noise_last_and_the_window_leaves_it_out():
    paddle.seed(0)
    model = Attention()
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=model.parameters())
    scaler = GradScaler(init_loss_scaling=2.0**10, measure_every=1)
    x, y = paddle.randn([8, 5, 16]), paddle.randint(0, 4, [8])
    scaler.scale(paddle.nn.functional.cross_entropy(model(x), y) * 1e-3).backward()
    grads = {name: param.grad.numpy().copy() for name, param in model.named_parameters()}
    scaler.step(optimizer)
    scaler.update()

    rows = {name: expected_row(grad) for name, grad in grads.items()}
    noise = {name for name, (_, subnormal, nonzero) in rows.items() if 0 < subnormal == nonzero}
    assert noise == {"attention.k_proj.bias"}, "the key bias holds noise alone"
    names = [entry.name for entry in scaler.underflow_report(model)]
    assert names[-1] == "attention.k_proj.bias" and len(names) == len(rows)
    signal = [row for name, row in rows.items() if name not in noise]
    share = sum(row[1] for row in signal) / sum(row[2] for row in signal)
    assert scaler.losing_gradients().subnormal_fraction == pytest.approx(share, rel=1e-12)
    # stats() counts every gradient, as its contract says.
    every = sum(row[1] for row in rows.values()) / sum(row[2] for row in rows.values())
    assert scaler.stats().subnormal_fraction == pytest.approx(every, rel=1e-12) != share
