"""The documentation's worked trace of the update rule is what the scaler does."""

import math
import os
import re

import paddle

from paddle_amp_scaler import GradScaler

from helpers import GradInjector, batches, make_model, train_step

CONCEPTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "concepts.md"
)
ROW = re.compile(r"^\| (\d+) \| (finite|inf|nan) \| (\d+) \| (\d+) \| (\d+) \| (yes|skipped)")


def test_worked_trace_in_concepts_matches_the_scaler():
    with open(CONCEPTS, encoding="utf-8") as page:
        rows = [ROW.match(line).groups() for line in page if ROW.match(line)]
    assert len(rows) >= 5
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = GradScaler(init_loss_scaling=1024, incr_every_n_steps=3, decr_every_n_nan_or_inf=2)
    data = batches(steps=len(rows))
    for (step, gradients, incr, decr, scale, taken), batch in zip(rows, data):
        inject = {"finite": None, "inf": math.inf, "nan": math.nan}[gradients]
        train_step(scaler, model, optimizer, batch, injector=injector, inject=inject)
        assert (
            scaler.get_incr_count(),
            scaler.get_decr_count(),
            scaler.get_loss_scaling(),
            bool(scaler._cache_found_inf),
        ) == (int(incr), int(decr), float(scale), taken == "skipped"), f"row {step}"
