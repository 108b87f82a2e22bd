"""A gradient penalty under loss scaling, with paddle.grad(create_graph=True).

paddle.grad of a scaled loss returns scaled gradients: divide them by the scale
before forming the penalty, so that the penalty is computed on true values. Reading
the scale back costs one device sync per step, as in PyTorch's version of this pattern.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import GradScaler, auto_cast

from _common import parse_steps, toy_batches

steps = parse_steps(__doc__)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 64), paddle.nn.Tanh(), paddle.nn.Linear(64, 1))
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
scaler = GradScaler(init_loss_scaling=2.0**10)
params = list(model.parameters())
for x, y in toy_batches(steps):
    with auto_cast():
        loss = paddle.nn.functional.mse_loss(model(x), y)
    scaled_grads = paddle.grad(scaler.scale(loss), params, create_graph=True)
    inverse_scale = 1.0 / scaler.get_loss_scaling()
    grads = [g * inverse_scale for g in scaled_grads]
    with auto_cast():
        penalty = sum((g * g).sum() for g in grads)
        total = loss + 0.1 * penalty
    scaler.scale(total).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
print(f"last loss {float(loss):.4f}, last penalty {float(penalty):.5f}")
