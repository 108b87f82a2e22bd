"""report_overflows=True and overflow_report(): the gradients that held inf or nan, with
exact counts taken before unscaling, named as the model names them, and a log line per
skipped iteration, at one device read per iteration."""

import logging
import math
import pathlib
import re

import numpy as np
import paddle
import pytest
from counters import HostReadCounter

from paddle_amp_scaler import AmpScaler, GradScaler, OverflowEntry


def model_of_seven():
    paddle.seed(0)
    return paddle.nn.Sequential(
        paddle.nn.Linear(3, 4),
        paddle.nn.Linear(4, 5),
        paddle.nn.Linear(5, 2),
        paddle.nn.LayerNorm(2),
    )


def poison(model, plan):
    """Give every parameter a finite gradient, then write ``plan[name] = (infs, nans)``
    into the named ones: infs first, alternating signs, then nans."""
    for name, param in model.named_parameters():
        grad = np.full(param.shape, 1024.0, dtype="float32").reshape(-1)
        infs, nans = plan.get(name, (0, 0))
        grad[:infs] = [math.inf if i % 2 == 0 else -math.inf for i in range(infs)]
        grad[infs : infs + nans] = math.nan
        param.grad = paddle.to_tensor(grad.reshape(param.shape)).astype(param.dtype)


def iteration(scaler, model, optimizer, plan):
    poison(model, plan)
    if isinstance(scaler, GradScaler):
        scaler.step(optimizer)
        scaler.update()
    else:
        scaler.minimize(optimizer, paddle.zeros([1]))
    optimizer.clear_grad()


def setup(kind=GradScaler, **options):
    model = model_of_seven()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    return kind(init_loss_scaling=1024.0, report_overflows=True, **options), model, optimizer


@pytest.mark.parametrize("kind", [GradScaler, AmpScaler])
def test_the_report_names_exactly_the_poisoned_gradients(kind):
    scaler, model, optimizer = setup(kind)
    assert scaler.overflow_report(model) == []
    iteration(scaler, model, optimizer, {})
    plan = {"0.weight": (2, 1), "2.bias": (0, 2), "1.weight": (5, 0)}
    iteration(scaler, model, optimizer, plan)
    shapes = {name: tuple(param.shape) for name, param in model.named_parameters()}
    expected = [
        OverflowEntry(name, shapes[name], "float32", infs, nans, 2)
        for name, (infs, nans) in sorted(plan.items(), key=lambda item: -sum(item[1]))
    ]
    assert scaler.overflow_report(model) == expected
    # Without the model: Paddle's own names, the same counts.
    params = dict(model.named_parameters())
    assert scaler.overflow_report() == [
        OverflowEntry(params[e.name].name, e.shape, e.dtype, e.num_inf, e.num_nan, 2)
        for e in expected
    ]
    # Finite iterations after it leave the report of the last one that found any.
    iteration(scaler, model, optimizer, {})
    assert scaler.overflow_report(model) == expected
    iteration(scaler, model, optimizer, {"3.weight": (0, 1)})
    assert scaler.overflow_report(model) == [OverflowEntry("3.weight", (2,), "float32", 0, 1, 4)]


def test_counts_match_numpy_across_dtype_groups_and_optimizers():
    """Two optimizers, float32 and float64 gradients interleaved, tens of thousands of
    elements with inf, -inf, nan and -nan scattered at random: the counts are NumPy's."""
    rng = np.random.default_rng(7)
    paddle.seed(0)
    model = paddle.nn.Sequential(
        paddle.nn.Linear(100, 300), paddle.nn.Linear(300, 40), paddle.nn.Linear(40, 3)
    )
    model[1].to(dtype="float64")
    params = list(model.parameters())
    optimizers = [
        paddle.optimizer.SGD(learning_rate=0.1, parameters=params[:3]),
        paddle.optimizer.SGD(learning_rate=0.1, parameters=params[3:]),
    ]
    scaler = GradScaler(init_loss_scaling=1024.0, report_overflows=True)
    expected = {}
    for name, param in model.named_parameters():
        grad = rng.standard_normal(param.shape)
        flat = grad.reshape(-1)
        for value in (np.inf, -np.inf, np.nan, -np.nan):
            flat[rng.integers(0, flat.size, size=rng.integers(0, 40))] = value
        param.grad = paddle.to_tensor(grad).astype(param.dtype)
        infs, nans = int(np.isinf(grad).sum()), int(np.isnan(grad).sum())
        if infs or nans:
            expected[name] = (infs, nans, "float64" if name.startswith("1.") else "float32")
    for optimizer in optimizers:
        scaler.step(optimizer)
    scaler.update()
    assert len(expected) >= 4  # the draw poisoned most of the six
    report = scaler.overflow_report(model)
    assert {e.name: (e.num_inf, e.num_nan, e.dtype) for e in report} == expected
    assert [e.num_inf + e.num_nan for e in report] == sorted(
        (e.num_inf + e.num_nan for e in report), reverse=True
    )


