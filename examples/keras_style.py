"""TensorFlow/Keras' LossScaleOptimizer on Paddle: minimize(loss), and the custom loop.

minimize(loss) does the whole iteration: scale the loss, run its backward, unscale and
check the gradients, step or skip, update the scale. The custom loop writes the same
iteration out as TensorFlow's mixed-precision guide does, with paddle.grad for the
gradient tape. On a CPU, fp16 gradients are emulated, so the first steps overflow.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import LossScaleOptimizer, auto_cast
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import gpu_available, mlp, parse_steps, toy_batches


def minimize_step(optimizer, loss, params):
    optimizer.minimize(loss)  # runs loss.backward() itself, as in TensorFlow
    optimizer.clear_grad()  # but does not clear the gradients


def custom_step(optimizer, loss, params):
    scaled_grads = paddle.grad(optimizer.get_scaled_loss(loss), params)  # tape.gradient
    if not gpu_available():  # emulate_fp16_grads hooks backward(), not paddle.grad
        scaled_grads = [g.astype("float16").astype("float32") for g in scaled_grads]
    grads = optimizer.get_unscaled_gradients(scaled_grads)
    optimizer.apply_gradients(zip(grads, params))  # (grad, param) pairs, TF's order


steps = parse_steps(__doc__)
results = []
for train_step in (minimize_step, custom_step):
    model = mlp()
    if not gpu_available():
        emulate_fp16_grads(model)
    inner = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
    optimizer = LossScaleOptimizer(inner, initial_scale=2.0**20, dynamic_growth_steps=10)
    for x, y in toy_batches(steps):
        with auto_cast(enable=gpu_available()):  # set_global_policy("mixed_float16")
            loss = paddle.nn.functional.mse_loss(model(x), y)
        train_step(optimizer, loss, model.parameters())
    stats = optimizer.scaler.stats()  # one device read
    results.append(
        f"{train_step.__name__}: {stats.skipped} of {stats.iterations} steps skipped, "
        f"loss_scale {float(optimizer.loss_scale):.0f}"
    )
print("; ".join(results))
