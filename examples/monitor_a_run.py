"""Monitoring a run: stats(), last_step_skipped(), the overflow report and a stuck policy.

A float32 model with fp16 gradients emulated on a CPU, started at a scale far too large,
so that the first iterations overflow: the scaler says how many it skipped, which
gradients held inf or nan, and what it would do if a run never recovered.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import logging

import paddle

from paddle_amp_scaler import GradScaler
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import mlp, parse_steps, toy_batches

steps = parse_steps(__doc__)
# Paddle puts a handler of its own on the root logger when it is imported: basicConfig
# changes the format only with force=True, which replaces it.
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", force=True)
paddle.seed(0)  # the same weights every run: docs/monitoring.md shows this run's output
model = mlp()
emulate_fp16_grads(model)
optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
scaler = GradScaler(
    init_loss_scaling=2.0**24,
    incr_every_n_steps=50,
    max_loss_scaling=2.0**24,  # never above the start
    stuck_after=10,  # ten skipped iterations in a row: something else is wrong
    on_stuck="raise",
    # Per-gradient inf/nan counts (one device read per iteration), each gradient named as
    # the model names it, in the log lines and in the report alike.
    report_overflows=model,
)
scheduler_steps = 0
for x, y in toy_batches(steps):
    loss = paddle.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
    if not scaler.last_step_skipped():  # an LR scheduler would step here
        scheduler_steps += 1

print(scaler.stats())
print(f"steps that counted for the LR schedule: {scheduler_steps}")
for entry in scaler.overflow_report():
    print(entry)
