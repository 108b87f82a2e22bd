"""What a scaler's run has done, counted on the device with no read in a step, and what
to do when every step skips (the one failure loss scaling cannot heal)."""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Callable
from typing import Any, Union, cast

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
        headroom_bits: ``log2(65504 / amax)`` of the last finite measured iteration's
            scaled gradients: how many doublings they had left before inf. None before
            any measurement; negative where they were not float16 (``docs/monitoring.md``).
        subnormal_fraction: of that iteration's nonzero scaled gradient elements, the
            share in float16's subnormal range (``0 < |g| < 2**-14``); None as above.
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


def parse_stats_state(value: Any, name: str = "state_dict['stats']") -> ScalerStats:
    """A ``to_state()`` dict, checked for consistency; ``ValueError`` (``TypeError`` for a
    value of the wrong kind) naming ``name``."""
    validation.check_keys(value, name, _STATE_FIELDS)
    counts = {
        field: validation.check_int_within(value[field], f"{name}[{field!r}]", 0, 2**63 - 1)
        for field in _STATE_FIELDS
    }
    iterations, skipped, streak, last = (counts[field] for field in _STATE_FIELDS[:4])
    if not (
        streak <= skipped <= iterations
        and last <= iterations
        and (last == 0) == (skipped == 0)
        and (streak == 0 or last == iterations)
        and streak <= last
    ):
        raise ValueError(f"{name} holds counts that no run can produce: {dict(value)}")
    return dataclasses.replace(ScalerStats(**counts, scale=1.0), last_skipped=last or None)


# Iterations kept at most before they are counted.
_FOLD_EVERY = 128


class RunStatistics(TensorsOnHost):
    """The counts behind ``ScalerStats``: an int64 [5] tensor of ``_COUNTS`` on the device,
    and the number of iterations on the host. An iteration's verdict and whether the rule
    acted (host bools or bool [1] tensors) are kept as they come and added up every
    ``_FOLD_EVERY`` iterations or before a read."""

    def __init__(self, place: Any) -> None:
        self.counts = paddle.to_tensor([0] * len(_COUNTS), dtype=paddle.int64, place=place)
        self._pending: list[tuple[bool | Tensor, bool | Tensor]] = []
        self.iterations = 0

    def record(self, found: bool | Tensor, acted: bool | Tensor) -> None:
        """Count one iteration; nothing is read."""
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
        for on_host, run in itertools.groupby(flags, key=lambda flag: isinstance(flag, bool)):
            if on_host:
                pieces += [paddle.to_tensor(list(run), dtype=paddle.bool, place=self.counts.place)]
            else:
                pieces += [kernels.local(cast(Tensor, flag)) for flag in run]
        column = pieces[0] if len(pieces) == 1 else paddle.concat(pieces)
        return column.astype(paddle.int64)

    def stats(self, counts: list[float], scale: float, *measured: float | None) -> ScalerStats:
        """The ``ScalerStats`` of ``counts``, the values of ``self.counts`` read after
        ``count_pending``, and of ``measured``: the headroom and subnormal fraction."""
        skipped, streak, since_skip, growths, backoffs = (int(count) for count in counts)
        last = self.iterations - since_skip if skipped else None
        return ScalerStats(
            self.iterations, skipped, streak, last, growths, backoffs, scale, *measured
        )

    def load(self, stats: ScalerStats) -> None:
        self._pending = []
        since_skip = 0 if stats.last_skipped is None else stats.iterations - stats.last_skipped
        counts = [stats.skipped, stats.skip_streak, since_skip, stats.growths, stats.backoffs]
        self.counts = paddle.to_tensor(counts, dtype=paddle.int64, place=self.counts.place)
        self.iterations = stats.iterations


class LossScaleStuckError(RuntimeError):
    """Every one of the last ``stuck_after`` iterations or more was skipped.

    Raised by the ``update()`` or ``minimize()`` that found it, after that iteration's
    update: the scaler is consistent and its ``state_dict()`` resumes.
    """


OnStuck = Union[str, Callable[[ScalerStats], Any]]


class StuckPolicy:
    """What to do (``on_stuck``) when ``stuck_after`` consecutive iterations or more were
    skipped. The streak is read once every ``k = min(stuck_after, 100)`` iterations (a
    read each step would cost a sync each), so it fires after ``stuck_after`` to
    ``stuck_after + k - 1`` consecutive skips."""

    def __init__(self, stuck_after: int | None, on_stuck: OnStuck) -> None:
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
        self._warned_streak_start: int | None = None

    def after_iteration(self, run: RunStatistics, read_stats: Callable[[], ScalerStats]) -> None:
        if self.stuck_after is None or run.iterations % min(self.stuck_after, 100):
            return
        stats = read_stats()
        if stats.skip_streak < self.stuck_after:
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
