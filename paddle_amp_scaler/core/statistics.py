"""What a scaler's run has done, counted on the device.

Five counts, with no read in a step: iterations skipped, the current streak of skipped
ones, finite ones since the last skip, growths and back-offs (``RunStatistics``).
``stats()`` reads them, once per call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import paddle
from paddle import Tensor

from .pickling import TensorsOnHost
from .rule import FLOAT16_MAX

if TYPE_CHECKING:
    from .unscale_paths import UnscalePath

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
        backoffs: the times it lowered the scale (a back-off held at the floor counts).
        scale: the current scale.
        headroom_bits: under the headroom policy, log2 of float16's largest value over
            the amax of the last finite measured iteration (how many doublings the
            gradients had left before inf); None where the policy does not measure it,
            or before its first measurement.
    """

    iterations: int
    skipped: int
    skip_streak: int
    last_skipped: int | None
    growths: int
    backoffs: int
    scale: float
    headroom_bits: float | None = None

    @classmethod
    def nothing_yet(cls, scale: float = 1.0) -> ScalerStats:
        return cls(0, 0, 0, None, 0, 0, scale)

    def to_state(self) -> dict[str, int]:
        """The counts as a dict of ints, for state dicts (``last_skipped`` 0 for None)."""
        state = {field: getattr(self, field) for field in _STATE_FIELDS}
        state["last_skipped"] = self.last_skipped or 0
        return state


def headroom_bits(amax: float) -> float | None:
    """log2(FLOAT16_MAX / amax), None for no amax yet (0)."""
    return math.log2(FLOAT16_MAX / amax) if amax > 0 else None


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

    An iteration counts from two facts: its verdict, and whether the update rule fired
    (as the unscale path's form of the rule says; a fixed scale never fires). On a path
    that counts in place (the compiled CPU module) each iteration is counted as it ends.
    Elsewhere an iteration keeps its two flags, and every 128 iterations, or before a
    read, ``count_pending`` adds them up in a dozen operations.
    """

    def __init__(self, path: UnscalePath, place: Any) -> None:
        self._counts = paddle.to_tensor([0] * len(_COUNTS), dtype=paddle.int64, place=place)
        self._path = path
        self._never_fired = paddle.to_tensor([False], place=place)
        self._pending: list[tuple[Tensor, Tensor]] = []
        self.iterations = 0

    def record(self, found: Tensor, fired: Tensor | None) -> None:
        """Count one iteration from its verdict ``found`` and whether the rule ``fired``
        (bool [1] tensors; None: a fixed scale, which never fires); nothing is read."""
        self.iterations += 1
        fired = self._never_fired if fired is None else fired
        count_in_place = self._path.count_iteration_
        if count_in_place is not None:
            count_in_place(self._counts, found, fired)
            return
        self._pending.append((found, fired))
        if len(self._pending) == _FOLD_EVERY:
            self.count_pending()

    def count_pending(self) -> None:
        """Add up the iterations kept so far, on the device."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        n = len(pending)
        skipped = paddle.concat([found for found, _ in pending]).astype(paddle.int64)
        fired = paddle.concat([fired for _, fired in pending]).astype(paddle.int64)
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

    def read(self, scale: Tensor, amax: Tensor | None = None) -> ScalerStats:
        """The counts, ``scale`` and, for the headroom policy, the ``amax`` of the last
        finite measured iteration (0: none yet), in one read of the device."""
        self.count_pending()
        extra = [scale] if amax is None else [scale, amax]
        values = paddle.concat(
            [self._counts.astype(paddle.float64), *(x.astype(paddle.float64) for x in extra)]
        )
        skipped, streak, since_skip, growths, backoffs, current, *measured = values.numpy().tolist()
        last = self.iterations - int(since_skip) if skipped else None
        return ScalerStats(
            self.iterations,
            int(skipped),
            int(streak),
            last,
            int(growths),
            int(backoffs),
            float(current),
            headroom_bits(measured[0]) if measured else None,
        )

    def load(self, stats: ScalerStats) -> None:
        self._pending = []
        since_skip = 0 if stats.last_skipped is None else stats.iterations - stats.last_skipped
        counts = [stats.skipped, stats.skip_streak, since_skip, stats.growths, stats.backoffs]
        self._counts = paddle.to_tensor(counts, dtype=paddle.int64, place=self._counts.place)
        self.iterations = stats.iterations
