"""install() / uninstall(): Paddle's trainers build this package's scalers unchanged, and
Paddle's own classes come back exactly."""

import numpy as np
import paddle
import paddle.amp
import pytest
from paddle.amp import grad_scaler as paddle_grad_scaler

import paddle_amp_scaler
from paddle_amp_scaler.install import installed
from paddle_amp_scaler.testing import emulate_fp16_grads

# Paddle's own classes, as this test module found them.
PADDLES = {name: getattr(paddle_grad_scaler, name) for name in ("AmpScaler", "GradScaler")}
PLACES = {"paddle.amp": paddle.amp, "paddle.amp.grad_scaler": paddle_grad_scaler}


@pytest.fixture(autouse=True)
def paddles_classes_afterwards():
    yield
    paddle_amp_scaler.uninstall()


def names_now():
    return {
        f"{place}.{name}": getattr(module, name)
        for place, module in PLACES.items()
        for name in PADDLES
    }


def test_install_and_uninstall_are_exact_and_idempotent():
    assert PADDLES["GradScaler"].__module__ == "paddle.amp.grad_scaler"
    before = names_now()
    assert not installed()
    for _ in range(2):
        paddle_amp_scaler.install()
        assert installed()
        assert names_now() == {
            key: getattr(paddle_amp_scaler, key.rsplit(".", 1)[1]) for key in before
        }
    for _ in range(2):
        paddle_amp_scaler.uninstall()
        assert not installed()
        assert names_now() == before


def test_a_trainer_that_looks_the_name_up_builds_ours():
    paddle_amp_scaler.install()
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0, incr_every_n_steps=100)
    assert isinstance(scaler, paddle_amp_scaler.GradScaler)
    assert scaler.is_enable()  # on a CPU, where Paddle's own switches itself off
    paddle_amp_scaler.uninstall()
    with pytest.warns(UserWarning):
        assert not paddle.amp.GradScaler(init_loss_scaling=1024.0).is_enable()


class Data(paddle.io.Dataset):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((64, 8)).astype("float32")
        self.y = rng.integers(0, 3, (64, 1)).astype("int64")

    def __getitem__(self, index):
        return self.x[index], self.y[index]

    def __len__(self):
        return len(self.x)


def test_paddle_model_trains_and_skips_with_ours_after_install():
    # paddle.Model builds paddle.amp.GradScaler(**amp_configs) inside fit().
    paddle_amp_scaler.install()
    paddle.seed(0)
    network = paddle.nn.Sequential(
        paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 3)
    )
    emulate_fp16_grads(network)
    before = [p.numpy().copy() for p in network.parameters()]
    model = paddle.Model(network)
    model.prepare(
        paddle.optimizer.Adam(learning_rate=1e-3, parameters=network.parameters()),
        paddle.nn.CrossEntropyLoss(),
        amp_configs={"level": "O1", "init_loss_scaling": 2.0**22},
    )
    with pytest.warns(UserWarning, match="amp_guard"):  # Paddle's auto_cast on a CPU
        model.fit(Data(), batch_size=8, epochs=2, verbose=0)
    scaler = model._adapter.model._scaler
    assert isinstance(scaler, paddle_amp_scaler.GradScaler)
    stats = scaler.stats()
    # 2**22 overflows the emulated float16 gradients until it has backed off enough.
    assert stats.iterations == 16 and 1 <= stats.skipped < 16
    assert stats.scale == 2.0**22 / 2**stats.backoffs
    after = [p.numpy() for p in network.parameters()]
    assert all(np.isfinite(p).all() for p in after)
    assert any(not np.array_equal(a, b) for a, b in zip(after, before))
