"""The scaler reads nothing back to the host during a training step: Paddle's optimizers
read the found-inf flag once per step, and plain SGD needs no read at all."""

import math

import paddle
import pytest
from counters import HostReadCounter

from paddle_amp_scaler import AmpScaler, GradScaler

from helpers import GradInjector, batches, loss_of, make_model
from test_training_equivalence import OPTIMIZERS

# Reads per step made inside Paddle's optimizer when it is handed the flag.
EXPECTED_TOTAL = {"sgd": 0, "sgd_weight_decay": 1, "momentum": 1, "adam": 1, "adamw": 1}


@pytest.mark.parametrize("policy", ["interval", "headroom"])
@pytest.mark.parametrize("inject", [None, math.inf])
@pytest.mark.parametrize("api", ["step_update", "minimize"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_host_reads_per_training_step(name, api, inject, policy):
    model = make_model()
    optimizer = OPTIMIZERS[name](model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = (GradScaler if api == "step_update" else AmpScaler)(
        init_loss_scaling=2.0**10, policy=policy
    )
    counter = HostReadCounter()
    for step, batch in enumerate(batches(steps=3)):
        loss = loss_of(model, batch)
        with counter.counting(), injector.inject(inject if step == 2 else None):
            scaled = scaler.scale(loss)
            scaled.backward()
            if api == "minimize":
                scaler.minimize(optimizer, scaled)
            else:
                scaler.unscale_(optimizer)
                scaler.step(optimizer)
                scaler.update()
            optimizer.clear_grad()
    assert counter.reads["scaler"] == 0, counter.where
    assert counter.total() == 3 * EXPECTED_TOTAL[name], counter.where


def test_counter_sees_reads():
    # The counter itself must be able to fail: a read it cannot see would pass anything.
    counter = HostReadCounter()
    flag = paddle.to_tensor([True])
    with counter.counting():
        bool(flag)
        flag.numpy()
        float(paddle.to_tensor(1.0))
    assert counter.reads["other"] == 3


def test_a_foreign_optimizer_costs_one_read_by_the_scaler(caplog):
    class HandRolledSGD:
        """Takes no found-inf flag: the scaler has to decide on the host."""

        def __init__(self, params):
            self._parameter_list = list(params)

        @paddle.no_grad()
        def step(self):
            for param in self._parameter_list:
                param.set_value(param - 0.1 * param.grad)

    model = make_model()
    optimizer = HandRolledSGD(model.parameters())
    scaler = GradScaler(init_loss_scaling=2.0**10)
    counter = HostReadCounter()
    with counter.counting(), caplog.at_level("INFO", logger="paddle_amp_scaler"):
        scaler.scale(loss_of(model, batches(steps=1)[0])).backward()
        scaler.step(optimizer)
        scaler.update()
    assert counter.reads["scaler"] == 1
    assert "HandRolledSGD takes no found-inf flag" in caplog.text
