"""Custom PyLayers under auto_cast: custom_fwd and custom_bwd, as PyTorch has for Functions.

Paddle runs a PyLayer's backward under whatever autocast state is current when
backward() runs, usually none. @custom_fwd records the forward's state and @custom_bwd
restores it, so MatMul's backward runs in float16 like its forward;
@custom_fwd(cast_inputs=paddle.float32) runs Softplus in float32 with autocast off.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle
from paddle.autograd import PyLayer

from paddle_amp_scaler import GradScaler, auto_cast, custom_bwd, custom_fwd
from paddle_amp_scaler.testing import emulate_fp16_grads

from _common import gpu_available, parse_steps, toy_batches


class MatMul(PyLayer):
    @staticmethod
    @custom_fwd
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return paddle.matmul(x, w)  # float16 under auto_cast, as any matmul

    @staticmethod
    @custom_bwd
    def backward(ctx, grad):  # under the forward's autocast state
        x, w = ctx.saved_tensor()
        # custom_bwd gives each gradient its input's dtype (float32 for the weights).
        grad_w = paddle.matmul(x, grad, transpose_x=True)
        if x.stop_gradient:  # Paddle wants None for an input that takes no gradient
            return None, grad_w
        return paddle.matmul(grad, w, transpose_y=True), grad_w


class Softplus(PyLayer):
    @staticmethod
    @custom_fwd(cast_inputs=paddle.float32)  # float32, whatever the autocast state
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return paddle.log1p(paddle.exp(-x.abs())) + paddle.nn.functional.relu(x)

    @staticmethod
    @custom_bwd
    def backward(ctx, grad):  # float32, autocast off; the gradient gets x's dtype back
        (x,) = ctx.saved_tensor()
        return grad * paddle.nn.functional.sigmoid(x)


class Net(paddle.nn.Layer):
    def __init__(self, features=16, hidden=64):
        super().__init__()
        self.weight = self.create_parameter([features, hidden])
        self.head = paddle.nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(Softplus.apply(MatMul.apply(x, self.weight)))


steps = parse_steps(__doc__)
model = Net()
if not gpu_available():
    emulate_fp16_grads(model)
optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
scaler = GradScaler(init_loss_scaling=2.0**20, incr_every_n_steps=10)
for x, y in toy_batches(steps):
    with auto_cast(enable=gpu_available()):
        loss = paddle.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()  # runs MatMul's and Softplus's backward
    scaler.step(optimizer)
    scaler.update()
    optimizer.clear_grad()
stats = scaler.stats()
print(
    f"{stats.iterations} steps, {stats.skipped} skipped, scale {stats.scale:.0f}, "
    f"last loss {float(loss):.4f}"
)
