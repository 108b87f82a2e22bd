"""The scaler's numbers where users already look: VisualDL or TensorBoard, the progress bar
of ``paddle.Model``, the logs of PaddleFormers' and PaddleNLP's ``Trainer``. Each logged
step reads the device once (``stats()``), and no other step reads at all. None of those
libraries is a dependency: each is reached by its own conventions.

- ``log_stats(writer, scaler, step)``: ``writer.add_scalar(tag, value, step)``, the call
  VisualDL's ``LogWriter`` and tensorboardX's ``SummaryWriter`` share.
- ``ScalerCallback``: ``paddle.Model.fit`` hands every callback the same ``logs`` dict,
  and its ``ProgBarLogger`` and ``paddle.callbacks.VisualDL`` show the keys listed in the
  shared ``params["metrics"]``. The callback lists its keys when training begins and
  writes their values at the *beginning* of each logged step (taking them out at the
  others), so every callback's step end sees them, whatever the order of the list: the
  scale the step ran with, and the iterations skipped before it.
- ``ScalerTrainerCallback``: the ``TrainerCallback`` protocol. A Trainer registers its
  ``report_to`` integrations before the user's callbacks, so ``attach(trainer)`` puts one
  at the head of the list, where every other ``on_log`` sees what it added.

Neither ``paddle.Model.fit`` nor the Trainer hands a callback the progress bar's
``log_freq`` or the Trainer itself: ``_calling_object`` finds them among the callers, the
one place this module looks at the stack.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import paddle

from .core.monitoring import ScalerStats
from .core.scaler import AmpScaler
from .core.validation import check_period

__all__ = ["ScalerCallback", "ScalerTrainerCallback", "log_stats"]

# The default of paddle.Model.fit(log_freq=...), where no ProgBarLogger says otherwise.
_FIT_LOG_FREQ = 10


def _read(scaler: Any) -> tuple[float, ScalerStats | None]:
    """The scale and, for this package's scalers, the statistics: one read of the device.
    A disabled scaler is scale 1.0 and no skip; Paddle's own scaler has no statistics.
    """
    if isinstance(scaler, AmpScaler):
        stats = scaler.stats()
        return stats.scale, stats
    if not scaler.is_enable():
        return 1.0, None
    # Paddle's scaler has no getter for its current scale; its own trainers read _scale.
    return float(scaler._scale.numpy().reshape(-1)[0]), None


def log_stats(writer: Any, scaler: Any, step: int, prefix: str = "amp/") -> ScalerStats | None:
    """Write ``loss_scale``, ``skipped`` (cumulative), ``skip_streak``, ``growths``,
    ``backoffs``, ``nonfinite_loss`` where the scaler saw a loss and, where it measures
    the gradients (``measure_every``, or the headroom policy), ``headroom_bits`` and
    ``subnormal_fraction``, through ``writer.add_scalar(prefix + name, value, step)``:
    one read of the device.

    Args:
        writer: VisualDL's ``LogWriter``, tensorboardX's ``SummaryWriter``, or anything
            with their ``add_scalar(tag, value, step)``.
        scaler: this package's scaler, or Paddle's own, which counts nothing: then only
            ``loss_scale`` is written.
        step: the step the values are logged at.
        prefix: put before each name.

    Returns:
        The ``ScalerStats`` written; None for Paddle's own scaler.
    """
    scale, stats = _read(scaler)
    values: dict[str, float] = {"loss_scale": scale}
    if stats is not None:
        values.update(
            skipped=stats.skipped,
            skip_streak=stats.skip_streak,
            growths=stats.growths,
            backoffs=stats.backoffs,
        )
        values.update(_known(stats))
    for name, value in values.items():
        writer.add_scalar(prefix + name, value, step)
    return stats


class ScalerCallback(paddle.callbacks.Callback):  # type: ignore[misc]
    """Puts ``loss_scale``, ``skipped``, ``nonfinite_loss`` and, where the scaler measures
    the gradients, ``headroom_bits`` and ``subnormal_fraction`` in ``paddle.Model.fit``'s
    logs at each logged step, so that its progress bar prints them and
    ``paddle.callbacks.VisualDL`` writes them (``train/loss_scale``, ...), in any order of
    the callbacks.

    Args:
        scaler: the scaler to read; None: the one the model trains with (the one
            ``paddle.Model`` builds under ``amp_configs``: this package's after
            ``install()``).
        log_freq: read at every ``log_freq``-th step and at an epoch's last; None: at
            the steps the ``ProgBarLogger`` prints.
    """

    KEYS = ("loss_scale", "skipped", "nonfinite_loss", "headroom_bits", "subnormal_fraction")
    """The keys it puts in the logs (the last three where the scaler knows them)."""

    def __init__(self, scaler: Any = None, *, log_freq: int | None = None) -> None:
        super().__init__()
        self._scaler = scaler
        self._given_log_freq = None if log_freq is None else check_period(log_freq, "log_freq")
        self._log_freq = self._given_log_freq or _FIT_LOG_FREQ

    def on_train_begin(self, logs: Any = None) -> None:
        metrics = self.params.setdefault("metrics", [])
        metrics.extend(key for key in self.KEYS if key not in metrics)
        self._log_freq = self._given_log_freq or _progress_log_freq() or _FIT_LOG_FREQ

    def on_train_batch_begin(self, step: int, logs: Any = None) -> None:
        if logs is None:
            return
        # The progress bar prints every log_freq-th step and, at the epoch's end, the
        # last one. Elsewhere the keys go: the logs dict lives on from step to step, and
        # paddle.callbacks.VisualDL writes whatever it holds at every step.
        if (step + 1) % self._log_freq and step + 1 != self.params.get("steps"):
            for key in self.KEYS:
                logs.pop(key, None)
            return
        scaler = self._scaler if self._scaler is not None else _model_scaler(self.model)
        if scaler is not None:  # paddle.Model builds its scaler in the first step
            _add_to_logs(logs, scaler, {"skipped": "skipped"})


def _add_to_logs(logs: Any, scaler: Any, counts: dict[str, str]) -> None:
    """Into ``logs``, from one read: ``loss_scale``; the ``counts`` (log key: field of
    ``ScalerStats``), zeros for a scaler that is off, none for Paddle's own, which counts
    nothing; ``nonfinite_loss``, ``headroom_bits`` and ``subnormal_fraction`` where the
    scaler knows them, elsewhere no such keys (the progress bar and VisualDL then show
    nothing for them).
    """
    scale, stats = _read(scaler)
    logs["loss_scale"] = scale
    if stats is not None or not scaler.is_enable():
        for key, field in counts.items():
            logs[key] = getattr(stats, field) if stats is not None else 0
    for key in _WHERE_KNOWN:
        logs.pop(key, None)
    logs.update(_known(stats))


# What a scaler knows only where it saw a loss or measured the gradients.
_WHERE_KNOWN = ("nonfinite_loss", "headroom_bits", "subnormal_fraction")


def _known(stats: ScalerStats | None) -> dict[str, float]:
    """The numbers of ``stats`` that the scaler knows (none before a loss or a
    measurement).
    """
    values = {} if stats is None else {key: getattr(stats, key) for key in _WHERE_KNOWN}
    return {key: value for key, value in values.items() if value is not None}


def _model_scaler(model: Any) -> Any:
    """The scaler ``paddle.Model`` trains with: its ``_scaler``, built at the first step
    under ``amp_configs``; without AMP, a stand-in for no loss scaling.
    """
    scaler = getattr(model, "_scaler", None)
    if scaler is None and getattr(getattr(model, "_adapter", None), "_amp_level", "O0") == "O0":
        return _NO_SCALING
    return scaler


# A model that trains without loss scaling, as a scaler that is off: scale 1.0, no skips.
_NO_SCALING = types.SimpleNamespace(is_enable=lambda: False)


def _calling_object(wanted: Callable[[Any], bool]) -> Any | None:
    """The first ``self`` among the callers' frames for which ``wanted`` holds, or None.

    Only for what no hook hands a callback: ``paddle.Model.fit`` keeps its progress
    bar's ``log_freq`` to its ``CallbackList``, and the Trainer's ``CallbackHandler``
    passes the model and the optimizer but not the Trainer (nor its scaler).
    """
    frame = inspect.currentframe()
    while frame is not None:
        caller = frame.f_locals.get("self")
        if caller is not None and wanted(caller):
            return caller
        frame = frame.f_back
    return None


def _progress_log_freq() -> int | None:
    """The ``log_freq`` of the ``ProgBarLogger`` in the callback list that is calling."""
    listing = _calling_object(lambda caller: isinstance(getattr(caller, "callbacks", None), list))
    for callback in getattr(listing, "callbacks", ()):
        if isinstance(callback, paddle.callbacks.ProgBarLogger):
            return int(callback.log_freq)
    return None


class ScalerTrainerCallback:
    """A ``TrainerCallback`` for PaddleFormers' and PaddleNLP's ``Trainer``: every log the
    Trainer makes while it trains with loss scaling carries ``loss_scale`` (float),
    ``skipped_steps`` and ``skip_streak`` (ints), ``nonfinite_loss`` (int) where the
    scaler saw a loss and, where it measures the gradients, ``headroom_bits`` and
    ``subnormal_fraction`` (floats), as they stand after that log's step.

    Listed in ``Trainer(callbacks=[...])``, it reaches the callbacks listed after it;
    ``ScalerTrainerCallback.attach(trainer)`` puts one ahead of every callback, the
    ``report_to`` integrations included.

    Args:
        scaler: the scaler to read; None: the Trainer's ``scaler``.
    """

    def __init__(self, scaler: Any = None) -> None:
        self._scaler = scaler
        self._trainer: Any = None

    @classmethod
    def attach(cls, trainer: Any, scaler: Any = None) -> ScalerTrainerCallback:
        """A new callback at the head of ``trainer``'s callbacks, returned.

        Args:
            trainer: the PaddleFormers or PaddleNLP ``Trainer`` whose logs get the values.
            scaler: the scaler to read; None: the Trainer's ``scaler``.
        """
        callback = cls(scaler)
        callback._trainer = trainer
        trainer.callback_handler.callbacks.insert(0, callback)
        return callback

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        scaler = self._scaler if self._scaler is not None else self._trainer_scaler()
        if logs is None or scaler is None:
            return  # no loss scaling: nothing to add
        _add_to_logs(logs, scaler, {"skipped_steps": "skipped", "skip_streak": "skip_streak"})

    def _trainer_scaler(self) -> Any:
        """The ``scaler`` of the Trainer: the one ``attach`` was given, else the one whose
        callback handler is calling.
        """
        trainer = self._trainer or _calling_object(
            lambda caller: (
                self in getattr(getattr(caller, "callback_handler", None), "callbacks", ())
            )
        )
        return getattr(trainer, "scaler", None)

    def __getattr__(self, name: str) -> Any:
        # The Trainer calls every event on every callback; this one acts on on_log only.
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)
