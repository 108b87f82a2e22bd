"""Gradient clipping on true gradients: unscale_ first, then clip, then step.

Clipping scaled gradients would clip at max_norm * scale; unscale_ divides them back
in place, and step() then knows not to unscale again.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import GradScaler, auto_cast

from _common import mlp, parse_steps, toy_batches

steps = parse_steps(__doc__)
model = mlp()
optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
scaler = GradScaler()
for x, y in toy_batches(steps):
    with auto_cast():
        loss = paddle.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # grads are true values now
    norm = paddle.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)  # skipped if inf/nan
    scaler.update()
    optimizer.clear_grad()
print(f"last loss {float(loss):.4f}, last grad norm before clipping {float(norm):.3f}")
