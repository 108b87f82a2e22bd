"""What watches a run, behind one small interface (``Monitor``): the run's statistics,
the measurements of the scaled gradients, the per-gradient overflow counts, and the policy
for a run that skips every step (the one failure loss scaling cannot heal).

A monitor may look at an iteration's scaled gradients before an unscale writes them
(``looks_at``, ``before_unscale``), and hears the end of every iteration
(``end_iteration``). All of them count on the device with no read in a step, but the
overflow counts (one read per iteration, asked for) and the stuck policy (one read per
``min(stuck_after, 100)`` iterations).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Union, cast

import numpy as np
import paddle
from paddle import Tensor

from . import distributed, kernels, validation
from .kernels import dtype_name
from .pickling import TensorsOnHost

if TYPE_CHECKING:
    from .loss_scale import LossScale
    from .rules import Memory
    from .step import Verdict

logger = logging.getLogger("paddle_amp_scaler")

# How many gradients a log line names.
_LOGGED = 5


class IterationEnd(NamedTuple):
    """An iteration as it ends, told to every monitor.

    Args:
        number: the iteration's number, from 1.
        verdict: whether any stepped optimizer found inf/nan, joined over them.
        acted: whether the rule grew or backed off (a host bool, or a bool [1] tensor).
        stats: reads the scaler's ``ScalerStats`` (a device read).
    """

    number: int
    verdict: Verdict
    acted: bool | Tensor
    stats: Callable[[], ScalerStats]


class Monitor:
    """What watches a run: a monitor overrides the hooks it needs, each a no-op here."""

    def looks_at(self, iteration: int) -> bool:
        """Whether ``before_unscale`` should see the gradients of ``iteration`` (from 1)."""
        return False

    def before_unscale(
        self, params: list[Any] | None, grads: list[Tensor | None], times: Tensor | None
    ) -> Tensor | None:
        """See one unscale's gradients as backward left them (``params``: their parameters,
        None for gradients handed over without); ``times``: a scale they are to be seen at.
        Returns their largest magnitude, float32 [1] on the device, where it measured them.
        """
        return None

    def end_iteration(self, end: IterationEnd) -> None:
        """Hear the end of an iteration (in the order the scaler lists the monitors)."""


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
        self._loss_finite: Tensor | None = None
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

        if self._loss_finite is not None:
            finite = paddle.logical_and(self._loss_finite, finite)
        self._loss_finite, self.saw_loss = finite, True

    @property
    def loss_finite(self) -> Tensor | None:
        """Whether this iteration's losses were all finite (None before one is seen)."""
        return self._loss_finite

    def end_iteration(self, end: IterationEnd) -> None:
        """Count one iteration; nothing is read."""
        # Kept as it came: a host bool where the verdict reached the host, else the flag.
        verdict = end.verdict
        found = verdict.flag if verdict.on_host is None else verdict.on_host
        loss_finite = True if self._loss_finite is None else self._loss_finite
        self.iterations += 1
        self._pending.append((found, end.acted, loss_finite))
        self._loss_finite = None

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
        self._pending, self._loss_finite = [], None

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


@dataclasses.dataclass(frozen=True)
class OverflowEntry:
    """One gradient that held inf or nan in iteration ``iteration`` (1-based)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    num_inf: int
    num_nan: int
    iteration: int


@dataclasses.dataclass(frozen=True)
class UnderflowEntry:
    """One gradient as the last finite measured iteration found it, scaled.

    Args:
        subnormal: its elements in float16's subnormal range (``0 < |g| < 2**-14``),
            the first to flush to zero.
        nonzero: its nonzero elements.
        headroom_bits: ``log2(65504 / amax)`` of its largest magnitude: how many
            doublings of the scale it had left before inf (None: all zero).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    subnormal: int
    nonzero: int
    headroom_bits: float | None

    @property
    def subnormal_fraction(self) -> float | None:
        """``subnormal`` over ``nonzero`` (None: all zero)."""
        return self.subnormal / self.nonzero if self.nonzero else None


