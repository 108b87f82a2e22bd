"""PaddleFormers' Trainer with fp16=True, unchanged, on this package's scaler: install().

The Trainer builds its scaler as ``paddle.amp.GradScaler(...)``; after ``install()``
that name is ours, so the Trainer trains on a CPU too (Paddle's own scaler switches
itself off there) and skips the iterations whose gradients overflow. Two training
samples are poisoned with values whose loss overflows float32; the Trainer's master
gradients (``amp_master_grad``, on by default) are what the scaler checks.

``ScalerTrainerCallback.attach(trainer)`` puts the loss scale and the skipped steps in
every log the Trainer makes, where its ``report_to`` integrations see them: here
VisualDL, whose log the script reads back.

Needs ``pip install paddleformers``, which is not part of this project's test
environment (it wants its own NumPy and PyArrow versions): run it in a separate one.
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import argparse
import logging
import os
import tempfile

import paddle_amp_scaler

paddle_amp_scaler.install()  # first, then import the trainer

import numpy as np
import paddle
from paddleformers.trainer import Trainer, TrainingArguments
from visualdl import LogReader

from paddle_amp_scaler.integrations import ScalerTrainerCallback

POISONED = [3, 100]


class Regression(paddle.nn.Layer):
    """A model as the Trainer wants it: keyword inputs, (loss, output) returned."""

    def __init__(self):
        super().__init__()
        self.net = paddle.nn.Sequential(
            paddle.nn.Linear(8, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1)
        )

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return paddle.nn.functional.mse_loss(out, labels), out


class Samples(paddle.io.Dataset):
    def __init__(self, poisoned=(), n=256):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((n, 8)).astype("float32")
        self.y = (self.x @ rng.standard_normal(8)).astype("float32")
        self.x[list(poisoned)] = 3e38  # squared in the loss: inf

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return {"x": self.x[index], "labels": self.y[index]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    steps = parser.parse_args().steps
    if steps < 1:
        parser.error("--steps must be at least 1")
    logging.getLogger("paddleformers").setLevel(logging.WARNING)
    paddle.seed(0)
    model = Regression()
    with tempfile.TemporaryDirectory() as output_dir:
        arguments = TrainingArguments(
            output_dir=output_dir,
            fp16=True,
            scale_loss=2.0**24,
            max_steps=steps,
            per_device_train_batch_size=16,
            learning_rate=1e-2,
            save_strategy="no",
            logging_steps=10,
            logging_dir=os.path.join(output_dir, "vdl"),
            report_to=["visualdl"],
            device="cpu",
        )
        trainer = Trainer(model=model, args=arguments, train_dataset=Samples(POISONED))
        print(
            f"the Trainer built {type(trainer.scaler).__module__}.{type(trainer.scaler).__name__}"
        )
        ScalerTrainerCallback.attach(trainer)  # ahead of report_to's VisualDL callback
        trainer.train()
        print_visualdl_log(arguments.logging_dir)
    print(trainer.scaler.stats())
    print("parameters finite:", all(bool(paddle.isfinite(p).all()) for p in model.parameters()))
    clean = Samples()
    keep = np.setdiff1d(np.arange(len(clean)), POISONED)
    loss, _ = model(paddle.to_tensor(clean.x[keep]), paddle.to_tensor(clean.y[keep]))
    print(f"loss on the clean samples after training: {float(loss):.4f}")


def print_visualdl_log(folder):
    """The loss scale and the skips as VisualDL recorded them, from its own log file."""
    (name,) = (n for _, _, names in os.walk(folder) for n in names if n.startswith("vdlrecords"))
    (path,) = (os.path.join(d, name) for d, _, names in os.walk(folder) if name in names)
    reader = LogReader(file_path=path)
    for tag in ("train/loss_scale", "train/skipped_steps", "train/skip_streak"):
        points = reader.get_data("scalar", tag)
        print(f"VisualDL {tag}: " + ", ".join(f"{p.id}: {p.value:g}" for p in points))


if __name__ == "__main__":
    main()
