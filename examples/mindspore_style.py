"""MindSpore's loss scaling on Paddle: the mindspore.amp functions, and a manager.

The functional loop is MindSpore's: scale the loss, take gradients (paddle.grad for
value_and_grad), unscale them, check all_finite, apply them only if finite, adjust the
scale. A DynamicLossScaleManager's get_update_cell() gives a GradScaler for the usual
loop. On a CPU, fp16 gradients are emulated, so the first steps overflow.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import auto_cast
from paddle_amp_scaler.compat.mindspore import (
    DynamicLossScaleManager,
    DynamicLossScaler,
    all_finite,
)
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import gpu_available, mlp, parse_steps, toy_batches

steps = parse_steps(__doc__)

# 1. mindspore.amp's functional API.
model = mlp()
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
params = model.parameters()
loss_scaler = DynamicLossScaler(scale_value=2**20, scale_factor=2, scale_window=10)
taken = 0
for x, y in toy_batches(steps):
    with auto_cast(enable=gpu_available()):
        loss = paddle.nn.functional.mse_loss(model(x), y)
    grads = paddle.grad(loss_scaler.scale(loss), params)
    if not gpu_available():  # round through float16 by hand: paddle.grad runs no param hooks
        grads = [g.astype("float16").astype("float32") for g in grads]
    grads = loss_scaler.unscale(grads)
    finite = all_finite(grads)  # a bool Tensor, computed on the device
    if finite:  # the loop's own read of the device, as in MindSpore
        optimizer.apply_gradients(list(zip(params, grads)))  # optimizer(grads)
        taken += 1
    loss_scaler.adjust(finite)  # on the device, no read

# 2. A loss-scale manager: its update cell is a GradScaler with the manager's policy.
model = mlp()
if not gpu_available():
    emulate_fp16_grads(model)
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
manager = DynamicLossScaleManager(init_loss_scale=2**20, scale_factor=2, scale_window=10)
scaler = manager.get_update_cell()
for x, y in toy_batches(steps):
    with auto_cast(enable=gpu_available()):
        loss = paddle.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # skipped if a gradient is inf/nan
    scaler.update()
    optimizer.clear_grad()

stats = scaler.stats()
print(
    f"functional: {steps - taken} of {steps} steps skipped, "
    f"scale_value {float(loss_scaler.scale_value):.0f}; update cell: {stats.skipped} of "
    f"{stats.iterations} skipped, scale {stats.scale:.0f}"
)
