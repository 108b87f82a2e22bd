"""Checkpoints: exact resume, atomic saves, and loads that verify before changing anything."""

import math
import os
import random
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import (
    CheckpointError,
    GradScaler,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from paddle_amp_scaler.checkpoint import rng_state_survives_pickling

from helpers import GradInjector, batches, make_model, optimizer_state_of, params_of, train_step

# Dropout repeats after a resume only where Paddle can save its generator's position.
DROPOUT = 0.3 if rng_state_survives_pickling() else 0.0

HERE = os.path.dirname(os.path.abspath(__file__))


class Run:
    """Model with dropout, AdamW with an LR schedule, a scaler, and inf on chosen steps."""

    def __init__(self, seed=0, width=16, policy="interval"):
        paddle.seed(seed)
        self.model = paddle.nn.Sequential(
            paddle.nn.Linear(8, width),
            paddle.nn.ReLU(),
            paddle.nn.Dropout(DROPOUT),
            paddle.nn.Linear(width, 4),
        )
        self.schedule = paddle.optimizer.lr.StepDecay(0.01, step_size=3, gamma=0.5)
        self.optimizer = paddle.optimizer.AdamW(
            learning_rate=self.schedule, parameters=self.model.parameters()
        )
        self.scaler = GradScaler(
            init_loss_scaling=2.0**10,
            incr_every_n_steps=2,
            decr_every_n_nan_or_inf=2,
            policy=policy,
        )
        self.injector = GradInjector(self.model[0].weight)

    def train(self, steps, overflow_steps):
        data = batches(seed=1, steps=max(steps) + 1)
        for step in steps:
            train_step(
                self.scaler,
                self.model,
                self.optimizer,
                data[step],
                injector=self.injector,
                inject=math.inf if step in overflow_steps else None,
            )
            self.schedule.step()

    def save(self, path, step, extra=None):
        if not rng_state_survives_pickling():
            with pytest.warns(UserWarning, match="random generator"):
                save_checkpoint(
                    path,
                    model=self.model,
                    optimizer=self.optimizer,
                    scaler=self.scaler,
                    step=step,
                    extra=extra,
                )
            return
        save_checkpoint(
            path,
            model=self.model,
            optimizer=self.optimizer,
            scaler=self.scaler,
            step=step,
            extra=extra,
        )

    def load(self, path):
        return load_checkpoint(path, model=self.model, optimizer=self.optimizer, scaler=self.scaler)

    def observable(self):
        return (
            params_of(self.model),
            optimizer_state_of(self.optimizer, self.model.parameters()),
            self.scaler.state_dict(),
            self.schedule.state_dict(),
        )


def assert_same(a, b):
    (params_a, opt_a, scaler_a, sched_a), (params_b, opt_b, scaler_b, sched_b) = a, b
    for x, y in zip(params_a, params_b):
        np.testing.assert_array_equal(x, y)
    assert opt_a.keys() == opt_b.keys()
    for key in opt_a:
        np.testing.assert_array_equal(opt_a[key], opt_b[key], err_msg=key)
    assert scaler_a.keys() == scaler_b.keys()
    for key in scaler_a:
        np.testing.assert_array_equal(scaler_a[key], scaler_b[key], err_msg=key)
    assert sched_a == sched_b


@pytest.mark.parametrize("policy", ["interval", "headroom"])
@pytest.mark.parametrize(
    "overflow_steps",
    [set(), {2}, {7}, {2, 3, 7}, {4, 5}],
    ids=["none", "before", "after", "both", "at-the-cut"],
)
def test_resume_is_bit_exact(tmp_path, overflow_steps, policy):
    total, cut = 10, 5
    straight = Run(policy=policy)
    straight.train(range(total), overflow_steps)

    first = Run(policy=policy)
    first.train(range(cut), overflow_steps)
    first.save(tmp_path / "ckpt", step=cut)
    # Fresh objects with other parameter names, other weights and another RNG position;
    # the resumed scaler is built with the default policy: the checkpoint brings its own.
    make_model(seed=9)
    resumed = Run(seed=123)
    paddle.rand([7])
    assert resumed.load(tmp_path / "ckpt") == cut
    resumed.train(range(cut, total), overflow_steps)

    assert_same(resumed.observable(), straight.observable())


def test_several_models_and_optimizers(tmp_path):
    def build(seed):
        paddle.seed(seed)
        models = [make_model(seed=seed), make_model(seed=seed + 1)]
        opts = [
            paddle.optimizer.Adam(learning_rate=0.01, parameters=models[0].parameters()),
            paddle.optimizer.Momentum(learning_rate=0.1, parameters=models[1].parameters()),
        ]
        return models, opts, GradScaler(init_loss_scaling=64.0)

    def train(models, opts, scaler, data):
        for x, y in data:
            loss = sum(paddle.nn.functional.mse_loss(m(x), y) for m in models)
            scaler.scale(loss).backward()
            for opt in opts:
                scaler.step(opt)
            scaler.update()
            for opt in opts:
                opt.clear_grad()

    data = batches(steps=6)
    straight = build(0)
    train(*straight, data)
    first = build(0)
    train(*first, data[:3])
    save_checkpoint(tmp_path / "c", model=first[0], optimizer=first[1], scaler=first[2], step=3)
    resumed = build(50)
    assert (
        load_checkpoint(tmp_path / "c", model=resumed[0], optimizer=resumed[1], scaler=resumed[2])
        == 3
    )
    train(*resumed, data[3:])
    for ours, theirs in zip(resumed[0], straight[0]):
        for a, b in zip(params_of(ours), params_of(theirs)):
            np.testing.assert_array_equal(a, b)


def test_rng_position_is_restored_where_paddle_can_save_it(tmp_path):
    run = Run()
    paddle.rand([3])
    run.save(tmp_path / "c", step=0)
    expected = paddle.rand([5]).numpy()
    paddle.seed(99)
    run.load(tmp_path / "c")
    repeated = np.array_equal(paddle.rand([5]).numpy(), expected)
    assert repeated == rng_state_survives_pickling()


def test_the_rng_self_check_leaves_the_random_stream_alone():
    paddle.seed(5)
    expected = paddle.rand([4]).numpy()
    paddle.seed(5)
    rng_state_survives_pickling.cache_clear()
    rng_state_survives_pickling()
    np.testing.assert_array_equal(paddle.rand([4]).numpy(), expected)


def test_extra_and_step_come_back(tmp_path):
    run = Run()
    extra = {"epoch": 3, "numpy_rng": np.random.default_rng(5).bit_generator.state}
    run.save(tmp_path / "c", step=42, extra=extra)
    checkpoint = read_checkpoint(tmp_path / "c")
    assert checkpoint.step == 42 and checkpoint.extra == extra


# -- a load that fails changes nothing ------------------------------------------------------


def trained_run_and_checkpoint(tmp_path):
    source = Run()
    source.train(range(3), {1})
    path = tmp_path / "ckpt"
    source.save(path, step=3)
    target = Run(seed=7)
    target.train(range(2), set())
    return path, target


def assert_load_fails_and_changes_nothing(target, path, match):
    before = target.observable()
    rng_before = paddle.get_rng_state()
    with pytest.raises(CheckpointError, match=match) as raised:
        target.load(path)
    assert str(path) in str(raised.value)
    assert_same(target.observable(), before)
    paddle.set_rng_state(rng_before)


def test_truncated_file(tmp_path):
    path, target = trained_run_and_checkpoint(tmp_path)
    data = path.read_bytes()
    for cut in (0, 5, 40, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        assert_load_fails_and_changes_nothing(target, path, "truncated")


def test_corrupted_byte(tmp_path):
    path, target = trained_run_and_checkpoint(tmp_path)
    data = bytearray(path.read_bytes())
    for offset in (60, len(data) // 2, len(data) - 1):
        damaged = bytearray(data)
        damaged[offset] ^= 0x01
        path.write_bytes(bytes(damaged))
        assert_load_fails_and_changes_nothing(target, path, "checksum")


def test_foreign_files(tmp_path):
    path, target = trained_run_and_checkpoint(tmp_path)
    paddle.save(target.model.state_dict(), str(path))
    assert_load_fails_and_changes_nothing(target, path, "not a paddle_amp_scaler checkpoint")
    path.write_bytes(os.urandom(4096))
    assert_load_fails_and_changes_nothing(target, path, "not a paddle_amp_scaler checkpoint")


def test_newer_format_version(tmp_path):
    path, target = trained_run_and_checkpoint(tmp_path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 99)
    path.write_bytes(bytes(data))
    assert_load_fails_and_changes_nothing(target, path, "format version 99")


def test_checkpoint_of_another_model(tmp_path):
    other = Run(width=32)
    other.save(tmp_path / "wide", step=1)
    target = Run()
    assert_load_fails_and_changes_nothing(target, tmp_path / "wide", "shape")


def test_wrong_number_of_optimizers(tmp_path):
    path, target = trained_run_and_checkpoint(tmp_path)
    before = target.observable()
    with pytest.raises(CheckpointError, match="2 optimizers given"):
        load_checkpoint(
            path,
            model=target.model,
            optimizer=[target.optimizer, target.optimizer],
            scaler=target.scaler,
        )
    assert_same(target.observable(), before)


def test_disabled_scaler_checkpoint_into_enabled_scaler(tmp_path):
    source = Run()
    source.scaler = GradScaler(enable=False)
    source.save(tmp_path / "c", step=0)
    target = Run()
    assert_load_fails_and_changes_nothing(target, tmp_path / "c", "disabled scaler")


def test_bad_step_argument(tmp_path):
    run = Run()
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(
            tmp_path / "c", model=run.model, optimizer=run.optimizer, scaler=run.scaler, step=-1
        )


def test_a_folder_that_does_not_exist_is_named_with_the_fix(tmp_path):
    run = Run()
    target = tmp_path / "not" / "yet" / "run.ckpt"
    with pytest.raises(FileNotFoundError) as raised:
        run.save(target, step=1)
    message = str(raised.value)
    assert str(target) in message and str(target.parent) in message
    assert "os.makedirs" in message and ".tmp" not in message
    assert not (tmp_path / "not").exists()


# -- atomic saves ------------------------------------------------------------------------


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_save_that_dies_leaves_the_old_checkpoint(tmp_path, monkeypatch, failing):
    run = Run()
    path = tmp_path / "ckpt"
    run.save(path, step=1)
    old = path.read_bytes()
    run.train(range(2), set())

    def crash(*args):
        raise OSError("simulated crash")

    monkeypatch.setattr(os, failing, crash)
    with pytest.raises(OSError, match="simulated crash"):
        run.save(path, step=2)
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["ckpt"]
    assert read_checkpoint(path).step == 1


def kill_and_resume(tmp_path, kills, steps, policy="interval"):
    """Runs the worker to the end once straight, and once killed ``kills`` times."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    worker = [
        sys.executable,
        os.path.join(HERE, "checkpoint_worker.py"),
        "--steps",
        str(steps),
        "--every",
        "4",
        "--policy",
        policy,
    ]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir()
    killed.mkdir()
    subprocess.run(
        worker + ["--dir", str(straight)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )

    rng = random.Random(1234)
    done_kills, resumed_from = 0, []
    for _ in range(kills):
        process = subprocess.Popen(
            worker + ["--dir", str(killed)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = process.stdout.readline()
        resumed_from.append(int(line.split()[-1]))
        time.sleep(rng.uniform(0.0, 0.6))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            done_kills += 1
        process.wait(timeout=60)
        process.stdout.close()
    subprocess.run(
        worker + ["--dir", str(killed)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )

    assert done_kills >= 1
    # The run made progress between kills, and was really resumed from checkpoints.
    assert resumed_from[0] == 0 and max(resumed_from) > 0
    np.testing.assert_array_equal(np.load(killed / "final.npy"), np.load(straight / "final.npy"))
    print(f"kill -9: {done_kills} kills landed, runs resumed from steps {resumed_from}")


@pytest.mark.parametrize(("policy", "steps"), [("interval", 1200), ("headroom", 600)])
def test_kill_9_at_random_moments_then_resume(tmp_path, policy, steps):
    kill_and_resume(tmp_path, kills=4, steps=steps, policy=policy)


@pytest.mark.long
def test_kill_9_many_times(tmp_path):
    kill_and_resume(tmp_path, kills=25, steps=6000)
