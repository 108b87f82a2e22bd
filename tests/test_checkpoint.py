"""Checkpoints: exact resume, atomic saves, and loads that verify before changing anything."""

import collections
import dataclasses
import hashlib
import math
import os
import pickle
import pickletools
import random
import re
import signal
import struct
import subprocess
import sys
import time
import warnings

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
from paddle_amp_scaler import checkpoint as checkpoint_module
from paddle_amp_scaler.checkpoint import rng_state_survives_pickling
from paddle_amp_scaler.checkpoint.file_format import not_loaded_in

from helpers import (
    GradInjector,
    WritesAMarker,
    batches,
    make_model,
    optimizer_state_of,
    params_of,
    train_step,
    write_payload,
)

# Dropout repeats after a resume only where Paddle can save its generator's position.
DROPOUT = 0.3 if rng_state_survives_pickling() else 0.0

HERE = os.path.dirname(os.path.abspath(__file__))
# The file's header as docs/checkpoints.md describes it: magic, format version (uint32),
# the payload's length (uint64) and its SHA-256.
HEADER = struct.Struct("<8sIQ32s")


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
    # the resumed scaler is built with the default policy: the checkpoint brings its own,
    # and says so where they differ.
    make_model(seed=9)
    resumed = Run(seed=123)
    paddle.rand([7])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resumed.load(tmp_path / "ckpt") == cut
    followed = [str(w.message) for w in caught if "follows the dict" in str(w.message)]
    assert len(followed) == (policy != "interval"), followed
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
    # "is truncated": the folder pytest names after this test holds the word too.
    for cut in (5, 40, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        assert_load_fails_and_changes_nothing(target, path, "is truncated")


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
    assert_load_fails_and_changes_nothing(target, path, "not a checkpoint written by save_")
    path.write_bytes(os.urandom(4096))
    assert_load_fails_and_changes_nothing(target, path, "not a checkpoint written by save_")


NOT_CHECKPOINTS = {
    "empty": (b"", "the file is empty"),
    "text": (b"step: 100\nloss: 0.25\n", "it is text, starting 'step: 100"),
    "png": (b"\x89PNG\r\n\x1a\n" + bytes(64), "it is a PNG image"),
    "pickle": (pickle.dumps({"weight": np.ones(3)}), "it is a plain pickle"),
}


@pytest.mark.parametrize("kind", sorted(NOT_CHECKPOINTS))
def test_a_file_that_is_no_checkpoint_says_so_before_its_length(tmp_path, kind):
    path, target = trained_run_and_checkpoint(tmp_path)
    content, what = NOT_CHECKPOINTS[kind]
    path.write_bytes(content)
    for read in (read_checkpoint, checkpoint_module.inspect_checkpoint):
        with pytest.raises(CheckpointError) as raised:
            read(path)
        message = str(raised.value)
        assert f"{str(path)!r} is not a checkpoint written by save_checkpoint: {what}" in message
        assert "is truncated" not in message and "header" not in message
    assert_load_fails_and_changes_nothing(target, path, "is not a checkpoint written by save_")


# -- safe loading: a checkpoint builds only what save_checkpoint writes --------------------


def payload_of(path):
    return pickle.loads(path.read_bytes()[HEADER.size :])


def crafted(tmp_path, where):
    """A real checkpoint whose payload, at ``where``, holds an object that writes a marker."""
    path, target = trained_run_and_checkpoint(tmp_path)
    marker = tmp_path / "marker"
    payload = payload_of(path)
    if where == "payload":
        payload = WritesAMarker(marker)
    elif where == "model":
        payload["models"][0]["0.weight"] = WritesAMarker(marker)
    elif where == "scaler":
        payload["scaler"]["scale"] = WritesAMarker(marker)
    else:
        payload["step"] = [WritesAMarker(marker)]
    write_payload(path, payload)
    return path, target, marker


@pytest.mark.parametrize("where", ["payload", "model", "scaler", "step"])
def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path, where):
    path, target, marker = crafted(tmp_path, where)
    built = "io.open"  # what pickle records for the builtin open
    for read in (read_checkpoint, checkpoint_module.inspect_checkpoint):
        with pytest.raises(CheckpointError, match=f"tries to build {built}") as raised:
            read(path)
        assert "nothing from the file ran" in str(raised.value)
    assert_load_fails_and_changes_nothing(target, path, f"tries to build {built}")
    # Trusting extra trusts nothing else.
    with pytest.raises(CheckpointError, match=f"tries to build {built}"):
        read_checkpoint(path, trust_extra=True)
    assert not marker.exists()


