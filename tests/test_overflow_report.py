"""report_overflows=True and overflow_report(): the gradients that held inf or nan, with
exact counts taken before unscaling, named as the model names them, and a log line per
skipped iteration, at one device read per iteration."""

import logging
import math

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler, OverflowEntry
from paddle_amp_scaler.testing import HostReadCounter


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
        param.grad = paddle.to_tensor(grad.reshape(param.shape))


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