def recorder_for(report_overflows: Any) -> OverflowRecorder | None:
    """The recorder ``report_overflows`` asks for: None for False; for a model, one that
    names each gradient as ``model.named_parameters()`` does, in reports and logs.
    """
    if isinstance(report_overflows, (bool, np.bool_)):
        return OverflowRecorder() if report_overflows else None

    if not callable(getattr(report_overflows, "named_parameters", None)):
        raise TypeError(
            "report_overflows must be a bool, or the model (a paddle.nn.Layer) whose parameter "
            f"names the report and its log lines should use, got {report_overflows!r}"
        )

    names = {p.name: name for name, p in report_overflows.named_parameters()}
    return OverflowRecorder(names, type(report_overflows).__name__)


class OverflowRecorder(Monitor):
    """Counts inf and nan per gradient during an iteration; keeps the last iteration that
    had any. ``names`` maps Paddle's parameter names (``linear_0.w_0``) to the model's structured
    ones (``0.weight``) where it knows them, from the model of type ``model_type``.
    """

    def __init__(self, names: dict[str, str] | None = None, model_type: str | None = None) -> None:
        self.names = names or {}
        self.model_type = model_type
        # Per unscale: (param, grad dtype) in the order of the tally's rows, and the tally.
        self._pending: list[tuple[list[tuple[Any, Any]], Tensor]] = []
        # The last iteration that found inf/nan: each entry with its parameter.
        self._last: list[tuple[Any, OverflowEntry]] = []

    def looks_at(self, iteration: int) -> bool:
        return True

    def before_unscale(
        self, params: list[Any] | None, grads: list[Tensor | None], times: Tensor | None
    ) -> None:
        """Queue each gradient's inf and nan counts (of a sharded one, this rank's shard):
        five operations per gradient. Gradients handed over without parameters go uncounted.
        """
        if params is None:
            return

        shards = (kernels.held_shard(grad) for grad in grads)
        checked = [(param, grad) for param, grad in zip(params, shards) if kernels.is_checked(grad)]
        if checked:
            counts = [
                paddle.stack([paddle.isinf(grad).sum(), paddle.isnan(grad).sum()])
                for _, grad in checked
            ]
            owners = [(param, grad.dtype) for param, grad in checked]
            self._pending.append((owners, paddle.stack(counts)))

    def end_iteration(self, end: IterationEnd) -> None:
        """Read this iteration's counts and verdict (one device read); keep the counts of
        an iteration that found inf/nan, and log it if it skipped.
        """
        found_inf, overflowed = self._read(end)
        if overflowed:
            self._last = sorted(overflowed, key=lambda kept: -(kept[1].num_inf + kept[1].num_nan))
        if not found_inf:
            return

        # Logged on rank 0 only, by the package logger's filter: in a distributed run
        # another rank's gradients may be the ones that overflowed.
        if overflowed:
            named = ", ".join(
                f"{entry.name} ({entry.num_inf} inf, {entry.num_nan} nan)"
                for _, entry in self._last[:_LOGGED]
            )
            more = f" and {len(overflowed) - _LOGGED} more" if len(overflowed) > _LOGGED else ""
            logger.warning("iteration %d skipped: inf/nan in %s%s", end.number, named, more)
        else:
            logger.warning(
                "iteration %d skipped: inf/nan found, none in the gradients this rank "
                "counted (another rank's, in a distributed run)",
                end.number,
            )

    def _read(self, end: IterationEnd) -> tuple[bool, list[tuple[Any, OverflowEntry]]]:
        """The iteration's verdict and an entry per gradient that held inf or nan, read
        from the device at once.
        """
        found_inf = end.verdict.on_host
        pending, self._pending = self._pending, []
        rows = [tally for _, tally in pending]
        if found_inf is None:
            # The verdict (reduced over ranks) rides in the same read, as a row of its own.
            flag = kernels.local_value(end.verdict.flag).astype(paddle.int64)
            rows.insert(0, paddle.expand(flag, [1, 2]))

        counts = paddle.concat(rows).numpy().tolist() if rows else []
        if found_inf is None:
            found_inf, counts = bool(counts[0][0]), counts[1:]

        owners = [owner for unscale_owners, _ in pending for owner in unscale_owners]
        overflowed = []
        for (param, dtype), (inf, nan) in zip(owners, counts):
            if inf or nan:
                name, shape = self.names.get(param.name, param.name), tuple(param.shape)
                entry = OverflowEntry(name, shape, dtype_name(dtype), inf, nan, end.number)
                overflowed.append((param, entry))
        return found_inf, overflowed

    def __getstate__(self) -> dict[str, Any]:
        # Between iterations nothing is pending; the parameters kept for naming stay out
        # of a pickle (a copy of the weights): an unpickled report keeps its names.
        last = [(None, entry) for _, entry in self._last]
        return {**self.__dict__, "_pending": [], "_last": last}

    def report(self, model: Any = None) -> list[OverflowEntry]:
        """The gradients of the last iteration that found inf/nan, most elements first,
        named by ``model.named_parameters()`` if given (else as the recorder names them).
        """
        names = _names_by_id(model, [param for param, _ in self._last if param is not None])
        return [
            dataclasses.replace(entry, name=names.get(id(param), entry.name))
            for param, entry in self._last
        ]