@pytest.mark.parametrize(
    "key, value", [("step", "3"), ("models", 5), ("optimizers", [3]), ("scaler", [1]), ("rng", "")]
)
def test_a_payload_of_other_types_is_refused(tmp_path, key, value):
    path, target = trained_run_and_checkpoint(tmp_path)
    payload = payload_of(path)
    payload[key] = value
    write_payload(path, payload)
    refused = f"was not written by save_checkpoint: its {key} is {value!r}"
    for read in (read_checkpoint, checkpoint_module.inspect_checkpoint):
        with pytest.raises(CheckpointError, match=re.escape(refused)):
            read(path)
    assert_load_fails_and_changes_nothing(target, path, re.escape(refused))


def test_objects_in_extra_load_only_with_trust_extra(tmp_path):
    marker = tmp_path / "marker"
    run = Run()
    run.save(tmp_path / "c", step=1, extra={"epoch": 2, "sampler": WritesAMarker(marker)})
    before = run.observable()
    for read in (
        read_checkpoint,
        lambda path: load_checkpoint(
            path, model=run.model, optimizer=run.optimizer, scaler=run.scaler
        ),
    ):
        with pytest.raises(CheckpointError) as raised:
            read(tmp_path / "c")
        message = str(raised.value)
        assert "extra['sampler'] is built by io.open" in message
        assert "trust_extra=True" in message and "runs that code" in message
    assert_same(run.observable(), before)
    assert not marker.exists()
    # Left unbuilt, it is named.
    unbuilt = checkpoint_module.inspect_checkpoint(tmp_path / "c").extra["sampler"]
    assert isinstance(unbuilt, checkpoint_module.NotLoaded)
    assert (unbuilt.module, unbuilt.name) == ("io", "open")
    assert not marker.exists()

    # The opt-in runs the file's code: here it opens the marker.
    extra = read_checkpoint(tmp_path / "c", trust_extra=True).extra
    extra["sampler"].close()
    assert extra["epoch"] == 2 and marker.exists()
    marker.unlink()
    step = load_checkpoint(
        tmp_path / "c",
        model=run.model,
        optimizer=run.optimizer,
        scaler=run.scaler,
        trust_extra=True,
    )
    assert step == 1 and marker.exists()


