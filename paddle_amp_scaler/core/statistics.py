"""What a scaler's run has done, counted on the device, and what to do when it is stuck.

Five counts, with no read in a step: iterations skipped, the current streak of skipped
ones, finite ones since the last skip, growths and back-offs (``RunStatistics``).
``stats()`` reads them, once per call.

A run whose every step skips (the gradients are inf or nan at every scale) is the one
failure loss scaling cannot heal; ``StuckPolicy`` acts on it. Reading the streak every
iteration would cost a device sync per step, so it is read once every
``min(stuck_after, 100)``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, Union

import paddle
from paddle import Tensor

from . import distributed, kernels, validation
from .pickling import TensorsOnHost

# The device counts, in order. "since_skip" counts iterations since the last skipped one,
# which gives the last skipped iteration without knowing its number on the device.
_COUNTS = ("skipped", "skip_streak", "since_skip", "growths", "backoffs")


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
        headroom_bits: log2 of float16's largest value over the amax (the largest
            magnitude among the scaled gradients) of the last finite measured
            iteration: how many doublings of the scale the gradients had left before
            inf. None where nothing is measured (``"interval"`` without
            ``measure_every``) or before the first measurement; negative where those
            gradients exceeded float16's range without overflowing, so were not float16
            (float32 ones where ``amp_guard`` is off, as on a CPU).
        subnormal_fraction: of the nonzero scaled gradient elements of that iteration,
            the share in float16's subnormal range (``0 < |g| < 2**-14``), where
            precision thins and, below ``2**-24``, values flush to zero; None as above.
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

    def to_state(self) -> dict[str, int]:
        """The counts as a dict of ints, for state dicts (``last_skipped`` 0 for None)."""
        state = {field: getattr(self, field) for field in _STATE_FIELDS}
        state["last_skipped"] = self.last_skipped or 0
        return state


_STATE_FIELDS = ("iterations", "skipped", "skip_streak", "last_skipped", "growths", "backoffs")


def parse_stats_state(value: Any, name: str) -> ScalerStats:
    """A ``to_state()`` dict, checked for consistency; ``ValueError`` (``TypeError`` for a
    value of the wrong kind) naming ``name``."""
    validation.check_keys(value, name, _STATE_FIELDS)
    counts = {
        field: validation.check_int_within(value[field], f"{name}[{field!r}]", 0, 2**63 - 1)
        for field in _STATE_FIELDS
    }
    iterations, skipped, streak, last = (
        counts["iterations"],
        counts["skipped"],
        counts["skip_streak"],
        counts["last_skipped"],
    )
    consistent = (
        streak <= skipped <= iterations
        and last <= iterations
        and (last == 0) == (skipped == 0)
        and (streak == 0 or last == iterations)
        and streak <= last
    )
    if not consistent:
        raise ValueError(f"{name} holds counts that no run can produce: {dict(value)}")
    return ScalerStats(
        iterations,
        skipped,
        streak,
        last or None,
        counts["growths"],
        counts["backoffs"],
        scale=1.0,
    )


# Iterations kept at most before they are counted.
_FOLD_EVERY = 128


class RunStatistics(TensorsOnHost):
    """The counts behind ``ScalerStats``: an int64 [5] tensor of ``_COUNTS`` on the device,
    and the number of iterations on the host.

    An iteration counts from two facts: its verdict, and whether the update rule acted
    (a fixed scale never does), each a host bool where the scaler knew it at no cost or a
    bool [1] tensor. Iterations are kept as they come, and every 128 iterations, or before
    a read, ``count_pending`` adds them up in a few dozen operations.
    """

    def __init__(self, place: Any) -> None:
        self.counts = paddle.to_tensor([0] * len(_COUNTS), dtype=paddle.int64, place=place)
        self._pending: list[tuple[bool | Tensor, bool | Tensor]] = []
        self.iterations = 0

    def record(self, found: bool | Tensor, acted: bool | Tensor) -> None:
        """Count one iteration from its verdict and whether the rule acted; nothing is read."""
        self.iterations += 1
        self._pending.append((found, acted))
        if len(self._pending) == _FOLD_EVERY:
            self.count_pending()

    def count_pending(self) -> None:
        """Add up the iterations kept so far, on the device."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        n = len(pending)
        skipped = self._column([found for found, _ in pending])
        fired = self._column([acted for _, acted in pending])
        # 1-based positions of the last skipped and the last finite iteration, 0 if none.
        positions = paddle.arange(1, n + 1, dtype=paddle.int64)
        # The kernel itself: Paddle 3.2's paddle.max and Tensor.max warn on a user's
        # terminal ("Non compatible API": PyTorch's max differs).
        last_skip = kernels.C_ops.max(skipped * positions, [], False)
        last_finite = kernels.C_ops.max((1 - skipped) * positions, [], False)
        counts = self.counts
        self.counts = paddle.stack(
            [
                counts[0] + skipped.sum(),
                # A streak that ran through every kept iteration continues the old one.
                paddle.where(last_finite == 0, counts[1] + n, n - last_finite),
                paddle.where(last_skip == 0, counts[2] + n, n - last_skip),
                counts[3] + (fired * (1 - skipped)).sum(),
                counts[4] + (fired * skipped).sum(),
            ]
        )

    def _column(self, flags: list[bool | Tensor]) -> Tensor:
        """``flags`` as one int64 tensor: each run of host bools in one operation."""
        pieces: list[Tensor] = []
        run: list[bool] = []
        for flag in [*flags, None]:
            if isinstance(flag, bool):
                run.append(flag)
                continue
            if run:
                pieces.append(paddle.to_tensor(run, dtype=paddle.bool, place=self.counts.place))
                run = []
            if flag is not None:
                pieces.append(kernels.local(flag))
        column = pieces[0] if len(pieces) == 1 else paddle.concat(pieces)
        return column.astype(paddle.int64)

    def stats(self, counts: list[float], scale: float, headroom_bits: float | None) -> ScalerStats:
        """The ``ScalerStats`` of ``counts``, the values of ``self.counts`` read after
        ``count_pending``."""
        skipped, streak, since_skip, growths, backoffs = (int(count) for count in counts)
        last = self.iterations - since_skip if skipped else None
        return ScalerStats(
            self.iterations, skipped, streak, last, growths, backoffs, scale, headroom_bits
        )

    def load(self, stats: ScalerStats) -> None:
        self._pending = []
        since_skip = 0 if stats.last_skipped is None else stats.iterations - stats.last_skipped
        counts = [stats.skipped, stats.skip_streak, since_skip, stats.growths, stats.backoffs]
        self.counts = paddle.to_tensor(counts, dtype=paddle.int64, place=self.counts.place)
        self.iterations = stats.iterations


