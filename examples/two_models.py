"""Two models, two losses, two optimizers, one scaler and one update() per iteration.

Each optimizer skips on its own inf/nan check; update() backs the scale off if either
one found inf/nan. Both losses are scaled by the same factor.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import paddle

from paddle_amp_scaler import GradScaler, auto_cast

from _common import mlp, parse_steps, toy_batches

steps = parse_steps(__doc__)
encoder, head = mlp(outputs=8), mlp(features=8)
opt_encoder = paddle.optimizer.Adam(learning_rate=1e-3, parameters=encoder.parameters())
opt_head = paddle.optimizer.SGD(learning_rate=1e-2, parameters=head.parameters())
scaler = GradScaler()
for x, y in toy_batches(steps):
    with auto_cast():
        features = encoder(x)
        loss_main = paddle.nn.functional.mse_loss(head(features), y)
        loss_aux = features.pow(2).mean() * 1e-3  # a regulariser on the encoder
    scaler.scale(loss_main).backward(retain_graph=True)
    scaler.scale(loss_aux).backward()
    scaler.step(opt_encoder)
    scaler.step(opt_head)
    scaler.update()  # once, for both
    opt_encoder.clear_grad()
    opt_head.clear_grad()
print(
    f"last losses {float(loss_main):.4f} / {float(loss_aux):.6f}, "
    f"scale {scaler.get_loss_scaling():.0f}"
)