def test_arrays_pickled_by_the_other_numpy_major_version_load(tmp_path):
    # NumPy 2 pickles name numpy._core.multiarray, NumPy 1 numpy.core.multiarray: a
    # checkpoint written under one is read under the other.
    path, target = trained_run_and_checkpoint(tmp_path)
    payload = payload_of(path)
    payload["extra"] = {"scalar": np.float32(2.5), "array": np.arange(3)}
    body = pickle.dumps(payload, protocol=4)
    names = ("numpy._core.multiarray", "numpy.core.multiarray")
    ours, other = names if names[0].encode() in body else names[::-1]
    # Each name is a short string, its length first; optimize() then frames the pickle
    # anew, around the shorter or longer strings.
    short = [bytes([0x8C, len(name)]) + name.encode() for name in (ours, other)]
    assert body.count(short[0]) >= 1 and other.encode() not in body
    write_payload(path, None, pickletools.optimize(body.replace(*short)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy.core warns on NumPy 2 when imported
        checkpoint = read_checkpoint(path)
    assert checkpoint.extra["scalar"] == np.float32(2.5)
    np.testing.assert_array_equal(checkpoint.extra["array"], np.arange(3))
    assert target.load(path) == 3


def test_plain_values_in_extra_load_without_trust(tmp_path):
    extra = {
        "epoch": 3,
        "loss": 0.25,
        "name": "run-7",
        "flags": (True, False, None),
        "seen": {1, 2},
        "frozen": frozenset({"a"}),
        "nested": [{"lr": 1e-3, "ids": [1, 2, 3]}, b"bytes", bytearray(b"mutable"), 2 + 1j],
        "ordered": collections.OrderedDict(a=1, b=2),
        "array": np.arange(6, dtype=np.int16).reshape(2, 3),
        "half": np.ones(2, dtype=np.float16),
        "scalar": np.float32(1.5),
        "numpy_rng": np.random.default_rng(5).bit_generator.state,
        "legacy_rng": np.random.RandomState(5).get_state(),
        "big": 10**30,
        "range": range(3),
    }
    Run().save(tmp_path / "c", step=1, extra=extra)
    loaded = read_checkpoint(tmp_path / "c").extra
    assert loaded.keys() == extra.keys()
    for key, value in extra.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(loaded[key], value)
            assert loaded[key].dtype == value.dtype
        elif key == "legacy_rng":
            assert loaded[key][0] == value[0] and np.array_equal(loaded[key][1], value[1])
        else:
            assert loaded[key] == value, key
            assert type(loaded[key]) is type(value), key


@pytest.mark.parametrize(
    "build",
    [
        lambda p: paddle.optimizer.SGD(learning_rate=0.1, parameters=p),
        lambda p: paddle.optimizer.Momentum(learning_rate=0.1, parameters=p, use_nesterov=True),
        lambda p: paddle.optimizer.Adam(
            learning_rate=paddle.optimizer.lr.ReduceOnPlateau(0.1), parameters=p
        ),
        lambda p: paddle.optimizer.AdamW(
            learning_rate=paddle.optimizer.lr.LinearWarmup(
                paddle.optimizer.lr.CosineAnnealingDecay(0.1, T_max=5), 2, 0.0, 0.1
            ),
            parameters=p,
        ),
        lambda p: paddle.optimizer.RMSProp(learning_rate=0.1, parameters=p),
        lambda p: paddle.optimizer.Adagrad(learning_rate=0.1, parameters=p),
        lambda p: paddle.optimizer.Adamax(learning_rate=0.1, parameters=p),
        lambda p: paddle.optimizer.Lamb(learning_rate=0.1, parameters=p),
    ],
    ids=["sgd", "momentum", "adam-plateau", "adamw-warmup", "rmsprop", "adagrad", "adamax", "lamb"],
)
def test_what_save_checkpoint_writes_reads_back_with_no_opt_in(tmp_path, build):
    paddle.seed(0)
    model = paddle.nn.Sequential(
        paddle.nn.Linear(8, 16), paddle.nn.BatchNorm1D(16), paddle.nn.Linear(16, 4)
    )
    optimizer = build(model.parameters())
    scaler = GradScaler(min_loss_scaling=2.0, max_loss_scaling=2.0**20)
    for batch in batches(steps=3):
        train_step(scaler, model, optimizer, batch)
        schedule = optimizer._learning_rate
        if isinstance(schedule, paddle.optimizer.lr.ReduceOnPlateau):
            schedule.step(paddle.to_tensor(1.0))
        elif isinstance(schedule, paddle.optimizer.lr.LRScheduler):
            schedule.step()
    path = tmp_path / "c"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Paddle 2.6 cannot save its generator's position
        save_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler, step=3)
    # Every global the file refers to is on the allow-list: nothing comes back unbuilt.
    content = checkpoint_module.inspect_checkpoint(path)
    assert not list(not_loaded_in(dataclasses.asdict(content), "checkpoint"))
    assert load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler) == 3


def test_trust_extra_takes_only_a_bool(tmp_path):
    path, target = trained_run_and_checkpoint(tmp_path)
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="trust_extra must be True or False"):
            read_checkpoint(path, trust_extra=bad)
        with pytest.raises(TypeError, match="trust_extra"):
            load_checkpoint(
                path,
                model=target.model,
                optimizer=target.optimizer,
                scaler=target.scaler,
                trust_extra=bad,
            )


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


def test_each_argument_is_checked_and_named(tmp_path):
    run = Run()
    path = tmp_path / "c"
    run.save(path, step=1)
    objects = dict(model=run.model, optimizer=run.optimizer, scaler=run.scaler)
    for wrong, error, message in [
        # Saving says a checkpoint needs a model; loading, what a model is.
        (dict(model=None), TypeError, "needs model: a checkpoint|model must be .*got NoneType"),
        (dict(model=[]), ValueError, "model must be a paddle.nn.Layer or a non-empty list"),
        (dict(model=[run.model, "x"]), TypeError, "model must be .*got str"),
        (dict(optimizer=None), TypeError, "needs optimizer: a|optimizer must be .*NoneType"),
        # A model where the optimizer goes: it has a state_dict, but no parameter list.
        (dict(optimizer=run.model), TypeError, "optimizer must be a paddle.optimizer"),
        (dict(scaler=None), TypeError, "scaler must be a scaler such as GradScaler .*NoneType"),
    ]:
        arguments = {**objects, **wrong}
        with pytest.raises(error, match=message):
            save_checkpoint(tmp_path / "other", step=1, **arguments)
        # The optimizer's parameters are looked up as the checkpoint is fitted to it: a
        # CheckpointError (a ValueError) then says what does not fit.
        with pytest.raises((error, CheckpointError), match=message):
            load_checkpoint(path, **arguments)
    assert not (tmp_path / "other").exists()
    for read in (read_checkpoint, checkpoint_module.inspect_checkpoint):
        with pytest.raises(TypeError, match="path must be a str or an os.PathLike, got int"):
            read(3)
    assert load_checkpoint(str(path), **objects) == 1


