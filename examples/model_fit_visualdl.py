"""paddle.Model.fit showing the loss scale and the skipped steps: ScalerCallback puts them in
the progress bar's line and in paddle.callbacks.VisualDL's log.

``install()`` makes the scaler that paddle.Model builds under ``amp_configs`` this
package's. On a CPU, fp16 gradients are emulated, so that the large initial scale
overflows and backs off; on a GPU the run is real fp16. The VisualDL log lands in
``--logdir`` (``visualdl --logdir vdl_fit`` serves it), and the script reads it back.

    python examples/model_fit_visualdl.py --logdir vdl_fit
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")
# Two of paddle.Model's own: auto_cast, which it enters under amp_configs, does nothing on
# a CPU, and it copies its inputs with to_tensor.
warnings.filterwarnings("ignore", message="amp_guard can only be enabled")
warnings.filterwarnings("ignore", message="To copy construct from a tensor")

import argparse
import os

import numpy as np
import paddle
from visualdl import LogReader

import paddle_amp_scaler
from paddle_amp_scaler.integrations import ScalerCallback
from paddle_amp_scaler.testing import emulate_fp16_grads

paddle_amp_scaler.install()  # paddle.Model builds paddle.amp.GradScaler: now ours


class Blobs(paddle.io.Dataset):
    """Three Gaussian blobs in 8 dimensions."""

    def __init__(self, size=960, seed=0):
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, 3, (size, 1)).astype("int64")
        centres = rng.standard_normal((3, 8)).astype("float32") * 3
        noise = rng.standard_normal((size, 8)).astype("float32")
        self.inputs = centres[self.labels[:, 0]] + noise

    def __getitem__(self, index):
        return self.inputs[index], self.labels[index]

    def __len__(self):
        return len(self.inputs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logdir", default="vdl_fit", help="VisualDL log folder")
    parser.add_argument("--epochs", type=int, default=2, help="passes (default: %(default)s)")
    args = parser.parse_args()

    paddle.seed(0)
    network = paddle.nn.Sequential(
        paddle.nn.Linear(8, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 3)
    )
    if not paddle.device.is_compiled_with_cuda():
        emulate_fp16_grads(network)
    model = paddle.Model(network)
    model.prepare(
        paddle.optimizer.Adam(learning_rate=1e-3, parameters=network.parameters()),
        paddle.nn.CrossEntropyLoss(),
        paddle.metric.Accuracy(),
        # A scale that starts far too high and tries to grow every ten steps: the bar shows
        # it backing off and skipping, then settling.
        amp_configs={"level": "O1", "init_loss_scaling": 2.0**20, "incr_every_n_steps": 10},
    )
    model.fit(
        Blobs(),
        batch_size=32,
        epochs=args.epochs,
        log_freq=10,
        verbose=2,
        callbacks=[ScalerCallback(), paddle.callbacks.VisualDL(log_dir=args.logdir)],
    )

    # Each run adds a file to the folder: this run's is the newest.
    logs = [os.path.join(args.logdir, n) for n in os.listdir(args.logdir) if "vdlrecords" in n]
    reader = LogReader(file_path=max(logs, key=os.path.getmtime))
    for tag in ("train/loss", "train/loss_scale", "train/skipped"):
        last = reader.get_data("scalar", tag)[-1]
        print(f"VisualDL {tag}: {len(reader.get_data('scalar', tag))} points, last {last.value:g}")


if __name__ == "__main__":
    main()
