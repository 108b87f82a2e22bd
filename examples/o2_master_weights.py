"""Paddle's O2 level: decorate() casts the model to float16 and gives the optimizer
float32 master weights; the scaler works on the float16 gradients.

O2 needs float16 kernels, which Paddle's CPU build lacks for matmul: on a CPU,
decorate() leaves the model float32 and the optimizer as it was (Paddle applies O2 on
GPU, XPU and custom devices only). The script prints what decorate() set up, and
trains only on a GPU.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import GradScaler, auto_cast, decorate

from _common import gpu_available, mlp, parse_steps, toy_batches

steps = parse_steps(__doc__)
model = mlp()
optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
model, optimizer = decorate(
    models=model, optimizers=optimizer, level="O2", dtype="float16", master_weight=True
)
dtypes = sorted({str(p.dtype).replace("paddle.", "") for p in model.parameters()})
print(
    f"after decorate(level='O2'): parameter dtypes {dtypes}, "
    f"multi-precision optimizer: {optimizer._multi_precision}"
)

if not gpu_available():
    print(
        "CPU: decorate() applies O2 on GPU/XPU/custom devices only; to see overflow and "
        "back-off on a CPU, use paddle_amp_scaler.testing.emulate_fp16_grads instead"
    )
else:
    scaler = GradScaler()
    for x, y in toy_batches(steps):
        with auto_cast(level="O2"):
            loss = paddle.nn.functional.mse_loss(model(x), y.astype("float16"))
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # master weights updated in fp32
        scaler.update()
        optimizer.clear_grad()
    print(f"last loss {float(loss):.4f}, scale {scaler.get_loss_scaling():.0f}")
