"""Gradient accumulation: several scaled backward passes, one step and one update.

The scale must not change between the micro-batches of one step, so update() comes
once per optimizer step, not once per backward pass.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import GradScaler, auto_cast

from _common import mlp, parse_steps, toy_batches

ACCUMULATE = 4
steps = parse_steps(__doc__)
model = mlp()
optimizer = paddle.optimizer.Momentum(learning_rate=0.01, parameters=model.parameters())
scaler = GradScaler()
for micro_step, (x, y) in enumerate(toy_batches(steps * ACCUMULATE), start=1):
    with auto_cast():
        loss = paddle.nn.functional.mse_loss(model(x), y) / ACCUMULATE
    scaler.scale(loss).backward()  # grads add up, scaled
    if micro_step % ACCUMULATE == 0:
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
print(
    f"{steps} optimizer steps of {ACCUMULATE} micro-batches, "
    f"last loss {float(loss) * ACCUMULATE:.4f}"
)
