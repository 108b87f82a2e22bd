"""Train a digit classifier with mixed precision and dynamic loss scaling, under both
loss-scale policies side by side.

The handwritten digits that ship with scikit-learn (no download), a small MLP, AdamW,
``auto_cast`` and ``AmpScaler.minimize``, trained twice on the same batches from the
same weights: once with the ``interval`` policy (Paddle's rule), once with ``headroom``.
On a GPU it runs real fp16; on a CPU it emulates it: every matmul's inputs, weights,
biases and outputs are rounded through float16, and so are their gradients, so the
large initial scale overflows (watch the scalers skip steps and back off) and tiny
gradients flush to zero, which the run counts. Writes a figure of both runs (loss,
loss scale, skipped steps, gradients lost to underflow), a VisualDL log of each, and
checkpoints that ``--resume`` continues from exactly.

    python examples/train_digits.py                       # what `make demo` runs
    python examples/train_digits.py --ckpt-dir ckpt --stop-after 200
    python examples/train_digits.py --ckpt-dir ckpt --resume
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not.
warnings.filterwarnings("ignore", message="No ccache found")

import argparse
import contextlib
import glob
import io
import os
import sys
import time

# scikit-learn before Paddle: Paddle 2.6 loads its own zlib, which breaks the numpy.random
# import that scikit-learn would otherwise make later.
from sklearn.datasets import load_digits  # isort: skip
from sklearn.model_selection import train_test_split  # isort: skip
import numpy as np
import paddle
from tqdm import tqdm

from paddle_amp_scaler import (
    AmpScaler,
    auto_cast,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from paddle_amp_scaler.integrations import log_stats
from paddle_amp_scaler.testing import UnderflowCensus, round_linear_layers

CHECKPOINT_NAME = "digits.ckpt"
POLICIES = ("interval", "headroom")
COLOURS = {"interval": "tab:blue", "headroom": "tab:orange"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train a digits classifier with dynamic loss scaling (CPU or GPU), "
        "under each loss-scale policy on the same batches.",
    )
    parser.add_argument(
        "--epochs", type=int, default=30, help="passes over the training set (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="examples per step (default: %(default)s)"
    )
    parser.add_argument(
        "--lr", type=float, default=2e-3, help="AdamW learning rate (default: %(default)s)"
    )
    parser.add_argument(
        "--init-scale",
        type=float,
        default=2.0**24,
        help="initial loss scale, large on purpose: watch it back off; the skips at the "
        "start come from it, and from Paddle's 2**16 neither policy skips (default: 2**24)",
    )
    parser.add_argument(
        "--incr-every",
        type=int,
        default=1000,
        help="finite steps between scale increases under interval; under headroom, how "
        "long a scale that overflowed soon after it was reached is held off (default: "
        "%(default)s, AmpScaler's)",
    )
    parser.add_argument(
        "--policies",
        type=parse_policies,
        default=POLICIES,
        help="comma-separated loss-scale policies to train with, side by side (default: "
        "interval,headroom)",
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="where to train; auto (the default) picks the GPU when Paddle sees one",
    )
    parser.add_argument(
        "--emulate-fp16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="round every matmul's inputs, weights, outputs and their gradients through "
        "float16, and count what underflows (default: on for CPU, off for GPU)",
    )
    parser.add_argument("--ckpt-dir", default=None, help="write checkpoints to this folder")
    parser.add_argument(
        "--ckpt-every",
        type=int,
        default=100,
        help="steps between checkpoints (default: %(default)s)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue from the checkpoint in --ckpt-dir"
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="stop (with a checkpoint) after this step, as an interrupted run",
    )
    parser.add_argument(
        "--plot",
        default="digits_training.png",
        help="PNG file for the figure of both runs, '' for none (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for weights and data order (default: %(default)s)"
    )
    parser.add_argument(
        "--visualdl-dir",
        default="vdl_digits",
        help="VisualDL log of the loss, the scale and the skips, one sub-folder per policy "
        "(%(default)s/interval, ...), '' for none. Each run replaces the previous run's "
        "record there; --resume continues it (default: %(default)s; look at it with: "
        "visualdl --logdir %(default)s)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    for name in ("epochs", "batch_size", "incr_every", "ckpt_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.lr > 0:
        parser.error("--lr must be positive")
    if not args.init_scale >= 1:
        parser.error("--init-scale must be at least 1")
    if args.stop_after is not None and args.stop_after < 1:
        parser.error("--stop-after must be at least 1")
    if (args.resume or args.stop_after) and not args.ckpt_dir:
        parser.error("--resume and --stop-after need --ckpt-dir")
    if args.device == "gpu" and not paddle.device.is_compiled_with_cuda():
        parser.error("--device gpu: this Paddle build has no CUDA support")
    return args


def parse_policies(text):
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not names or set(names) - set(POLICIES):
        raise argparse.ArgumentTypeError(f"choose from {','.join(POLICIES)}, got {text!r}")
    return names


def digits(seed):
    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype("float32")
    return train_test_split(
        features, labels.astype("int64"), test_size=0.2, random_state=seed, stratify=labels
    )


class Run:
    """One policy's model, optimizer and scaler, what float16 did to its gradients (the
    census, where emulated) and the history of its steps."""

    def __init__(self, args, policy, emulate):
        paddle.seed(args.seed)  # every policy starts from the same weights
        self.policy = policy
        self.model = paddle.nn.Sequential(
            paddle.nn.Linear(64, 256),
            paddle.nn.ReLU(),
            paddle.nn.Linear(256, 128),
            paddle.nn.ReLU(),
            paddle.nn.Linear(128, 10),
        )
        self.census = UnderflowCensus() if emulate else None
        if emulate:
            round_linear_layers(self.model, self.census)
        self.optimizer = paddle.optimizer.AdamW(
            learning_rate=args.lr, parameters=self.model.parameters(), weight_decay=1e-4
        )
        self.scaler = AmpScaler(
            init_loss_scaling=args.init_scale, incr_every_n_steps=args.incr_every, policy=policy
        )
        # Per step: the loss, the scale it was scaled by, whether it was skipped, and the
        # nonzero gradient elements and those flushed to zero (None where not counted).
        self.history = {"loss": [], "scale": [], "skipped": [], "nonzero": [], "flushed": []}
        self.writer = None

    def train_step(self, features, labels, on_gpu):
        scale = self.scaler.get_loss_scaling()
        with auto_cast(enable=on_gpu):
            logits = self.model(paddle.to_tensor(features))
            loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(labels))
        scaled = self.scaler.scale(loss)
        scaled.backward()
        self.scaler.minimize(self.optimizer, scaled)
        self.optimizer.clear_grad()
        # The example reads these back to report them; the scaler itself never does.
        skipped = self.scaler.last_step_skipped()
        counts = None if self.census is None else self.census.end_iteration(skipped=skipped)
        self.history["loss"].append(float(loss))
        self.history["scale"].append(scale)
        self.history["skipped"].append(skipped)
        self.history["nonzero"].append(None if counts is None else counts.nonzero)
        self.history["flushed"].append(None if counts is None else counts.flushed)

    def skipped(self):
        return sum(self.history["skipped"])

    def flushed_fraction(self):
        """Of the nonzero gradient elements of the steps taken, the fraction float16
        flushed to zero; None where nothing was counted."""
        kept = [
            (nonzero, flushed)
            for nonzero, flushed, skipped in zip(
                self.history["nonzero"], self.history["flushed"], self.history["skipped"]
            )
            if nonzero is not None and not skipped
        ]
        total = sum(nonzero for nonzero, _ in kept)
        return sum(flushed for _, flushed in kept) / total if total else None


def batch_indices(step, steps_per_epoch, train_size, batch_size, seed):
    """The examples of a given step: a fixed function of the step, so a resumed run
    sees exactly the batches the interrupted one would have."""
    epoch, position = divmod(step, steps_per_epoch)
    order = np.random.default_rng((seed, epoch)).permutation(train_size)
    return order[position * batch_size : (position + 1) * batch_size]


def accuracy(model, features, labels):
    model.eval()
    with paddle.no_grad():
        predicted = model(paddle.to_tensor(features)).argmax(axis=1).numpy()
    model.train()
    return float((predicted == labels).mean())


def percent(fraction):
    return "not counted" if fraction is None else f"{100 * fraction:.2g}%"


def plot(path, runs, accuracies):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        3,
        len(runs),
        sharex=True,
        sharey="row",
        squeeze=False,
        figsize=(5.2 * len(runs) + 1, 7.4),
        gridspec_kw={"height_ratios": [3, 2, 2]},
    )
    for column, run in enumerate(runs):
        loss_panel, scale_panel, flush_panel = axes[:, column]
        history, colour = run.history, COLOURS[run.policy]
        steps = np.arange(1, len(history["loss"]) + 1)
        loss, scale = np.array(history["loss"]), np.array(history["scale"])
        skipped = np.array(history["skipped"], dtype=bool)
        loss_panel.plot(steps, loss, lw=0.7, color=colour, label="training loss")
        # Each skip at the loss of the batch it skipped: a skip late in the run sits
        # down with the low losses, not on a spike that never happened.
        loss_panel.scatter(
            steps[skipped],
            loss[skipped],
            marker="x",
            s=30,
            color="tab:red",
            zorder=3,
            label=f"skipped step ({skipped.sum()}): inf/nan gradient",
        )
        loss_panel.set_yscale("log")
        loss_panel.legend(loc="upper right", fontsize=8)
        loss_panel.set_title(
            f"{run.policy}: {skipped.sum()} skipped, {percent(run.flushed_fraction())} "
            f"of gradients flushed, test accuracy {accuracies[run.policy]:.1%}",
            fontsize=10,
        )
        scale_panel.step(steps, np.log2(scale), where="post", color=colour, label="loss scale")
        scale_panel.scatter(
            steps[skipped], np.log2(scale[skipped]), marker="x", s=30, color="tab:red", zorder=3
        )
        scale_panel.legend(loc="upper right", fontsize=8)
        flushed = np.array([np.nan if f is None else f for f in history["flushed"]], dtype=float)
        nonzero = np.array([np.nan if n is None else n for n in history["nonzero"]], dtype=float)
        flushed[skipped], nonzero[skipped] = np.nan, np.nan
        if np.isfinite(nonzero).any():
            flush_panel.plot(
                steps,
                100 * smoothed(flushed, nonzero),
                color=colour,
                lw=1.0,
                label="flushed to zero in fp16 (20-step mean)",
            )
            flush_panel.legend(loc="upper left", fontsize=8)
        else:
            flush_panel.text(
                0.5,
                0.5,
                "not counted (fp16 not emulated)",
                ha="center",
                transform=flush_panel.transAxes,
            )
        flush_panel.set_xlabel("step")
    axes[0, 0].set_ylabel("loss")
    axes[1, 0].set_ylabel("log2 loss scale")
    axes[2, 0].set_ylabel("% of nonzero grads")
    figure.suptitle("Dynamic loss scaling, fp16 emulated: two policies on the same batches")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def smoothed(flushed, nonzero, width=20):
    """Flushed over nonzero elements in a trailing window of steps (skipped ones left out)."""
    kept = np.isfinite(nonzero)
    window = np.ones(width)
    top = np.convolve(np.where(kept, flushed, 0), window)[: len(flushed)]
    bottom = np.convolve(np.where(kept, nonzero, 0), window)[: len(nonzero)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(bottom > 0, top / bottom, np.nan)


def main(argv=None):
    args = parse_args(argv)
    on_gpu = args.device == "gpu" or (
        args.device == "auto"
        and paddle.device.is_compiled_with_cuda()
        and paddle.device.cuda.device_count() > 0
    )
    paddle.set_device("gpu" if on_gpu else "cpu")
    emulate = (not on_gpu) if args.emulate_fp16 is None else args.emulate_fp16

    train_x, test_x, train_y, test_y = digits(args.seed)
    steps_per_epoch = len(train_x) // args.batch_size
    total_steps = args.epochs * steps_per_epoch
    runs = [Run(args, policy, emulate) for policy in args.policies]

    checkpoint = os.path.join(args.ckpt_dir, CHECKPOINT_NAME) if args.ckpt_dir else None
    start = 0
    if args.resume:
        if not os.path.exists(checkpoint):
            sys.exit(f"--resume: no checkpoint at {checkpoint}")
        start = load_checkpoint(
            checkpoint,
            model=[run.model for run in runs],
            optimizer=[run.optimizer for run in runs],
            scaler=runs[0].scaler,
        )
        extra = read_checkpoint(checkpoint).extra
        for run in runs:
            run.history = extra["history"][run.policy]
            if run is not runs[0]:
                run.scaler.load_state_dict(extra["scalers"][run.policy])
    if checkpoint:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    last = total_steps if args.stop_after is None else min(args.stop_after, total_steps)

    for run in runs:
        run.writer = visualdl_writer(args.visualdl_dir, run.policy, continued=args.resume)
    started = time.perf_counter()
    progress = tqdm(
        range(start, last),
        initial=start,
        total=total_steps,
        disable=args.no_progress,
        desc="train",
        unit="step",
    )
    for step in progress:
        index = batch_indices(step, steps_per_epoch, len(train_x), args.batch_size, args.seed)
        for run in runs:
            run.train_step(train_x[index], train_y[index], on_gpu)
        progress.set_postfix_str(
            " | ".join(
                f"{run.policy} loss {run.history['loss'][-1]:.3f} "
                f"2^{np.log2(run.history['scale'][-1]):.0f} {run.skipped()} skipped"
                for run in runs
            )
        )
        done = step + 1
        if checkpoint and (done % args.ckpt_every == 0 or done == last):
            save_checkpoint(
                checkpoint,
                model=[run.model for run in runs],
                optimizer=[run.optimizer for run in runs],
                scaler=runs[0].scaler,
                step=done,
                extra={
                    "history": {run.policy: run.history for run in runs},
                    "scalers": {run.policy: run.scaler.state_dict() for run in runs[1:]},
                },
            )
        for run in runs:
            if run.writer is None:
                continue
            run.writer.add_scalar("train/loss", run.history["loss"][-1], done)
            if done % 10 == 0 or done == last:
                # Beside the loss: train/loss_scale, train/skipped, train/skip_streak, ...
                log_stats(run.writer, run.scaler, done, prefix="train/")
    progress.close()
    logged = [run for run in runs if run.writer is not None]
    for run in logged:
        run.writer.close()
    elapsed = time.perf_counter() - started

    if last < total_steps:
        print(f"stopped after step {last} of {total_steps}; continue with --resume")
        return None
    accuracies = {run.policy: accuracy(run.model, test_x, test_y) for run in runs}
    if args.plot:
        plot(args.plot, runs, accuracies)
    for run in runs:
        print(
            f"{run.policy + ':':9s} skipped steps {run.skipped()} | gradients flushed to zero "
            f"{percent(run.flushed_fraction())} | final scale 2^"
            f"{np.log2(run.scaler.get_loss_scaling()):.0f} | test accuracy "
            f"{accuracies[run.policy]:.2%}"
        )
    print(
        f"{elapsed:.1f}s on {'GPU' if on_gpu else 'CPU'}{' (fp16 emulated)' if emulate else ''}"
        + (f" | figure {args.plot}" if args.plot else "")
        + (f" | VisualDL log {args.visualdl_dir}" if logged else "")
    )
    return accuracies


def visualdl_writer(folder, policy, continued):
    """VisualDL's LogWriter into ``folder/policy``, one run per policy for VisualDL to draw
    side by side; None for '' or where VisualDL is missing. A new run first removes the
    previous run's record there (and any that a one-policy demo left in ``folder``):
    VisualDL draws one record per folder, and two runs must not share a line. A
    continued run (``--resume``) adds to the record it continues."""
    if not folder:
        return None
    try:
        from visualdl import LogWriter
    except ImportError:
        if policy == POLICIES[0]:
            print("VisualDL is not installed (pip install visualdl): no log written")
        return None
    logdir = os.path.join(folder, policy)
    records = sorted(glob.glob(os.path.join(logdir, "vdlrecords.*")))
    if continued and records:
        # VisualDL announces on stdout that it appends; the summary says where the log is.
        with contextlib.redirect_stdout(io.StringIO()):
            return LogWriter(logdir=logdir, file_name=os.path.basename(records[-1]))
    for record in records + glob.glob(os.path.join(folder, "vdlrecords.*")):
        os.remove(record)
    return LogWriter(logdir=logdir)


if __name__ == "__main__":
    main()
