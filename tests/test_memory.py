"""What a scaler keeps from one iteration to the next records no autograd history, and a
long run's memory stays flat.

Paddle hands out gradients that require gradients themselves (``stop_gradient=False``).
Whatever the scaler computes from them with autograd on records a graph, and a tensor it
keeps across iterations would chain one more graph onto the last every time it is
rewritten: the headroom policy's memory did so, about 12 MiB per 5,000 iterations,
until ``kernels._largest_magnitude`` measured the amax under ``paddle.no_grad()``.
Here every tensor the scaler keeps is held to ``stop_gradient=True`` under every policy,
option and face (fast), and ``benchmarks/soak.py``'s runs to a bound on memory growth
(``long``).
"""

import dataclasses
import json
import math
import os
import subprocess
import sys

import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler, LossScaleOptimizer
from paddle_amp_scaler.compat import mindspore as ms
from paddle_amp_scaler.compat import torch as pt

from helpers import GradInjector

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOAK = os.path.join(REPO, "benchmarks", "soak.py")

# Enough for the headroom policy to measure in iterations 1 to 3 and 64, the first of
# its periodic measurements, and to keep each result across several later iterations.
ITERATIONS = 70
# An inf in a measured iteration (calibration's back-off) and in an unmeasured one.
INJECT_AT = (2, 10)


class Loop:
    """A Linear trained by one face of the scaler; records whether the gradients the
    scaler saw required gradients, which is what makes the check below able to fail."""

    def __init__(self, optimizer_kind):
        paddle.seed(0)
        self.model = paddle.nn.Linear(8, 8)
        self.params = list(self.model.parameters())
        make = {"adamw": paddle.optimizer.AdamW, "sgd": paddle.optimizer.SGD}[optimizer_kind]
        self.optimizer = make(learning_rate=1e-3, parameters=self.params)
        self.injector = GradInjector(self.model.weight)
        self.x = paddle.randn([4, 8])
        self.grads_required_gradients = []

    def loss(self):
        return self.model(self.x).pow(2).mean()

    def saw(self, grads, inject):
        # An injected inf is a tensor of the hook's making, which requires none.
        if not inject:
            self.grads_required_gradients.append(all(not grad.stop_gradient for grad in grads))

    def step_update(self, scaler, inject):
        with self.injector.inject(math.inf if inject else None):
            scaler.scale(self.loss()).backward()
        self.saw([param.grad for param in self.params], inject)
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.clear_grad()
        return scaler

    def minimize(self, scaler, inject):
        with self.injector.inject(math.inf if inject else None):
            scaled = scaler.scale(self.loss())
            scaled.backward()
        self.saw([param.grad for param in self.params], inject)
        scaler.minimize(self.optimizer, scaled)
        self.optimizer.clear_grad()
        return scaler

    def keras_minimize(self, wrapped, inject):
        with self.injector.inject(math.inf if inject else None):
            wrapped.minimize(self.loss())  # runs the backward itself
        self.saw([param.grad for param in self.params], inject)
        wrapped.clear_grad()
        return wrapped.scaler

    def keras_apply_gradients(self, wrapped, inject):
        with self.injector.inject(math.inf if inject else None):
            wrapped.get_scaled_loss(self.loss()).backward()
        grads = wrapped.get_unscaled_gradients([param.grad for param in self.params])
        self.saw(grads, inject)
        wrapped.apply_gradients(list(zip(grads, self.params)))
        wrapped.clear_grad()
        return wrapped.scaler

    def mindspore_adjust(self, loss_scaler, inject):
        # Gradients from backward (paddle.grad's would not require gradients).
        with self.injector.inject(math.inf if inject else None):
            loss_scaler.scale(self.loss()).backward()
        grads = loss_scaler.unscale([param.grad for param in self.params])
        self.saw(grads, inject)
        finite = ms.all_finite(grads)
        if finite:
            self.optimizer.apply_gradients(list(zip(self.params, grads)))
        loss_scaler.adjust(finite)
        self.optimizer.clear_grad()
        return loss_scaler._scaler  # the face's inner scaler


def quiet(stats):
    """An ``on_stuck`` that says nothing: with ``stuck_after=1`` each injected inf sets
    it off, after the streak's read."""


