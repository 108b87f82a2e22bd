"""A PyTorch AMP loop ported to Paddle by changing its imports: compat.torch.GradScaler.

The loop is the one of PyTorch's "Automatic Mixed Precision examples", with PyTorch's
names: init_scale, growth_interval, get_scale(), a five-key state_dict(). On a CPU,
fp16 gradients are emulated, so the large initial scale overflows and backs off.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler.compat.torch import GradScaler
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import gpu_available, mlp, parse_steps, toy_batches

steps = parse_steps(__doc__)
model = mlp()
if not gpu_available():
    emulate_fp16_grads(model)
optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
# GradScaler("cuda") without a GPU would warn and disable itself, as in PyTorch.
scaler = GradScaler("cuda" if gpu_available() else "cpu", init_scale=2.0**20, growth_interval=10)
skipped, scale = 0, scaler.get_scale()
for x, y in toy_batches(steps):
    optimizer.clear_grad()  # optimizer.zero_grad()
    with paddle.amp.auto_cast(enable=gpu_available()):  # torch.autocast("cuda")
        loss = paddle.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # optional: clip the true gradients here
    paddle.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)  # skipped if a gradient is inf/nan
    scaler.update()
    new_scale = scaler.get_scale()  # a device read, for the report only
    skipped += new_scale < scale  # PyTorch's idiom: a skipped step backs the scale off
    scale = new_scale
print(f"{steps} steps, {skipped} skipped, state_dict() {scaler.state_dict()}")