def test_the_file_is_laid_out_as_the_docs_say(tmp_path):
    Run().save(tmp_path / "c", step=7)
    data = (tmp_path / "c").read_bytes()
    magic, version, length, digest = HEADER.unpack_from(data)
    assert (magic, version) == (b"PDAMPCK\x00", 1)
    assert length == len(data) - HEADER.size
    assert digest == hashlib.sha256(data[HEADER.size :]).digest()
    assert pickle.loads(data[HEADER.size :])["step"] == 7


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


# The payload of a checkpoint in release 0.2.0's format, as the package wrote it at commit
# 5fd3599 (Paddle 2.6, which saves no RNG state): a Linear(4, 2) with Adam by parameter
# position, and a scaler under Paddle's rule. (The headroom policy was not released then:
# the memory its first version kept is refused by name, as any other bad one.)
SCALER_0_2_0 = {
    "scale": np.array([8192.0], dtype=np.float32),
    "incr_ratio": 2.0,
    "decr_ratio": 0.5,
    "incr_every_n_steps": 3,
    "decr_every_n_nan_or_inf": 1,
    "incr_count": 2,
    "decr_count": 0,
    "use_dynamic_loss_scaling": True,
    "min_loss_scaling": 1.0,
    "max_loss_scaling": None,
    "stats": {
        "iterations": 5,
        "skipped": 0,
        "skip_streak": 0,
        "last_skipped": 0,
        "growths": 1,
        "backoffs": 0,
    },
}


def payload_0_2_0():
    shapes = {0: (4, 2), 1: (2,)}
    accumulators = {
        (index, suffix): np.full(shape if "moment" in suffix else (1,), 0.25, dtype="float32")
        for index, shape in shapes.items()
        for suffix in ("_moment1_0", "_moment2_0", "_beta1_pow_acc_0", "_beta2_pow_acc_0")
    }
    return {
        "step": 5,
        "models": [{"weight": np.ones((4, 2), "float32"), "bias": np.zeros(2, "float32")}],
        "optimizers": [
            {
                "parameter_count": 2,
                "accumulators": accumulators,
                "master_weights": {},
                "other": {},
            }
        ],
        "scaler": SCALER_0_2_0,
        "rng": None,
        "extra": {"epoch": 1},
        "paddle_version": "2.6.2",
    }


def test_a_checkpoint_in_release_0_2_0s_format_loads_as_it_was_saved(tmp_path):
    body = pickle.dumps(payload_0_2_0(), protocol=4)
    path = tmp_path / "run.ckpt"
    path.write_bytes(
        HEADER.pack(b"PDAMPCK\x00", 1, len(body), hashlib.sha256(body).digest()) + body
    )
    model = paddle.nn.Linear(4, 2)
    optimizer = paddle.optimizer.Adam(parameters=model.parameters())
    scaler = GradScaler()
    assert load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler) == 5
    loaded = scaler.state_dict()
    np.testing.assert_array_equal(loaded.pop("scale"), SCALER_0_2_0["scale"])
    # 0.2.0 named no policy: the scaler keeps its own, and names it now.
    saved = {key: value for key, value in SCALER_0_2_0.items() if key != "scale"}
    assert loaded == {**saved, "policy": "interval"}
    np.testing.assert_array_equal(model.weight.numpy(), np.ones((4, 2)))
    # Paddle makes the accumulators at the first step; Paddle 2.6 holds what was loaded
    # aside until then.
    held = {**getattr(optimizer, "_accumulators_holder", {}), **optimizer.state_dict()}
    moment = held[f"{model.weight.name}_moment1_0"]
    np.testing.assert_array_equal(moment.numpy(), np.full((4, 2), 0.25))
    assert read_checkpoint(path).extra == {"epoch": 1}


def test_a_scaler_alone_is_refused_with_how_to_save_one(tmp_path):
    scaler = GradScaler()
    path = tmp_path / "scaler.ckpt"
    alone = r"needs model and optimizer: a checkpoint holds the whole training state"
    with pytest.raises(TypeError, match=alone) as refused:
        save_checkpoint(path, scaler=scaler, step=1)
    assert "paddle.save(scaler.state_dict(), path)" in str(refused.value)
    model = paddle.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"needs optimizer: "):
        save_checkpoint(path, model=model, scaler=scaler, step=1)
    assert not path.exists()
    # What the message says works.
    paddle.save(scaler.state_dict(), str(path))
    restored = GradScaler(init_loss_scaling=2.0)
    restored.load_state_dict(paddle.load(str(path)))
    assert restored.get_loss_scaling() == scaler.get_loss_scaling()
