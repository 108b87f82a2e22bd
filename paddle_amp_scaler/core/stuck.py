"""The policy for a stuck run: every one of the last ``stuck_after`` iterations skipped.

Skipping forever is the one failure loss scaling cannot heal (the gradients are inf or
nan at every scale). The streak lives on the device; reading it every iteration would
cost a device sync per step, so it is read once every ``min(stuck_after, 100)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Union

from . import distributed, validation
from .statistics import RunStatistics, ScalerStats

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
