"""Train a digit classifier with mixed precision and dynamic loss scaling.

The handwritten digits that ship with scikit-learn (no download), a small MLP, AdamW,
``auto_cast`` and ``AmpScaler.minimize``. On a GPU it runs real fp16; on a CPU it
emulates fp16 gradients (each is rounded through float16), so the large initial scale
overflows and you can watch the scaler skip steps and back off. Writes a figure of loss
and loss scale, with skipped steps marked, and checkpoints that ``--resume`` continues
from exactly.

    python examples/train_digits.py                       # about 10 s on 2 CPU cores
    python examples/train_digits.py --ckpt-dir ckpt --stop-after 200
    python examples/train_digits.py --ckpt-dir ckpt --resume
"""

import warnings

# Paddle 3 warns on import that ccache is missing: news for whoever builds C++ extensions,
# which this example does not (the scaler's helper is built once, quietly).
warnings.filterwarnings("ignore", message="No ccache found")

import argparse
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
from paddle_amp_scaler.testing import emulate_fp16_grads

CHECKPOINT_NAME = "digits.ckpt"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train a digits classifier with dynamic loss scaling (CPU or GPU).",
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
        help="initial loss scale, large on purpose: watch it back off (default: 2**24)",
    )
    parser.add_argument(
        "--incr-every",
        type=int,
        default=100,
        help="finite steps between scale increases (default: %(default)s)",
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
        help="round gradients through float16 (default: on for CPU, off for GPU)",
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
        help="PNG file for the loss/scale figure, '' for none (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for weights and data order (default: %(default)s)"
    )
    parser.add_argument(
        "--visualdl-dir",
        default="vdl_digits",
        help="VisualDL log of the loss, the scale and the skips, '' for none (default: "
        "%(default)s; look at it with: visualdl --logdir %(default)s)",
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


def digits(seed):
    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype("float32")
    return train_test_split(
        features, labels.astype("int64"), test_size=0.2, random_state=seed, stratify=labels
    )


def build(args):
    paddle.seed(args.seed)
    model = paddle.nn.Sequential(
        paddle.nn.Linear(64, 256),
        paddle.nn.ReLU(),
        paddle.nn.Linear(256, 128),
        paddle.nn.ReLU(),
        paddle.nn.Linear(128, 10),
    )
    optimizer = paddle.optimizer.AdamW(
        learning_rate=args.lr, parameters=model.parameters(), weight_decay=1e-4
    )
    scaler = AmpScaler(init_loss_scaling=args.init_scale, incr_every_n_steps=args.incr_every)
    return model, optimizer, scaler


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


def plot(path, history):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.arange(1, len(history["loss"]) + 1)
    loss, scale = np.array(history["loss"]), np.array(history["scale"])
    skipped = np.array(history["skipped"], dtype=bool)
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    top.plot(steps[~skipped], loss[~skipped], lw=0.8, label="training loss")
    top.scatter(
        steps[skipped],
        np.full(skipped.sum(), np.nanmax(loss[~skipped])),
        marker="x",
        color="tab:red",
        label="skipped step (inf/nan gradient)",
    )
    top.set_yscale("log")
    top.set_ylabel("loss")
    top.legend(loc="lower left")
    bottom.step(steps, scale, where="post", color="tab:green", label="loss scale")
    bottom.scatter(steps[skipped], scale[skipped], marker="x", color="tab:red")
    bottom.set_yscale("log", base=2)
    bottom.set_ylabel("loss scale")
    bottom.set_xlabel("step")
    bottom.legend(loc="upper right")
    figure.suptitle("Dynamic loss scaling: skipped steps back the scale off")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


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
    model, optimizer, scaler = build(args)
    if emulate:
        emulate_fp16_grads(model)

    checkpoint = os.path.join(args.ckpt_dir, CHECKPOINT_NAME) if args.ckpt_dir else None
    history, start = {"loss": [], "scale": [], "skipped": []}, 0
    if args.resume:
        if not os.path.exists(checkpoint):
            sys.exit(f"--resume: no checkpoint at {checkpoint}")
        start = load_checkpoint(checkpoint, model=model, optimizer=optimizer, scaler=scaler)
        history = read_checkpoint(checkpoint).extra["history"]
    if checkpoint:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    last = total_steps if args.stop_after is None else min(args.stop_after, total_steps)

    writer = visualdl_writer(args.visualdl_dir)
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
        with auto_cast(enable=on_gpu):
            logits = model(paddle.to_tensor(train_x[index]))
            loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(train_y[index]))
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.minimize(optimizer, scaled)
        optimizer.clear_grad()
        # The example reads these back to report them; the scaler itself never does.
        history["loss"].append(float(loss))
        history["scale"].append(scaler.get_loss_scaling())
        history["skipped"].append(scaler.last_step_skipped())
        progress.set_postfix(
            loss=f"{history['loss'][-1]:.3f}",
            scale=f"{history['scale'][-1]:.0f}",
            skipped=sum(history["skipped"]),
        )
        done = step + 1
        if checkpoint and (done % args.ckpt_every == 0 or done == last):
            save_checkpoint(
                checkpoint,
                model=model,
                optimizer=optimizer,
                scaler=scaler,
                step=done,
                extra={"history": history},
            )
        if writer is not None:
            writer.add_scalar("train/loss", history["loss"][-1], done)
            if done % 10 == 0 or done == last:
                # Beside the loss: train/loss_scale, train/skipped, train/skip_streak, ...
                log_stats(writer, scaler, done, prefix="train/")
    progress.close()
    if writer is not None:
        writer.close()
    elapsed = time.perf_counter() - started

    if last < total_steps:
        print(f"stopped after step {last} of {total_steps}; continue with --resume")
        return None
    test_accuracy = accuracy(model, test_x, test_y)
    if args.plot:
        plot(args.plot, history)
    print(
        f"test accuracy {test_accuracy:.2%} | skipped steps {sum(history['skipped'])} "
        f"| final scale {scaler.get_loss_scaling():.0f} | {elapsed:.1f}s on "
        f"{'GPU' if on_gpu else 'CPU'}{' (fp16 emulated)' if emulate else ''}"
        + (f" | figure {args.plot}" if args.plot else "")
        + (f" | VisualDL log {args.visualdl_dir}" if writer is not None else "")
    )
    return test_accuracy


def visualdl_writer(folder):
    """VisualDL's LogWriter into ``folder``; None for '' or where VisualDL is missing."""
    if not folder:
        return None
    try:
        from visualdl import LogWriter
    except ImportError:
        print("VisualDL is not installed (pip install visualdl): no log written")
        return None
    return LogWriter(logdir=folder)


if __name__ == "__main__":
    main()
