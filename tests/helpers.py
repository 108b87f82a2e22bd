"""Shared test helpers: tiny models, overflow injection, host-read counting, Paddle's oracle."""

import contextlib
import importlib.util
import os
import pickle
import types

import numpy as np
import paddle

from paddle_amp_scaler import checkpoint


def make_model(seed=0, hidden=16, depth=2):
    paddle.seed(seed)
    layers = [paddle.nn.Linear(8, hidden), paddle.nn.Tanh()]
    for _ in range(depth - 1):
        layers += [paddle.nn.Linear(hidden, hidden), paddle.nn.Tanh()]
    layers.append(paddle.nn.Linear(hidden, 4))
    return paddle.nn.Sequential(*layers)


def batches(seed=0, steps=6, size=16):
    rng = np.random.default_rng(seed)
    return [
        (
            paddle.to_tensor(rng.standard_normal((size, 8)).astype("float32")),
            paddle.to_tensor(rng.standard_normal((size, 4)).astype("float32")),
        )
        for _ in range(steps)
    ]


def loss_of(model, batch):
    x, y = batch
    return paddle.nn.functional.mse_loss(model(x), y)


def finish_step(scaler, optimizer, api="step_update", scaled=None):
    """The optimizer half of a training step: plain, ``step`` + ``update``, or ``minimize``."""
    if scaler is None:
        optimizer.step()
    elif api == "minimize":
        scaler.minimize(optimizer, scaled)
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.clear_grad()


def train_step(
    scaler, model, optimizer, batch, api="step_update", injector=None, inject=None, loss_factor=1.0
):
    """One whole training step, with ``inject`` (inf/nan) written into one gradient."""
    with injector.inject(inject) if injector is not None else contextlib.nullcontext():
        loss = loss_of(model, batch) * loss_factor
        scaled = loss if scaler is None else scaler.scale(loss)
        scaled.backward()
    finish_step(scaler, optimizer, api, scaled)


def assert_arrays_equal(actual, expected):
    """Two lists of arrays, or two dicts of them, equal bit for bit."""
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        # By key: the order in which an optimizer created its state may differ.
        actual, expected = [actual[key] for key in expected], list(expected.values())
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        np.testing.assert_array_equal(got, want)


def params_of(model):
    return [p.numpy().copy() for p in model.parameters()]


def optimizer_state_of(optimizer, params):
    """Every accumulator and master weight, as numpy, keyed by parameter position and kind.

    Paddle names accumulators after the parameter's global unique name, which differs
    between two otherwise identical runs; the position in ``params`` does not.
    """
    names = sorted(
        ((p.name, f"param{i}") for i, p in enumerate(params)), key=lambda pair: -len(pair[0])
    )
    state = {}
    for key, value in optimizer.state_dict().items():
        if isinstance(value, paddle.Tensor):
            for name, position in names:
                if key.startswith(name):
                    key = position + key[len(name) :]
                    break
            state[key] = value.numpy().copy()
    return state


class GradInjector:
    """Replaces one parameter's gradient with inf or nan on the backward passes chosen."""

    def __init__(self, param):
        self.value = None
        param.register_hook(self._hook)

    def _hook(self, grad):
        if self.value is None:
            return grad
        return paddle.full_like(grad, self.value)

    @contextlib.contextmanager
    def inject(self, value):
        self.value = value
        try:
            yield
        finally:
            self.value = None


def paddle_oracle(monkeypatch, **kwargs):
    """Paddle's own GradScaler, enabled on CPU, for step-by-step comparison.

    It switches itself off unless the tracer reports a GPU place and the global AMP
    dtype is float16; and its back-off log line calls float() on a shape-[1] tensor,
    which NumPy 2 refuses. All three are patched for the test's duration.
    """
    from paddle.amp import grad_scaler
    from paddle.amp.auto_cast import amp_global_state

    gpu_place = types.SimpleNamespace(
        is_gpu_place=lambda: True, is_xpu_place=lambda: False, is_custom_place=lambda: False
    )
    monkeypatch.setattr(
        grad_scaler, "_dygraph_tracer", lambda: types.SimpleNamespace(_expected_place=gpu_place)
    )
    monkeypatch.setattr(amp_global_state(), "amp_dtype", "float16")
    original_float = paddle.Tensor.__float__
    monkeypatch.setattr(
        paddle.Tensor,
        "__float__",
        lambda t: original_float(t.reshape([])) if t.size == 1 else original_float(t),
    )
    oracle = paddle.amp.GradScaler(**kwargs)
    if not oracle.is_enable():
        raise RuntimeError("could not enable Paddle's GradScaler on CPU for the oracle")
    return oracle


def oracle_skipped(oracle):
    """Whether Paddle's scaler skipped its last step (Paddle 2.6 misspells the field)."""
    if hasattr(oracle, "_cache_founf_inf"):
        return bool(oracle._cache_founf_inf)
    return bool(oracle._cache_found_inf)


class WritesAMarker:
    """Unpickled, it opens (creates) ``marker``: what a crafted file could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_payload(path, payload, body=None):
    """A checkpoint file with a valid header and checksum around any ``payload`` (or
    around a pickle ``body`` as it is)."""
    body = pickle.dumps(payload, protocol=4) if body is None else body
    path.write_bytes(checkpoint.file_format.framed(body))


def tool(name):
    """A script of tools/, imported."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Writer:
    """A VisualDL-like writer that keeps each tag's latest scalar."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, tag, value, step):
        self.scalars[tag] = value