# Each case: how to build the scaler (or face) and which of Loop's iterations drives it.
CASES = {
    "interval": (GradScaler, Loop.step_update),
    "headroom": (lambda: GradScaler(policy="headroom"), Loop.step_update),
    "headroom, minimize": (lambda: AmpScaler(policy="headroom"), Loop.minimize),
    "report_overflows": (lambda: GradScaler(report_overflows=True), Loop.step_update),
    "headroom, report_overflows": (
        lambda: GradScaler(policy="headroom", report_overflows=True),
        Loop.step_update,
    ),
    "stuck_after": (lambda: GradScaler(stuck_after=1, on_stuck=quiet), Loop.step_update),
    "fixed": (lambda: GradScaler(use_dynamic_loss_scaling=False), Loop.step_update),
    "torch": (pt.GradScaler, Loop.step_update),
    "torch, headroom": (lambda: pt.GradScaler(policy="headroom"), Loop.step_update),
    "keras": ("keras", Loop.keras_minimize),
    "keras, headroom": ("keras headroom", Loop.keras_minimize),
    "keras apply_gradients, headroom": ("keras headroom", Loop.keras_apply_gradients),
    "mindspore adjust": (
        lambda: ms.DynamicLossScaler(scale_value=2.0**10, scale_factor=2, scale_window=5),
        Loop.mindspore_adjust,
    ),
}


def build(make, loop):
    if make == "keras":
        return LossScaleOptimizer(loop.optimizer, dynamic_growth_steps=5)
    if make == "keras headroom":
        return LossScaleOptimizer(loop.optimizer, scaler=GradScaler(policy="headroom"))
    return make()


def kept_tensors(scaler):
    """The tensors the scaler keeps across iterations and rewrites from what it found in
    the gradients, by name: the rule's memory, the statistics' counts and the scale."""
    memory = scaler._loss_scale.memory
    kept = {
        f"memory.{field.name}": getattr(memory, field.name) for field in dataclasses.fields(memory)
    }
    kept["_monitors.run.counts"] = scaler._monitors.run.counts
    kept["_scale"] = scaler._scale
    return kept


@pytest.mark.parametrize("optimizer_kind", ["adamw", "sgd"])
@pytest.mark.parametrize("case", list(CASES))
def test_nothing_the_scaler_keeps_requires_gradients(case, optimizer_kind):
    make, iteration = CASES[case]
    loop = Loop(optimizer_kind)
    face = build(make, loop)
    for index in range(1, ITERATIONS + 1):
        scaler = iteration(loop, face, index in INJECT_AT)
    # What makes the check able to fail: the gradients the scaler saw required gradients.
    assert loop.grads_required_gradients == [True] * (ITERATIONS - len(INJECT_AT))
    stats = scaler.stats()
    assert stats.iterations == ITERATIONS and stats.skipped == len(INJECT_AT)
    if scaler._rule.name == "headroom":
        assert stats.headroom_bits is not None  # it measured
    requiring = {name for name, tensor in kept_tensors(scaler).items() if not tensor.stop_gradient}
    assert not requiring, f"{case}: {sorted(requiring)} require gradients"


# -- a long run ------------------------------------------------------------------------------

SOAK_ITERATIONS = 20_000
WARM_UP = 5_000
# RSS may grow by this much from iteration 5,000 to 20,000. Flat runs grow under 0.2 MiB
# there; the headroom policy's leak grew about 35 MiB (12 MiB per 5,000 iterations).
GROWTH_BOUND = 4 * 2**20


@pytest.mark.long
def test_a_long_run_keeps_its_memory_flat(tmp_path):
    results_path = tmp_path / "soak.json"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(part for part in [REPO, os.environ.get("PYTHONPATH")] if part),
    )
    completed = subprocess.run(
        [sys.executable, SOAK, "--iterations", str(SOAK_ITERATIONS), "--json", str(results_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=1800,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    print(completed.stdout)
    results = json.loads(results_path.read_text())["results"]
    assert {result["variant"] for result in results} == {
        "interval",
        "headroom",
        "report",
        "stuck",
        "fixed",
        "torch",
        "keras",
        "mindspore",
    }
    grown = {}
    for result in results:
        rss = {int(point): value for point, value in result["rss"].items()}
        grown[result["variant"]] = rss[SOAK_ITERATIONS] - rss[WARM_UP]
        # The run did what it says: an inf every 1000th iteration, each one skipped.
        assert result["stats"]["skipped"] == SOAK_ITERATIONS // 1000, result["variant"]
    too_much = {
        name: f"{value / 2**20:.2f} MiB" for name, value in grown.items() if value > GROWTH_BOUND
    }
    assert not too_much, f"RSS grew from iteration {WARM_UP} to {SOAK_ITERATIONS}: {too_much}"
