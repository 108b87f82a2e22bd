"""The scaler's numbers where users look: log_stats into a writer, ScalerCallback in
paddle.Model.fit's progress bar and VisualDL log (in either order of the callbacks), and
ScalerTrainerCallback in a Trainer's logs. Each fails if a tag is missing, a value is
not the one of the step it is logged at, or a read happens at a step that is not logged."""

import os

import numpy as np
import paddle
import pytest
from counters import HostReadCounter

import paddle_amp_scaler
from paddle_amp_scaler import GradScaler
from paddle_amp_scaler.integrations import ScalerCallback, ScalerTrainerCallback, log_stats
from paddle_amp_scaler.testing import emulate_fp16_grads

from helpers import GradInjector, batches, make_model, paddle_oracle, train_step

pytestmark = pytest.mark.filterwarnings(
    "ignore:amp_guard can only be enabled",
    "ignore:AmpScaler can only be enabled",
    "ignore:To copy construct from a tensor",
)

STATS_TAGS = ["loss_scale", "skipped", "skip_streak", "growths", "backoffs"]


class RecordingWriter:
    """The one call VisualDL's LogWriter and tensorboardX's SummaryWriter share."""

    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


def trained(scaler, poisoned=(1, 2, 5)):
    model = make_model()
    optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model[0].weight)
    for step, batch in enumerate(batches(steps=8)):
        train_step(
            scaler,
            model,
            optimizer,
            batch,
            injector=injector,
            inject=float("inf") if step in poisoned else None,
        )
    return scaler


# -- log_stats ------------------------------------------------------------------------------


def test_log_stats_writes_every_number_once_with_one_read():
    scaler = trained(GradScaler(init_loss_scaling=1024.0, incr_every_n_steps=2))
    writer, counter = RecordingWriter(), HostReadCounter()
    with counter.counting():
        stats = log_stats(writer, scaler, step=8, prefix="amp/")
    assert counter.reads["scaler"] == 1
    assert stats == scaler.stats()
    assert writer.scalars == [
        ("amp/loss_scale", stats.scale, 8),
        ("amp/skipped", 3, 8),
        ("amp/skip_streak", 0, 8),
        ("amp/growths", stats.growths, 8),
        ("amp/backoffs", 3, 8),
        # The skips were the gradients' (injected): every loss was finite.
        ("amp/nonfinite_loss", 0, 8),
    ]
    assert stats.growths >= 1


def test_log_stats_of_a_disabled_scaler_and_of_paddles_own(monkeypatch):
    writer = RecordingWriter()
    assert log_stats(writer, GradScaler(enable=False), 0, prefix="") is not None
    assert writer.scalars == [(tag, 1.0 if tag == "loss_scale" else 0, 0) for tag in STATS_TAGS]
    paddles = paddle_oracle(monkeypatch, init_loss_scaling=64.0)
    writer = RecordingWriter()
    assert log_stats(writer, paddles, 3) is None  # Paddle's counts nothing: the scale only
    assert writer.scalars == [("amp/loss_scale", 64.0, 3)]


def test_log_stats_into_visualdl_reads_back(tmp_path):
    visualdl = pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
    scaler = trained(GradScaler(init_loss_scaling=1024.0))
    with visualdl.LogWriter(logdir=str(tmp_path)) as writer:
        for step in range(3):
            log_stats(writer, scaler, step)
    (name,) = os.listdir(tmp_path)
    reader = visualdl.LogReader(file_path=str(tmp_path / name))
    assert {f"amp/{tag}" for tag in STATS_TAGS} <= set(reader.get_tags()["scalar"])
    assert [point.value for point in reader.get_data("scalar", "amp/skipped")] == [3, 3, 3]


# -- ScalerCallback in paddle.Model.fit --------------------------------------------------------


class Blobs(paddle.io.Dataset):
    def __init__(self, size):
        rng = np.random.default_rng(0)
        self.labels = rng.integers(0, 3, (size, 1)).astype("int64")
        self.inputs = (rng.standard_normal((size, 8)) + self.labels * 2.0).astype("float32")

    def __getitem__(self, index):
        return self.inputs[index], self.labels[index]

    def __len__(self):
        return len(self.inputs)


class StateAtEachStep(paddle.callbacks.Callback):
    """The reference: the scaler's scale and skips at the beginning of every step."""

    def __init__(self):
        super().__init__()
        self.states = []

    def on_train_batch_begin(self, step, logs=None):
        scaler = self.model._scaler
        self.states.append(
            None if scaler is None else (scaler.get_loss_scaling(), scaler.stats().skipped)
        )


