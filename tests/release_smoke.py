"""What a newcomer does first with the installed wheel, run by test_release.py inside a
fresh virtual environment, from a folder outside the checkout. Prints a JSON report."""

import importlib
import json
import os
import subprocess
import sys
import tempfile

# Imported before Paddle, the package keeps Paddle 3's import-time ccache warning quiet.
import paddle_amp_scaler  # isort: skip
import numpy as np
import paddle

from paddle_amp_scaler import GradScaler, load_checkpoint, save_checkpoint

PUBLIC_MODULES = [
    "paddle_amp_scaler",
    "paddle_amp_scaler.compat.torch",
    "paddle_amp_scaler.compat.mindspore",
    "paddle_amp_scaler.integrations",
    "paddle_amp_scaler.compat.keras",
    "paddle_amp_scaler.testing",
]
PUBLIC_NAMES = [
    "LossScaleOptimizer",
    "custom_fwd",
    "custom_bwd",
    "install",
    "uninstall",
    "auto_cast",
    "UnknownArgumentError",
]
POISONED_STEP = 2


def model_and_optimizer():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.Tanh(), paddle.nn.Linear(8, 1))
    return model, paddle.optimizer.Adam(learning_rate=0.01, parameters=model.parameters())


def batch(step):
    rng = np.random.default_rng(step)
    return (
        paddle.to_tensor(rng.standard_normal((16, 4)).astype("float32")),
        paddle.to_tensor(rng.standard_normal((16, 1)).astype("float32")),
    )


def train(model, optimizer, scaler, steps, poison=None):
    """Training steps; at step ``poison`` one gradient is inf, as an fp16 overflow makes it."""
    poisoned = {"on": False}
    model[0].weight.register_hook(
        lambda grad: paddle.full_like(grad, float("inf")) if poisoned["on"] else grad
    )
    params_at_poison = None
    for step in steps:
        poisoned["on"] = step == poison
        x, y = batch(step)
        if poisoned["on"]:
            params_at_poison = [p.numpy().copy() for p in model.parameters()]
        scaler.scale(paddle.nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        if poisoned["on"]:
            unchanged = all(
                np.array_equal(before, after.numpy())
                for before, after in zip(params_at_poison, model.parameters())
            )
    return [p.numpy() for p in model.parameters()], (unchanged if poison is not None else None)


def command_line(*args):
    """``python -m paddle_amp_scaler ARGS`` of this environment: (exit status, stdout)."""
    result = subprocess.run(
        [sys.executable, "-m", "paddle_amp_scaler", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result.returncode, result.stdout


def main():
    report = {
        "module_file": paddle_amp_scaler.__file__,
        "version": paddle_amp_scaler.__version__,
        "imported": [importlib.import_module(name).__name__ for name in PUBLIC_MODULES],
        "names": [name for name in PUBLIC_NAMES if hasattr(paddle_amp_scaler, name)],
    }

    model, optimizer = model_and_optimizer()
    scaler = GradScaler(init_loss_scaling=1024.0)
    _, report["skip_left_parameters_unchanged"] = train(
        model, optimizer, scaler, range(4), poison=POISONED_STEP
    )
    stats = scaler.stats()
    report["stats"] = {"iterations": stats.iterations, "skipped": stats.skipped}
    report["scale"] = stats.scale

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.ckpt")
        save_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler, step=4)
        straight, _ = train(model, optimizer, scaler, range(4, 7))
        resumed_model, resumed_optimizer = model_and_optimizer()
        resumed_scaler = GradScaler()
        step = load_checkpoint(
            path, model=resumed_model, optimizer=resumed_optimizer, scaler=resumed_scaler
        )
        resumed, _ = train(resumed_model, resumed_optimizer, resumed_scaler, range(step, 7))
        status, text = command_line("inspect", path)
        _, as_json = command_line("inspect", "--json", path)
        inspected = json.loads(as_json)
        report["inspect"] = {
            "status": status,
            "step_line": next(line for line in text.splitlines() if line.startswith("step")),
            "step": inspected["step"],
            "scale": inspected["scaler"]["scale"],
            "skipped": inspected["scaler"]["stats"]["skipped"],
        }
    status, text = command_line("doctor")
    _, as_json = command_line("doctor", "--json")
    doctor = json.loads(as_json)
    report["doctor"] = {
        "status": status,
        "last_line": text.strip().splitlines()[-1],
        "ok": doctor["ok"],
        "package": doctor["facts"]["package_file"],
    }
    report["resumed_step"] = step
    report["resume_identical"] = all(np.array_equal(a, b) for a, b in zip(straight, resumed))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