def test_each_skipped_iteration_is_logged_with_up_to_five_names(caplog):
    scaler, model, optimizer = setup()
    plan = {name: (1, 0) for name, _ in model.named_parameters()}  # all eight
    with caplog.at_level(logging.WARNING, logger="paddle_amp_scaler"):
        iteration(scaler, model, optimizer, {})
        iteration(scaler, model, optimizer, plan)
    (record,) = [r for r in caplog.records if "skipped" in r.getMessage()]
    message = record.getMessage()
    assert message.startswith("iteration 2 skipped: inf/nan in ")
    assert message.count("(1 inf, 0 nan)") == 5 and message.endswith("and 3 more")


def test_the_monitoring_pages_sample_line_is_where_the_scaler_logs_it(caplog):
    # docs/monitoring.md shows the line in Paddle's format, source file and line included.
    page = pathlib.Path(__file__).parent.parent / "docs" / "monitoring.md"
    shown = re.search(
        r"\] (\w+\.py):(\d+) - (iteration \d+ skipped: inf/nan in )", page.read_text()
    )
    scaler, model, optimizer = setup()
    with caplog.at_level(logging.WARNING, logger="paddle_amp_scaler"):
        iteration(scaler, model, optimizer, {"0.weight": (1, 0)})
    (record,) = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert shown is not None
    assert (shown[1], int(shown[2])) == (record.filename, record.lineno)
    assert record.getMessage().startswith(shown[3])


def test_given_the_model_the_log_line_and_the_report_say_the_same_names(caplog):
    model = model_of_seven()
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    scaler = GradScaler(init_loss_scaling=1024.0, report_overflows=model)
    with caplog.at_level(logging.WARNING, logger="paddle_amp_scaler"):
        iteration(scaler, model, optimizer, {"0.bias": (1, 0), "2.weight": (0, 2)})
    (record,) = [r for r in caplog.records if "skipped" in r.getMessage()]
    report = scaler.overflow_report()
    assert [entry.name for entry in report] == ["2.weight", "0.bias"]
    assert record.getMessage() == (
        "iteration 1 skipped: inf/nan in 2.weight (0 inf, 2 nan), 0.bias (1 inf, 0 nan)"
    )
    # The model given again translates nothing further; True keeps Paddle's names.
    assert scaler.overflow_report(model) == report
    plain = GradScaler(init_loss_scaling=1024.0, report_overflows=True)
    iteration(plain, model, optimizer, {"0.bias": (1, 0)})
    assert plain.overflow_report()[0].name == model[0].bias.name


def test_report_overflows_takes_a_bool_or_a_model_and_names_what_it_got():
    with pytest.raises(TypeError, match="report_overflows must be a bool, or the model"):
        GradScaler(report_overflows=[1, 2])
    assert GradScaler(report_overflows=np.bool_(True))._monitors.overflows is not None


def test_one_read_per_iteration_with_the_report_and_none_without():
    for report, reads in ((True, 3), (False, 0)):
        model = model_of_seven()
        optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        scaler = GradScaler(init_loss_scaling=1024.0, report_overflows=report)
        counter = HostReadCounter()
        with counter.counting():
            for plan in ({}, {"0.bias": (1, 0)}, {}):
                iteration(scaler, model, optimizer, plan)
        assert counter.reads["scaler"] == reads, counter.where


def test_without_the_option_the_report_says_how_to_turn_it_on():
    with pytest.raises(RuntimeError, match="report_overflows=True"):
        GradScaler().overflow_report()


def test_report_overflows_must_be_a_bool():
    with pytest.raises(TypeError, match="report_overflows"):
        GradScaler(report_overflows="yes")