def _names_by_id(model: Any, params: list[Any]) -> dict[int, str]:
    """``model``'s structured parameter names by the parameters' identity (none without a
    model). ``ValueError`` where the model holds none of ``params``, the parameters a
    report is about: its names would all fall back to Paddle's, silently.
    """
    if model is None:
        return {}

    names = {id(param): name for name, param in model.named_parameters()}
    if params and not any(id(param) in names for param in params):
        raise ValueError(
            f"model holds none of the parameters the report is about (a "
            f"{type(model).__name__} with {len(names)} parameters): pass the model whose "
            "parameters the optimizer updates"
        )

    return names


def _keys(owners: list[tuple[Any, ...]]) -> list[int]:
    return [owner if isinstance(owner, int) else id(owner) for owner, _, _ in owners]


def _headroom_bits(amax: float) -> float | None:
    return math.log2(validation.FLOAT16_MAX / amax) if amax > 0 else None


# The window of measured iterations that ``Measured``'s window counts are over: each
# iteration weighs this much of the one after it, so the latest four weigh two thirds.
WINDOW_DECAY = 0.75
# The bottom line's thresholds: a subnormal share below which hardly anything is lost, and
# the headroom at or below which the scale is as high as the largest gradient allows.
FLOOR_SHARE = 1e-4
NEAR_CEILING_BITS = 2.0


class Measured(NamedTuple):
    """What the measured iterations found, as host numbers: the largest magnitude of the
    last finite one's gradients (at the scale they are read at: their true amax times it),
    its subnormal and nonzero elements, and both counts over a window of the measured
    finite iterations of late (``WINDOW_DECAY``).
    """

    amax: float = 0.0
    subnormal: float = 0.0
    nonzero: float = 0.0
    subnormal_window: float = 0.0
    nonzero_window: float = 0.0

    @property
    def headroom_bits(self) -> float | None:
        return _headroom_bits(self.amax)

    @property
    def subnormal_fraction(self) -> float | None:
        return self.subnormal / self.nonzero if self.nonzero else None

    @property
    def window_fraction(self) -> float | None:
        """The subnormal share over the window: steadier than one iteration's."""
        return self.subnormal_window / self.nonzero_window if self.nonzero_window else None

    def reading(self, policy: str) -> UnderflowReading:
        """Whether the run loses gradients at float16's floor, and what to do under
        ``policy``: the recipe of ``docs/monitoring.md`` applied to the window's share and
        the headroom.
        """
        share, bits = self.window_fraction, self.headroom_bits
        if share is None or bits is None:
            verdict = "not known yet: no measured iteration had finite, nonzero gradients"
            return UnderflowReading(share, bits, verdict)

        near_floor = (
            f"{share:.1e} of the nonzero scaled gradient elements (over the last measured "
            "iterations) lie in float16's subnormal range, near its floor"
        )
        if share < FLOOR_SHARE:
            verdict = f"no: {near_floor}, under {FLOOR_SHARE:g}; nothing to do"
        elif bits < 0:
            verdict = (
                f"not as float16 would: {near_floor}, but the largest gradient is beyond "
                "65504 and finite, so the gradients are not float16 (float32 where "
                "amp_guard is off, as on a CPU)"
            )
        elif bits > NEAR_CEILING_BITS:
            remedy = (
                "the headroom policy holds the scale there because larger gradients came "
                "lately, and raises it as their memory fades"
                if policy == "headroom"
                else 'policy="headroom" fits the scale to about 1 bit below it'
            )
            verdict = (
                f"yes, and a higher scale keeps some: {near_floor}, while the largest has "
                f"{bits:.1f} doublings of the current scale left before float16's ceiling; "
                f"{remedy}"
            )
        else:
            verdict = (
                f"yes, and no scale keeps them: {near_floor}, and the largest has only "
                f"{bits:.1f} doublings of the current scale left: float16's range is narrower "
                "than these gradients'. Train in bfloat16, or keep the layers "
                "underflow_report(model) names in float32"
            )
        return UnderflowReading(share, bits, verdict)


