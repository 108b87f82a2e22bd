"""What watches a run as a whole: its statistics (``RunStatistics``, read as
``ScalerStats``), the policy for a run that skips every step (``StuckPolicy``, the one
failure loss scaling cannot heal), and a scaler's monitors together (``Monitors``, with
the per-gradient ones of ``reports``), each behind the ``Monitor`` interface.

All of them count on the device with no read in a step, but the overflow counts (one read
per iteration, asked for) and the stuck policy (one read per ``min(stuck_after, 100)``
iterations).
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union, cast

import paddle
from paddle import Tensor

from . import distributed, kernels, validation
from .monitor import IterationEnd, Monitor
from .pickling import TensorsOnHost
from .reports import (
    Measured,
    Measurements,
    OverflowEntry,
    UnderflowEntry,
    UnderflowReading,
    recorder_for,
)

if TYPE_CHECKING:
    from .loss_scale import LossScale
    from .rules import Memory


# The device counts, in order. "since_skip" counts iterations since the last skipped one,
# which gives the last skipped iteration without knowing its number on the device.
_COUNTS = (
    "skipped",
    "skip_streak",
    "since_skip",
    "growths",
    "backoffs",
    "nonfinite_loss",
    "nonfinite_streak",
)


@dataclasses.dataclass(frozen=True)
class ScalerStats:
    """A scaler's run so far, as read by ``stats()``.

    Args:
        iterations: the iterations ended by ``update()`` or ``minimize()``.
        skipped: how many of them were skipped (an optimizer found inf/nan).
        skip_streak: the current run of consecutive skipped iterations.
        last_skipped: the number (1-based) of the last skipped iteration, or None.
        growths: the times the update rule raised the scale.
        backoffs: the times it backed off after an overflow (one held at the floor
            counts; the headroom policy's fit downward, which skips nothing, does not).
        scale: the current scale.
        headroom_bits: ``log2(65504 / amax)`` of the last finite measured iteration's
            gradients times ``scale``: how many doublings the current scale leaves them
            before inf. None before any measurement; negative where they were not float16
            (``docs/monitoring.md``).
        subnormal_fraction: of that iteration's nonzero scaled gradient elements, the
            share in float16's subnormal range (``0 < |g| < 2**-14``); None as above.
        nonfinite_loss: the iterations whose loss, as handed to ``scale()``, was inf or
            nan already: a forward (or data) problem, which no scale fixes. None for a
            scaler that never saw a loss.
    """

    iterations: int
    skipped: int
    skip_streak: int
    last_skipped: int | None
    growths: int
    backoffs: int
    scale: float
    headroom_bits: float | None = None
    subnormal_fraction: float | None = None
    nonfinite_loss: int | None = None

    def to_state(self) -> dict[str, int]:
        """The counts as a dict of ints, for state dicts (``last_skipped`` 0 for None;
        ``nonfinite_loss`` left out where None).
        """
        state = {field: getattr(self, field) for field in _STATE_FIELDS}
        state["last_skipped"] = self.last_skipped or 0
        if self.nonfinite_loss is not None:
            state["nonfinite_loss"] = self.nonfinite_loss

        return state


_STATE_FIELDS = ("iterations", "skipped", "skip_streak", "last_skipped", "growths", "backoffs")
# Saved where the scaler saw a loss: the count, and how many of the latest iterations in a
# row had a non-finite loss (the stuck policy's evidence, kept for an exact resume).
_LOSS_FIELDS = ("nonfinite_loss", "nonfinite_streak")


def parse_stats_state(value: Any, name: str = "state_dict['stats']") -> tuple[ScalerStats, int]:
    """A saved run's statistics (``RunStatistics.state``), checked for consistency, and its
    ``nonfinite_streak`` (0 where not saved); ``ValueError`` (``TypeError`` for a value of
    the wrong kind) naming ``name``.
    """
    present = [key for key in _LOSS_FIELDS if isinstance(value, dict) and key in value]
    fields = _STATE_FIELDS + _LOSS_FIELDS if present else _STATE_FIELDS
    validation.check_keys(value, name, fields)
    counts = {
        field: validation.check_int_within(value[field], f"{name}[{field!r}]", 0, 2**63 - 1)
        for field in fields
    }
    streak_of_losses = counts.pop("nonfinite_streak", 0)

    iterations, skipped, streak, last = (counts[field] for field in _STATE_FIELDS[:4])
    if not (
        streak <= skipped <= iterations
        and last <= iterations
        and (last == 0) == (skipped == 0)
        and (streak == 0 or last == iterations)
        and streak <= last
        and streak_of_losses <= counts.get("nonfinite_loss", 0) <= iterations
    ):
        raise ValueError(f"{name} holds counts that no run can produce: {dict(value)}")

    stats = dataclasses.replace(ScalerStats(**counts, scale=1.0), last_skipped=last or None)
    return stats, streak_of_losses


# Iterations kept at most before they are counted.
_FOLD_EVERY = 128


class RunStatistics(Monitor, TensorsOnHost):
    """The counts behind ``ScalerStats``: an int64 tensor of ``_COUNTS`` on the device, and
    the number of iterations on the host.

    An iteration's verdict, whether the rule acted and whether its loss was finite (host
    bools or bool tensors) are kept as they come, and added up every ``_FOLD_EVERY``
    iterations or before a read.
    """

    def __init__(self, place: Any) -> None:
        self.counts = paddle.to_tensor([0] * len(_COUNTS), dtype=paddle.int64, place=place)
        self._pending: list[tuple[bool | Tensor, bool | Tensor, bool | Tensor]] = []
        self.iterations = 0

        # Whether ``scale()`` has ever seen a loss, and whether this iteration's were all
        # finite (a bool tensor; None before the first of them).
        self.saw_loss = False
        self.loss_finite: Tensor | None = None
        # The latest run of iterations with a non-finite loss, as last read.
        self.nonfinite_streak = 0

    def loss_seen(self, loss: Tensor) -> None:
        """Note whether a loss handed to ``scale()`` is finite, on the device: one
        operation for a 0-d loss, and one more for each further loss of the iteration
        (gradient accumulation: any non-finite one counts).
        """
        finite = kernels.C_ops.isfinite(kernels.local_value(loss))
        if finite.ndim:
            finite = finite.all()

        if self.loss_finite is not None:
            finite = paddle.logical_and(self.loss_finite, finite)
        self.loss_finite, self.saw_loss = finite, True

    def end_iteration(self, end: IterationEnd) -> None:
        """Count one iteration; nothing is read."""
        # Kept as it came: a host bool where the verdict reached the host, else the flag.
        verdict = end.verdict
        found = verdict.flag if verdict.on_host is None else verdict.on_host
        loss_finite = True if self.loss_finite is None else self.loss_finite
        self.iterations += 1
        self._pending.append((found, end.acted, loss_finite))
        self.loss_finite = None

        if len(self._pending) == _FOLD_EVERY:
            self.count_pending()

    def count_pending(self) -> None:
        """Add up the iterations kept so far, on the device."""
        pending, self._pending = self._pending, []
        if not pending:
            return

        n = len(pending)
        skipped = self._column([found for found, _, _ in pending])
        fired = self._column([acted for _, acted, _ in pending])
        loss_finite = self._column([finite for _, _, finite in pending])

        # The 1-based positions of the last iteration of each kind, 0 if none: the streaks
        # run from there to the end.
        positions = paddle.arange(1, n + 1, dtype=paddle.int64)
        # The kernel itself: Paddle 3.2's paddle.max and Tensor.max warn on a user's
        # terminal ("Non compatible API": PyTorch's max differs).
        last_skip = kernels.C_ops.max(skipped * positions, [], False)
        last_finite = kernels.C_ops.max((1 - skipped) * positions, [], False)
        last_finite_loss = kernels.C_ops.max(loss_finite * positions, [], False)

        counts = self.counts
        self.counts = paddle.stack(
            [
                counts[0] + skipped.sum(),
                # A streak that ran through every kept iteration continues the old one.
                paddle.where(last_finite == 0, counts[1] + n, n - last_finite),
                paddle.where(last_skip == 0, counts[2] + n, n - last_skip),
                counts[3] + (fired * (1 - skipped)).sum(),
                counts[4] + (fired * skipped).sum(),
                counts[5] + (1 - loss_finite).sum(),
                paddle.where(last_finite_loss == 0, counts[6] + n, n - last_finite_loss),
            ]
        )

    def _column(self, flags: list[bool | Tensor]) -> Tensor:
        """``flags`` as one int64 tensor: each run of host bools in one operation, each
        run of device flags ([1] or 0-d) in one more.
        """
        pieces: list[Tensor] = []
        for on_host, run in itertools.groupby(flags, key=lambda flag: isinstance(flag, bool)):
            if on_host:
                pieces += [paddle.to_tensor(list(run), dtype=paddle.bool, place=self.counts.place)]
                continue

            tensors = [kernels.local_value(cast(Tensor, flag)) for flag in run]
            pieces += tensors if tensors[0].ndim else [paddle.stack(tensors)]

        column = pieces[0] if len(pieces) == 1 else paddle.concat(pieces)
        return column.astype(paddle.int64)

    def stats(self, counts: list[float], scale: float, measured: Measured) -> ScalerStats:
        """The ``ScalerStats`` of ``counts``, the values of ``self.counts`` read after
        ``count_pending``, at ``scale``, with the headroom and subnormal share ``measured``.
        """
        skipped, streak, since_skip, growths, backoffs, nonfinite, nonfinite_streak = (
            int(count) for count in counts
        )
        self.nonfinite_streak = nonfinite_streak

        last = self.iterations - since_skip if skipped else None
        return ScalerStats(
            self.iterations,
            skipped,
            streak,
            last,
            growths,
            backoffs,
            scale,
            measured.headroom_bits,
            measured.subnormal_fraction,
            nonfinite if self.saw_loss else None,
        )

    def state(self, stats: ScalerStats) -> dict[str, int]:
        """``stats`` as a state dict saves them, with the streak of non-finite losses (as
        read with them) where the scaler saw a loss.
        """
        state = stats.to_state()
        if stats.nonfinite_loss is not None:
            state["nonfinite_streak"] = self.nonfinite_streak

        return state

    def load(self, stats: ScalerStats, nonfinite_streak: int) -> None:
        self._pending, self.loss_finite = [], None

        since_skip = 0 if stats.last_skipped is None else stats.iterations - stats.last_skipped
        counts = [stats.skipped, stats.skip_streak, since_skip, stats.growths, stats.backoffs]
        counts += [stats.nonfinite_loss or 0, nonfinite_streak]
        self.counts = paddle.to_tensor(counts, dtype=paddle.int64, place=self.counts.place)
        self.iterations = stats.iterations
        self.saw_loss = stats.nonfinite_loss is not None
        self.nonfinite_streak = nonfinite_streak


class LossScaleStuckError(RuntimeError):
    """Every one of the last ``stuck_after`` iterations or more was skipped.

    Raised by the ``update()`` or ``minimize()`` that found it, after that iteration's
    update: the scaler is consistent and its ``state_dict()`` resumes.
    """


OnStuck = Union[str, Callable[[ScalerStats], Any]]


class StuckPolicy(Monitor):
    """What to do (``on_stuck``) when ``stuck_after`` consecutive iterations or more were
    skipped. The streak is read once every ``k = min(stuck_after, 100)`` iterations (a
    read each step would cost a sync each), so it fires after ``stuck_after`` to
    ``stuck_after + k - 1`` consecutive skips.
    """

    def __init__(
        self,
        stuck_after: int | None,
        on_stuck: OnStuck,
        run: RunStatistics,
        model_type: str | None = None,
    ) -> None:
        if stuck_after is not None:
            if isinstance(stuck_after, bool) or not isinstance(stuck_after, int):
                raise TypeError(f"stuck_after must be None or an int, got {stuck_after!r}")
            if stuck_after < 1:
                raise ValueError(f"stuck_after must be None or an int >= 1, got {stuck_after!r}")

        if not (on_stuck in ("warn", "raise") or callable(on_stuck)):
            raise ValueError(
                'on_stuck must be "warn", "raise" or a callable taking ScalerStats, '
                f"got {on_stuck!r}"
            )

        self.stuck_after = stuck_after
        self.on_stuck = on_stuck
        # Its read of the statistics also gives the streak of non-finite losses.
        self._run = run
        # The type of the model the scaler names gradients by, where it was given one: the
        # model to run locate_overflow on.
        self._model_type = model_type
        self._warned_streak_start: int | None = None

    def end_iteration(self, end: IterationEnd) -> None:
        if self.stuck_after is None or end.number % min(self.stuck_after, 100):
            return

        stats = end.stats()
        if stats.skip_streak < self.stuck_after:
            return

        message = self._cause(stats) + f" (stuck_after={self.stuck_after})"
        if callable(self.on_stuck):
            self.on_stuck(stats)
        elif self.on_stuck == "raise":
            raise LossScaleStuckError(message)
        else:
            streak_start = stats.iterations - stats.skip_streak + 1
            # One report per streak, as a warning (which a user can filter or make an
            # error), from rank 0: one rank speaks for all.
            if streak_start != self._warned_streak_start and distributed.on_rank_zero():
                self._warned_streak_start = streak_start
                warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _cause(self, stats: ScalerStats) -> str:
        """What kept every step of the streak skipped, and what to do about it."""
        streak = f"the last {stats.skip_streak} iterations were all skipped"
        forward = stats.nonfinite_loss is not None
        if forward and self._run.nonfinite_streak >= stats.skip_streak:
            return (
                f"{streak}, and in every one the loss was already inf or nan before "
                "scaling: the forward pass overflowed float16, or the data or the loss "
                "function made inf/nan. No loss scale fixes that (the scale is down to "
                f"{stats.scale:g}). Find the layer: run one iteration inside `with "
                f"paddle_amp_scaler.locate_overflow(model) as found:`{self._model()} and "
                "print(found); then run that layer in float32 or bfloat16, or check the data"
            )

        finite = ", with a finite loss" if forward else ""
        return (
            f"{streak}: inf/nan gradients at every scale down to {stats.scale:g}{finite}. "
            "Check the model and the data for inf/nan, or lower the learning rate; a "
            "forward overflow does not always reach the loss (a relu turns nan into 0): "
            f"paddle_amp_scaler.locate_overflow(model){self._model()} tells"
        )

    def _model(self) -> str:
        if self._model_type is None:
            return ""
        return f" (model: the {self._model_type} this scaler was given as report_overflows)"


class Monitors(TensorsOnHost):
    """A scaler's monitors by role, and in the order they hear an iteration end.

    Args:
        loss_scale: the scale whose rule says which iterations are measured.
        report_overflows: False, True or the model (``recorder_for``).
        stuck_after, on_stuck: the stuck policy (``StuckPolicy``).
    """

    def __init__(
        self, loss_scale: LossScale, report_overflows: Any, stuck_after: Any, on_stuck: Any
    ) -> None:
        self.run = RunStatistics(loss_scale.scale.place)
        self.measured = Measurements(loss_scale)
        self.overflows = recorder_for(report_overflows)
        model_type = None if self.overflows is None else self.overflows.model_type
        self.stuck_policy = StuckPolicy(stuck_after, on_stuck, self.run, model_type)

        # Those that look at the gradients before an unscale writes them.
        self.looking: list[Monitor] = [self.measured]
        if self.overflows is not None:
            self.looking.append(self.overflows)

        # The counts first; the stuck policy last, so that its LossScaleStuckError leaves a
        # consistent, resumable scaler. A monitor that is off is left out: it costs nothing.
        self.in_order: list[Monitor] = [self.run, *self.looking]
        if self.stuck_policy.stuck_after is not None:
            self.in_order.append(self.stuck_policy)

    def end_iteration(self, end: IterationEnd) -> None:
        """Tell every monitor that is on, in order, that an iteration ended."""
        for monitor in self.in_order:
            monitor.end_iteration(end)

    def read(self, loss_scale: LossScale) -> tuple[Memory, ScalerStats, Measured]:
        """The rule's memory, the run's statistics and what was measured (at the current
        scale), in one read.
        """
        self.run.count_pending()
        memory, numbers = loss_scale.read(self.run.counts, self.measured.totals)

        width = len(Measured._fields)
        counts, (true_amax, *elements) = numbers[:-width], numbers[-width:]
        scale = float(memory.scale)
        measured = Measured(true_amax * scale, *elements)
        return memory, self.run.stats(counts, scale, measured), measured

    def load(
        self,
        stats: ScalerStats | None,
        nonfinite_streak: int,
        measured: Measured | None,
        scale: float,
    ) -> None:
        """Take what a state dict saved at ``scale``: the run's counts (None: kept) with the
        streak of non-finite losses, and what was measured.
        """
        if stats is not None:
            self.run.load(stats, nonfinite_streak)
        self.measured.load(measured, scale)

    def overflow_report(self, model: Any) -> list[OverflowEntry]:
        if self.overflows is None:
            raise RuntimeError(
                "overflow_report() needs the per-gradient counts: build the scaler with "
                "report_overflows=True (one device read per iteration)"
            )

        return self.overflows.report(model)

    def underflow_report(self, model: Any) -> list[UnderflowEntry]:
        self._refuse_unmeasured("underflow_report()")
        names = None if self.overflows is None else self.overflows.names
        return self.measured.report(model, names)

    def losing_gradients(self, loss_scale: LossScale) -> UnderflowReading:
        self._refuse_unmeasured("losing_gradients()")
        return self.read(loss_scale)[2].reading(loss_scale.rule.name)

    def _refuse_unmeasured(self, asked: str) -> None:
        if not self.measured.looks_at(1):
            raise RuntimeError(
                f"{asked} needs measured gradients: build the scaler with measure_every=N "
                "(every N-th iteration measured, from the first)"
            )

    def __getstate__(self) -> dict[str, Any]:
        # Between iterations: what is kept uncounted is counted first, on the device.
        self.run.count_pending()
        return super().__getstate__()