# -- a stuck run ---------------------------------------------------------------------------

# How many iterations the stuck policy lets pass between two reads of the streak.
_MAX_CHECK_INTERVAL = 100


class LossScaleStuckError(RuntimeError):
    """Every one of the last ``stuck_after`` iterations or more was skipped.

    Raised by the ``update()`` or ``minimize()`` that found it, after that iteration's
    update: the scaler is consistent and its ``state_dict()`` resumes.
    """


OnStuck = Union[str, Callable[[ScalerStats], Any]]


class StuckPolicy:
    """What to do when ``stuck_after`` consecutive iterations or more were skipped:
    ``"warn"`` (one ``RuntimeWarning`` per streak), ``"raise"`` or a callable taking
    ``ScalerStats``.

    The streak is read once every ``min(stuck_after, 100)`` iterations, so the policy
    fires after ``stuck_after`` to ``stuck_after + k - 1`` consecutive skips.
    """

    def __init__(self, stuck_after: int | None, on_stuck: OnStuck) -> None:
        validation.check_stuck_policy(stuck_after, on_stuck)
        self.stuck_after = stuck_after
        self.on_stuck = on_stuck
        self.check_interval = None if stuck_after is None else min(stuck_after, _MAX_CHECK_INTERVAL)
        self._warned_streak_start: int | None = None

    def after_iteration(self, run: RunStatistics, read_stats: Callable[[], ScalerStats]) -> None:
        if self.check_interval is None or run.iterations % self.check_interval:
            return
        stats = read_stats()
        if self.stuck_after is None or stats.skip_streak < self.stuck_after:
            return
        message = (
            f"the last {stats.skip_streak} iterations were all skipped (inf/nan gradients "
            f"at every scale down to {stats.scale:g}); stuck_after={self.stuck_after}. "
            "Check the model and the data for inf/nan, or lower the learning rate"
        )
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