def fit(callbacks, steps, log_freq, amp=True, install=True, batch=8):
    if install:
        paddle_amp_scaler.install()
    try:
        paddle.seed(0)
        network = paddle.nn.Sequential(
            paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 3)
        )
        emulate_fp16_grads(network)
        model = paddle.Model(network)
        model.prepare(
            paddle.optimizer.Adam(learning_rate=1e-3, parameters=network.parameters()),
            paddle.nn.CrossEntropyLoss(),
            amp_configs={"level": "O1", "init_loss_scaling": 2.0**22} if amp else None,
        )
        model.fit(
            Blobs(steps * batch),
            batch_size=batch,
            epochs=1,
            log_freq=log_freq,
            verbose=2,
            callbacks=callbacks,
        )
        return model
    finally:
        paddle_amp_scaler.uninstall()


@pytest.mark.parametrize("ours_first", [True, False], ids=["ours first", "VisualDL first"])
def test_the_callback_reaches_the_progress_bar_and_visualdl_in_either_order(
    ours_first, tmp_path, capsys
):
    visualdl = pytest.importorskip("visualdl", reason="VisualDL is the integrations extra")
    reference, ours = StateAtEachStep(), ScalerCallback()
    writer = paddle.callbacks.VisualDL(log_dir=str(tmp_path))
    listed = [ours, writer] if ours_first else [writer, ours]
    fit([reference, *listed], steps=35, log_freq=10)
    logged = (9, 19, 29, 34)  # 0-based: every tenth step, and the epoch's last

    # The progress bar: every printed step carries both numbers, as they stood.
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == len(logged)
    for line, step in zip(lines, logged):
        assert line.startswith(f"step {step + 1}/35 ")
        scale, skipped = reference.states[step]
        assert f"loss_scale: {scale:.4f}" in line and f"skipped: {skipped} " in line, line

    # VisualDL: both tags, written at the logged steps only, with that step's values.
    (name,) = (n for n in os.listdir(tmp_path) if n.startswith("vdlrecords"))
    reader = visualdl.LogReader(file_path=os.path.join(tmp_path, name))
    for tag, field in (("train/loss_scale", 0), ("train/skipped", 1)):
        written = {p.id: p.value for p in reader.get_data("scalar", tag)}
        # VisualDL counts steps from 1.
        assert written == {step + 1: reference.states[step][field] for step in logged}, tag
    assert reference.states[34][1] > 0  # the run skipped: the values are not all zeros


def test_a_thousand_step_fit_reads_once_per_logged_step():
    counter, ours = HostReadCounter(), ScalerCallback()
    reads_at = []
    original = ours.on_train_batch_begin

    def watched(step, logs=None):
        before = counter.reads["scaler"]
        original(step, logs)
        if counter.reads["scaler"] != before:
            reads_at.append(step)

    ours.on_train_batch_begin = watched
    with counter.counting():
        fit([ours], steps=1000, log_freq=10, batch=2)
    # On a CPU the scaler's own steps read once per 100 iterations, for the stuck policy
    # (on by default); every other read is the callback's.
    assert counter.reads["scaler"] == 100 + 1000 // 100
    assert reads_at == list(range(9, 1000, 10))