class UnderflowReading(NamedTuple):
    """Is the run losing gradients at float16's floor? ``losing_gradients()``'s answer.

    Args:
        subnormal_fraction: the share of the nonzero scaled gradient elements in float16's
            subnormal range, over the last measured finite iterations (each weighing 3/4
            of the one after it): steadier than ``ScalerStats``' share of one iteration. It
            leaves out the gradients all of whose nonzero elements are subnormal, noise
            rather than signal (``underflow_report`` lists them last).
        headroom_bits: as ``ScalerStats.headroom_bits``, at the current scale.
        verdict: the recipe's answer, a sentence that starts with "no", "yes" or "not",
            and what to do; ``str()`` of the reading.
    """

    subnormal_fraction: float | None
    headroom_bits: float | None
    verdict: str

    def __str__(self) -> str:
        return self.verdict


class Measurements(Monitor, TensorsOnHost):
    """What the measured iterations found, kept on the device until read: ``totals``, a
    float64 [5] tensor of ``Measured``'s fields but with the true (unscaled) amax, zeros
    before any finite measured iteration; and per gradient its row of ``kernels.measure``'s
    table, with the scale its rows were measured at.
    """

    def __init__(self, loss_scale: LossScale) -> None:
        # Its rule says which iterations are measured.
        self._loss_scale = loss_scale
        place = loss_scale.scale.place
        self.totals = paddle.to_tensor(Measured(), dtype=paddle.float64, place=place)

        # Per unscale of this iteration: each measured gradient's (owner, shape, dtype),
        # its owner a parameter or, for gradients handed over without one, its position.
        self._pending: list[tuple[list[tuple[Any, ...]], Tensor]] = []
        # The scale the iteration's gradients were scaled by (a copy: the update writes
        # the scale in place before the iteration's end is heard).
        self._scale_then: Tensor | None = None
        self._owners: list[tuple[Any, ...]] = []
        self._table: Tensor | None = None
        self._table_scale: Tensor | None = None
        # Times a row's (subnormal, nonzero): how many of its nonzero elements are not
        # subnormal.
        self._beyond_subnormal = paddle.to_tensor([[-1.0], [1.0]], paddle.float64, place)

    def looks_at(self, iteration: int) -> bool:
        return self._loss_scale.rule.measures(iteration)

    def before_unscale(
        self, params: list[Any] | None, grads: list[Tensor | None], times: Tensor | None
    ) -> Tensor | None:
        """Measure the gradients (``kernels.measure``, times ``times`` if given) and keep
        the table until the iteration's end; returns its amax.
        """
        table = kernels.measure(grads, times=times)
        if table is None:
            return None

        shards = [kernels.held_shard(grad) for grad in grads]
        owners = [
            (params[index] if params else index, tuple(shard.shape), dtype_name(shard.dtype))
            for index, shard in enumerate(shards)
            if kernels.is_checked(shard)
        ]
        if not self._pending:
            self._scale_then = kernels.local_value(self._loss_scale.scale).astype(paddle.float64)
        self._pending.append((owners, table))

        return kernels.amax_in(table)

    def end_iteration(self, end: IterationEnd) -> None:
        """Keep this iteration's measurement where it was finite, decided on the device:
        its amax the one the ranks agreed, where they did, and referred to no scale.
        """
        if not self._pending:
            return

        pending, self._pending = self._pending, []
        found, amax = end.verdict.on_host, end.verdict.amax
        if found:
            # Known on the host to have overflowed: nothing of it is kept.
            return

        scale_then = cast(Tensor, self._scale_then)
        table = paddle.concat([table for _, table in pending])
        owners = [owner for unscale_owners, _ in pending for owner in unscale_owners]
        largest = kernels.C_ops.max(table[:, 0], [], True) if amax is None else amax
        true_amax = largest.astype(paddle.float64) / scale_then

        # Per gradient (subnormal, nonzero), and its signal: 1 where some of its nonzero
        # elements are not subnormal, else 0. The window leaves out the gradients all of
        # whose elements are subnormal: noise (``_lowest_first``), and in a large model
        # enough of it to sway the verdict.
        counts = table[:, 1:]
        signal = kernels.C_ops.sign(paddle.matmul(counts, self._beyond_subnormal))
        latest = paddle.matmul(signal, counts, transpose_x=True).reshape([2])
        window = self.totals[3:] * WINDOW_DECAY + latest
        totals = paddle.concat([true_amax, counts.sum(0), window])

        # Known on the device only: the last finite measurement stays where this one
        # overflowed. The gradients are the same ones where the owners are, by identity (a
        # parameter compared with == is compared element by element).
        same = self._table is not None and _keys(owners) == _keys(self._owners)
        if found is None:
            flag = kernels.local_value(end.verdict.flag)
            totals = paddle.where(flag, self.totals, totals)
            if same:
                table = paddle.where(flag, self._table, table)
                scale_then = paddle.where(flag, self._table_scale, scale_then)

        self.totals, self._owners = totals, owners
        self._table, self._table_scale = table, scale_then

    def load(self, measured: Measured | None, scale: float) -> None:
        """Take what a state dict saved at ``scale`` (None: none measured yet)."""
        values = Measured() if measured is None else measured
        values = values._replace(amax=values.amax / scale)
        self.totals = paddle.to_tensor(values, dtype=paddle.float64, place=self.totals.place)

    def report(self, model: Any, names: dict[str, str] | None) -> list[UnderflowEntry]:
        """Per gradient, the largest share near float16's floor first, and last those whose
        every element is subnormal (one read; the headroom at the current scale).
        """
        if self._table is None:
            return []

        params = [owner for owner, _, _ in self._owners if not isinstance(owner, int)]
        by_id = _names_by_id(model, params)
        entries = []
        *numbers, scale_then, scale = kernels.read_numbers(
            self._table, self._table_scale, self._loss_scale.scale
        )
        rows = np.reshape(numbers, [-1, 3]).tolist()
        for (owner, shape, dtype), (amax, subnormal, nonzero) in zip(self._owners, rows):
            if isinstance(owner, int):
                name = f"grads[{owner}]"
            else:
                name = by_id.get(id(owner)) or (names or {}).get(owner.name, owner.name)
            bits = _headroom_bits(amax / scale_then * scale)
            entries.append(UnderflowEntry(name, shape, dtype, int(subnormal), int(nonzero), bits))

        return sorted(entries, key=_lowest_first)

    def __getstate__(self) -> dict[str, Any]:
        # The parameters stay out of a pickle (a copy of the weights): so do their rows.
        state = super().__getstate__()
        emptied: dict[str, Any] = {"_pending": [], "_scale_then": None, "_owners": []}
        return {**state, **emptied, "_table": None, "_table_scale": None}


def _lowest_first(entry: UnderflowEntry) -> tuple[bool, float, float]:
    """The report's order: the largest subnormal share first, the most headroom (the
    lowest gradient) breaking ties. A gradient all of whose nonzero elements are subnormal
    comes last: that is what rounding leaves of a gradient that is zero in exact
    arithmetic (a key projection's bias, to which softmax is blind), noise rather than the
    layer to fix.
    """
    share = entry.subnormal_fraction or 0.0
    return (share == 1.0, -share, -(entry.headroom_bits or 0.0))


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
