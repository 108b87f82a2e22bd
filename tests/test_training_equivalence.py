"""With a power-of-two scale, scaling and unscaling are exact: training with the scaler
must give bit-for-bit the parameters of the same training without it."""

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler

from helpers import (
    batches,
    finish_step,
    loss_of,
    make_model,
    optimizer_state_of,
    params_of,
    train_step,
)

OPTIMIZERS = {
    "sgd": lambda params: paddle.optimizer.SGD(learning_rate=0.05, parameters=params),
    "sgd_weight_decay": lambda params: paddle.optimizer.SGD(
        learning_rate=0.05, parameters=params, weight_decay=0.01
    ),
    "momentum": lambda params: paddle.optimizer.Momentum(
        learning_rate=0.05, momentum=0.9, parameters=params
    ),
    "adam": lambda params: paddle.optimizer.Adam(learning_rate=0.01, parameters=params),
    "adamw": lambda params: paddle.optimizer.AdamW(
        learning_rate=0.01, parameters=params, weight_decay=0.05
    ),
}


def assert_same_training(train_plain, train_scaled):
    plain_params, plain_state = train_plain()
    scaled_params, scaled_state = train_scaled()
    for plain, scaled in zip(plain_params, scaled_params):
        np.testing.assert_array_equal(scaled, plain)
    assert scaled_state.keys() == plain_state.keys()
    for key in plain_state:
        np.testing.assert_array_equal(scaled_state[key], plain_state[key], err_msg=key)


def run(make_optimizer, scaler=None, api="step_update", steps=6):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    for batch in batches(steps=steps):
        train_step(scaler, model, optimizer, batch, api)
    return params_of(model), optimizer_state_of(optimizer, model.parameters())


@pytest.mark.parametrize("api", ["step_update", "minimize"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_scaled_training_equals_plain_training(name, api):
    make_optimizer = OPTIMIZERS[name]
    # incr_every_n_steps=2: the scale also changes (exactly) during the run.
    scaler = GradScaler(init_loss_scaling=2.0**12, incr_every_n_steps=2)
    assert_same_training(lambda: run(make_optimizer), lambda: run(make_optimizer, scaler, api))
    assert scaler.get_loss_scaling() == 2.0**15


def test_amp_scaler_minimize_equals_plain_training():
    assert_same_training(
        lambda: run(OPTIMIZERS["adam"]), lambda: run(OPTIMIZERS["adam"], AmpScaler(), "minimize")
    )


def test_param_groups():
    def make_optimizer(params):
        params = list(params)
        return paddle.optimizer.Momentum(
            learning_rate=0.05,
            momentum=0.9,
            parameters=[
                {"params": params[:2], "learning_rate": 0.5},
                {"params": params[2:], "weight_decay": 0.01},
            ],
        )

    assert_same_training(
        lambda: run(make_optimizer),
        lambda: run(make_optimizer, GradScaler(init_loss_scaling=2.0**8)),
    )


def test_unscale_then_clip_by_global_norm():
    def train(scaler):
        model = make_model()
        optimizer = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
        for batch in batches():
            loss = loss_of(model, batch)
            if scaler is None:
                loss.backward()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            # A small max_norm so that clipping really changes the gradients.
            paddle.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
            finish_step(scaler, optimizer)
        return params_of(model), optimizer_state_of(optimizer, model.parameters())

    assert_same_training(lambda: train(None), lambda: train(GradScaler(init_loss_scaling=2.0**10)))


def test_gradient_accumulation():
    def train(scaler, micro_batches=3):
        model = make_model()
        optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())
        data = batches(steps=9)
        for start in range(0, len(data), micro_batches):
            for batch in data[start : start + micro_batches]:
                loss = loss_of(model, batch) / micro_batches
                (loss if scaler is None else scaler.scale(loss)).backward()
            finish_step(scaler, optimizer)
        return params_of(model), optimizer_state_of(optimizer, model.parameters())

    assert_same_training(
        lambda: train(None),
        lambda: train(GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=1)),
    )


def test_two_optimizers_one_update():
    def train(scaler):
        encoder, head = make_model(seed=1), make_model(seed=2)
        opt_encoder = paddle.optimizer.Adam(learning_rate=0.01, parameters=encoder.parameters())
        opt_head = paddle.optimizer.Momentum(learning_rate=0.05, parameters=head.parameters())
        for x, y in batches():
            hidden = encoder(x)
            loss = paddle.nn.functional.mse_loss(head(paddle.concat([hidden, hidden], 1)), y)
            (loss if scaler is None else scaler.scale(loss)).backward()
            for optimizer in (opt_encoder, opt_head):
                if scaler is None:
                    optimizer.step()
                else:
                    scaler.step(optimizer)
            if scaler is not None:
                scaler.update()
            opt_encoder.clear_grad()
            opt_head.clear_grad()
        return (
            params_of(encoder) + params_of(head),
            {
                **{
                    "encoder." + k: v
                    for k, v in optimizer_state_of(opt_encoder, encoder.parameters()).items()
                },
                **{
                    "head." + k: v
                    for k, v in optimizer_state_of(opt_head, head.parameters()).items()
                },
            },
        )

    scaler = GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=2)
    assert_same_training(lambda: train(None), lambda: train(scaler))
    # One update per iteration, not one per optimizer: 6 iterations, growth every 2.
    assert scaler.get_loss_scaling() == 2.0**13


def test_float64_model():
    def make_optimizer(params):
        return paddle.optimizer.Adam(learning_rate=0.01, parameters=params)

    def train(scaler):
        paddle.set_default_dtype("float64")
        try:
            model = make_model()
            optimizer = make_optimizer(model.parameters())
            for x, y in batches():
                loss = paddle.nn.functional.mse_loss(
                    model(x.astype("float64")), y.astype("float64")
                )
                if scaler is None:
                    loss.backward()
                    optimizer.step()
                else:
                    scaled = scaler.scale(loss)
                    assert scaled.dtype == paddle.float64
                    scaled.backward()
                    scaler.step(optimizer)
                    scaler.update()
                optimizer.clear_grad()
            return params_of(model), optimizer_state_of(optimizer, model.parameters())
        finally:
            paddle.set_default_dtype("float32")

    assert_same_training(lambda: train(None), lambda: train(GradScaler(init_loss_scaling=2.0**10)))
