"""The shortest training loop with dynamic loss scaling: the README's example, runnable.

On a CPU, fp16 gradients are emulated so that the large initial scale overflows and the
scaler visibly backs off.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import GradScaler, auto_cast
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import gpu_available, mlp, parse_steps, toy_batches

steps = parse_steps(__doc__, default=300)
model = mlp()
if not gpu_available():
    emulate_fp16_grads(model)
optimizer = paddle.optimizer.AdamW(learning_rate=3e-3, parameters=model.parameters())
scaler = GradScaler(init_loss_scaling=2.0**20, incr_every_n_steps=100)
for step, (x, y) in enumerate(toy_batches(steps), start=1):
    with auto_cast(enable=gpu_available()):
        loss = paddle.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # skipped when a gradient is inf/nan
    scaler.update()
    optimizer.clear_grad()
    if step == 1 or step % 50 == 0:
        stats = scaler.stats()  # one device read, for the report only
        print(
            f"step {step:4d}  loss {float(loss):.4f}  scale {stats.scale:9.0f}"
            f"  skipped {stats.skipped}"
        )
