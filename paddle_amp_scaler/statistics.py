"""What a scaler's run has done, counted on the device, and the policy for a stuck run.

Five counts, with no read in a step: iterations skipped, the current streak of skipped
ones, finite ones since the last skip, growths and back-offs (``RunStatistics``).
``stats()`` reads them, once per call.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np
import paddle
from paddle import Tensor

from . import distributed, kernels
from .pickling import TensorsOnHost

# Untyped for the checker: see kernels.py.
_C_ops: Any = paddle._C_ops

# The device counts, in order. "since_skip" counts iterations since the last skipped one,
# which gives the last skipped iteration without knowing its number on the device.
_COUNTS = ("skipped", "skip_streak", "since_skip", "growths", "backoffs")
# How many iterations the stuck policy lets pass between two reads of the streak.
_MAX_CHECK_INTERVAL = 100


class LossScaleStuckError(RuntimeError):
    """Every one of the last ``stuck_after`` iterations or more was skipped.

    Raised by the ``update()`` or ``minimize()`` that found it, after that iteration's
    update: the scaler is consistent and its ``state_dict()`` resumes.
    """


@dataclasses.dataclass(frozen=True)
class ScalerStats:
    """A scaler's run so far, as read by ``stats()``.

    ``iterations`` ended by ``update()``/``minimize()``; how many of them ``skipped``
    (any optimizer found inf/nan); ``skip_streak``, the current run of consecutive
    skipped iterations; ``last_skipped``, the number (1-based) of the last skipped
    iteration, or None; ``growths`` and ``backoffs``, the times the update rule raised
    or lowered the scale (a back-off held at the floor counts); the current ``scale``.
    """

    iterations: int
    skipped: int
    skip_streak: int
    last_skipped: int | None
    growths: int
    backoffs: int
    scale: float

    @classmethod
    def nothing_yet(cls, scale: float = 1.0) -> ScalerStats:
        return cls(0, 0, 0, None, 0, 0, scale)

    def to_state(self) -> dict[str, int]:
        """The counts as a dict of ints, for state dicts (``last_skipped`` 0 for None)."""
        state = {field: getattr(self, field) for field in _STATE_FIELDS}
        state["last_skipped"] = self.last_skipped or 0
        return state


_STATE_FIELDS = ("iterations", "skipped", "skip_streak", "last_skipped", "growths", "backoffs")


def parse_stats_state(value: Any, name: str) -> ScalerStats:
    """A ``to_state()`` dict, checked for consistency; ValueError naming ``name``."""
    if not isinstance(value, Mapping) or set(value) != set(_STATE_FIELDS):
        raise ValueError(f"{name} must be a dict with the keys {sorted(_STATE_FIELDS)}")
    counts = {}
    for field in _STATE_FIELDS:
        count = value[field]
        if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)):
            raise ValueError(f"{name}[{field!r}] must be an int, got {count!r}")
        if count < 0:
            raise ValueError(f"{name}[{field!r}] must be >= 0, got {count!r}")
        counts[field] = int(count)
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


# Iterations kept at most before they are counted, on a device that counts in batches.
_FOLD_EVERY = 128


class RunStatistics(TensorsOnHost):
    """The counts behind ``ScalerStats``, on the device: an int64 [5] tensor of ``_COUNTS``,
    and the number of iterations on the host.

    An iteration counts from two facts: its verdict, and whether the update rule fired,
    which the rule's counters tell once it has run (it fires exactly when it resets the
    counter of the verdict's kind; a fixed scale never fires). On a CPU the compiled
    module counts each iteration in place as it ends. Elsewhere an iteration keeps its
    verdict and that counter (one small operation), and every 128 iterations, or before
    a read, ``count_pending`` adds them up in a dozen operations.
    """

    def __init__(self, place: Any) -> None:
        self._counts = paddle.to_tensor([0] * len(_COUNTS), dtype=paddle.int64, place=place)
        self._never_fired = paddle.to_tensor([-1], dtype=paddle.int32, place=place)
        self._zero = paddle.to_tensor([0], dtype=paddle.int32, place=place)
        self._pending: list[tuple[Tensor, Tensor]] = []
        self.iterations = 0

    def record(self, found: Tensor, counters: tuple[Tensor, Tensor] | None) -> None:
        """Count one iteration from its verdict ``found`` (bool [1]) and, in dynamic mode,
        the rule's ``(incr_count, decr_count)`` after its update; nothing is read."""
        self.iterations += 1
        incr, decr = counters or (self._never_fired, self._never_fired)
        fused = kernels.fused_ops_for(self._counts)
        if fused is not None:
            self.count_pending()  # iterations kept on the other path come first
            fused.count_iteration(self._counts, found, incr, decr)
            return
        # A copy: the rule's counters move on in place at the next update.
        self._pending.append((found, _C_ops.where(found, decr, incr)))
        if len(self._pending) == _FOLD_EVERY:
            self.count_pending()

    def count_pending(self) -> None:
        """Add up the iterations kept so far, on the device."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        n = len(pending)
        skipped = paddle.concat([found for found, _ in pending]).astype(paddle.int64)
        fired = paddle.equal(paddle.concat([counter for _, counter in pending]), self._zero)
        fired = fired.astype(paddle.int64)
        # 1-based positions of the last skipped and the last finite iteration, 0 if none.
        positions = paddle.arange(1, n + 1, dtype=paddle.int64)
        last_skip = (skipped * positions).max()
        last_finite = ((1 - skipped) * positions).max()
        counts = self._counts
        self._counts = paddle.stack(
            [
                counts[0] + skipped.sum(),
                # A streak that ran through every kept iteration continues the old one.
                paddle.where(last_finite == 0, counts[1] + n, n - last_finite),
                paddle.where(last_skip == 0, counts[2] + n, n - last_skip),
                counts[3] + (fired * (1 - skipped)).sum(),
                counts[4] + (fired * skipped).sum(),
            ]
        )

    def read(self, scale: Tensor) -> ScalerStats:
        """The counts and ``scale``, in one read of the device."""
        self.count_pending()
        values = paddle.concat([self._counts.astype(paddle.float64), scale.astype(paddle.float64)])
        skipped, streak, since_skip, growths, backoffs, current = values.numpy().tolist()
        last = self.iterations - int(since_skip) if skipped else None
        return ScalerStats(
            self.iterations,
            int(skipped),
            int(streak),
            last,
            int(growths),
            int(backoffs),
            float(current),
        )

    def load(self, stats: ScalerStats) -> None:
        self._pending = []
        since_skip = 0 if stats.last_skipped is None else stats.iterations - stats.last_skipped
        counts = [stats.skipped, stats.skip_streak, since_skip, stats.growths, stats.backoffs]
        self._counts = paddle.to_tensor(counts, dtype=paddle.int64, place=self._counts.place)
        self.iterations = stats.iterations


OnStuck = Union[str, Callable[[ScalerStats], Any]]


class StuckPolicy:
    """What to do when ``stuck_after`` consecutive iterations or more were skipped:
    ``"warn"`` (one ``RuntimeWarning`` per streak), ``"raise"`` or a callable taking
    ``ScalerStats``.

    The streak is read once every ``min(stuck_after, 100)`` iterations, so the policy
    fires after ``stuck_after`` to ``stuck_after + k - 1`` consecutive skips.
    """

    def __init__(self, stuck_after: int | None, on_stuck: OnStuck) -> None:
        if stuck_after is not None and (
            isinstance(stuck_after, (bool, np.bool_)) or not isinstance(stuck_after, int)
        ):
            raise TypeError(f"stuck_after must be None or an int, got {stuck_after!r}")
        if stuck_after is not None and stuck_after < 1:
            raise ValueError(f"stuck_after must be None or an int >= 1, got {stuck_after!r}")
        if not (on_stuck in ("warn", "raise") or callable(on_stuck)):
            raise ValueError(
                f'on_stuck must be "warn", "raise" or a callable taking ScalerStats, '
                f"got {on_stuck!r}"
            )
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