@pytest.mark.parametrize("amp", [True, False], ids=["paddle's scaler", "no amp"])
def test_paddles_own_scaler_or_none_logs_scale_one_and_never_raises(amp, capsys):
    # Not installed: on a CPU Paddle's own scaler switches itself off.
    fit([ScalerCallback()], steps=10, log_freq=5, amp=amp, install=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert lines and all("loss_scale: 1.0000" in line and "skipped: 0 " in line for line in lines)


@pytest.mark.parametrize("log_freq", [0, -5, 2.5, "10"])
def test_a_log_freq_that_is_no_step_count_is_refused(log_freq):
    with pytest.raises((ValueError, TypeError), match="log_freq"):
        ScalerCallback(log_freq=log_freq)


def test_a_given_scaler_and_log_freq_are_used(capsys):
    scaler = GradScaler(init_loss_scaling=8.0)
    fit([ScalerCallback(scaler, log_freq=4)], steps=8, log_freq=4)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and all("loss_scale: 8.0000 - skipped: 0 " in line for line in lines)


# -- ScalerTrainerCallback -----------------------------------------------------------------------


class CallbackHandler:
    """The TrainerCallback protocol of PaddleFormers/PaddleNLP (and Hugging Face): every
    event of every callback, in list order, with the same logs dict."""

    def __init__(self, callbacks):
        self.callbacks = list(callbacks)

    def call_event(self, event, args, state, control, **kwargs):
        for callback in self.callbacks:
            result = getattr(callback, event)(
                args,
                state,
                control,
                model=None,
                tokenizer=None,
                optimizer=None,
                lr_scheduler=None,
                train_dataloader=None,
                eval_dataloader=None,
                **kwargs,
            )
            if result is not None:
                control = result
        return control


class ReportTo:
    """A report_to integration: what it was handed at each log."""

    def __init__(self):
        self.logged = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logged.append(dict(logs))

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class Trainer:
    """A Trainer's loop, reduced to what the callbacks see: a step, then a log every
    ``logging_steps``; its report_to integrations registered before any user callback."""

    def __init__(self, scaler, callbacks=(), logging_steps=5, reference=True):
        self.scaler = scaler
        self.reference = reference
        self.report_to = ReportTo()
        self.callback_handler = CallbackHandler([self.report_to, *callbacks])
        self.logging_steps = logging_steps
        self.states_after_logged_steps = []

    def train(self, steps=20):
        model = make_model()
        optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
        injector = GradInjector(model[0].weight)
        self.callback_handler.call_event("on_train_begin", None, None, None)
        for step, batch in enumerate(batches(steps=steps)):
            train_step(
                self.scaler,
                model,
                optimizer,
                batch,
                injector=injector,
                inject=float("inf") if step in (3, 4, 11) else None,
            )
            self.callback_handler.call_event("on_step_end", None, None, None)
            if (step + 1) % self.logging_steps == 0:
                if self.scaler is not None and self.reference:
                    stats = self.scaler.stats()
                    self.states_after_logged_steps.append(
                        (stats.scale, stats.skipped, stats.skip_streak)
                    )
                self.callback_handler.call_event("on_log", None, None, None, logs={"loss": 0.5})


def test_attach_reaches_the_report_to_integrations_with_the_state_after_each_log():
    trainer = Trainer(GradScaler(init_loss_scaling=2.0**10))
    ScalerTrainerCallback.attach(trainer)
    trainer.train()
    logged = trainer.report_to.logged
    assert len(logged) == 4
    for logs, (scale, skipped, streak) in zip(logged, trainer.states_after_logged_steps):
        assert logs == {
            "loss": 0.5,
            "loss_scale": scale,
            "skipped_steps": skipped,
            "skip_streak": streak,
            "nonfinite_loss": 0,
        }
        assert isinstance(logs["loss_scale"], float) and isinstance(logs["skipped_steps"], int)
    assert logged[-1]["skipped_steps"] == 3


def test_listed_among_the_callbacks_it_reaches_those_after_it():
    later = ReportTo()
    trainer = Trainer(GradScaler(), callbacks=[ScalerTrainerCallback(), later])
    trainer.train(steps=10)
    assert "loss_scale" not in trainer.report_to.logged[0]  # registered before it
    assert [logs["skipped_steps"] for logs in later.logged] == [2, 2]


def test_the_trainer_callback_reads_once_per_log_and_never_between():
    trainer = Trainer(GradScaler(), logging_steps=5, reference=False)
    ScalerTrainerCallback.attach(trainer)
    counter = HostReadCounter()
    with counter.counting():
        trainer.train(steps=20)
    # The callback reads in its on_log only; the steps read nothing on a CPU.
    assert counter.reads["scaler"] == len(trainer.report_to.logged) == 4


def test_a_disabled_scaler_logs_one_and_zeros_and_none_adds_nothing():
    trainer = Trainer(GradScaler(enable=False))
    ScalerTrainerCallback.attach(trainer)
    trainer.train(steps=5)
    assert trainer.report_to.logged == [
        {"loss": 0.5, "loss_scale": 1.0, "skipped_steps": 0, "skip_streak": 0}
    ]
    unscaled = Trainer(None)
    ScalerTrainerCallback.attach(unscaled)
    unscaled.train(steps=5)  # no loss scaling: nothing added, nothing raised
    assert unscaled.report_to.logged == [{"loss": 0.5}]
