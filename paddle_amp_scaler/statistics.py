"""What a scaler's run has done, counted on the device, and the policy for a stuck run.

Each iteration advances five counters on the device, with no read: the verdict and
whether the update rule changed the scale pick one of four transition matrices, and
their product applies them, folded in batches of up to 128 iterations (on a CPU, one
call of the compiled module counts each iteration in place). ``stats()`` reads them,
once per call.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np
import numpy.typing as npt
import paddle
from paddle import Tensor

from . import distributed, kernels
from .pickling import TensorsOnHost

logger = logging.getLogger("paddle_amp_scaler")
# Untyped for the checker: see kernels.py.
_C_ops: Any = paddle._C_ops

# The device counters, in order. "since_skip" counts iterations since the last skipped
# one, which gives the last skipped iteration without knowing its number on the device.
_COUNTERS = ("skipped", "skip_streak", "since_skip", "growths", "backoffs")
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


def _transition(found: bool, scale_changed: bool) -> npt.NDArray[np.float64]:
    """The matrix that advances ``[*counters, 1]`` by one iteration of this outcome."""
    matrix = np.eye(len(_COUNTERS) + 1)
    index = {name: position for position, name in enumerate(_COUNTERS)}
    constant = len(_COUNTERS)

    def add_one(counter: str) -> None:
        matrix[constant, index[counter]] += 1

    def reset(counter: str) -> None:
        matrix[index[counter], index[counter]] = 0

    if found:
        add_one("skipped")
        add_one("skip_streak")
        reset("since_skip")
        if scale_changed:
            add_one("backoffs")
    else:
        reset("skip_streak")
        add_one("since_skip")
        if scale_changed:
            add_one("growths")
    return matrix


# Iterations a fold counts at most: the slot ring below holds one more than this.
_FOLD_EVERY = 128

# Where the update rule writes one iteration's (incr_count, decr_count).
RuleSlots = tuple[Tensor, Tensor]


class RunCounters(TensorsOnHost):
    """The counters behind ``ScalerStats``: a float64 row ``[*counters, 1]`` on the
    device (exact up to 2**53), and the number of iterations on the host.

    Where the compiled CPU module serves, each iteration is counted as it ends, in place,
    in one call. Elsewhere an iteration costs no operation at all: its verdict and the
    rule's counters after its update are kept as they are (the update writes each
    iteration's counters into a fresh slot of a ring, see ``next_slots``), and ``fold``
    counts up to 128 of them at once: one transition matrix each, multiplied pairwise,
    38 small operations in all.
    """

    def __init__(self, place: Any) -> None:
        # TRANSITIONS[found][scale_changed]. The update rule changed the scale exactly
        # when it reset the counter of this iteration's kind.
        both = (False, True)
        tables = [[_transition(found, changed) for changed in both] for found in both]
        self._transitions = paddle.to_tensor(np.array(tables), place=place)
        self._identity = paddle.to_tensor(np.eye(len(_COUNTERS) + 1)[np.newaxis], place=place)
        self._row = paddle.to_tensor(np.eye(1, len(_COUNTERS) + 1, len(_COUNTERS)), place=place)
        self._zero_count = paddle.to_tensor([0], dtype="int32", place=place)
        # (found, incr_count, decr_count or None in fixed mode) of iterations not yet folded.
        self._unfolded: list[tuple[Tensor, Tensor | None, Tensor | None]] = []
        self._slots: list[RuleSlots] = [
            (
                paddle.to_tensor([0], dtype="int32", place=place),
                paddle.to_tensor([0], dtype="int32", place=place),
            )
            for _ in range(_FOLD_EVERY + 1)
        ]
        self._next_slot = 0
        self._slots_handed_out = 0
        self.iterations = 0

    def next_slots(self) -> RuleSlots:
        """Where the update rule writes this iteration's counters. Slots come round again
        only after a fold: until then the counters an unfolded iteration refers to stay
        as the rule left them, with no copy."""
        if self._slots_handed_out == _FOLD_EVERY:
            self.fold()
        slots = self._slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self._slots)
        self._slots_handed_out += 1
        return slots

    def record_(self, found: Tensor, rule_counters: tuple[Tensor, Tensor] | None) -> None:
        """Count one iteration from its verdict ``found`` (bool [1]) and, in dynamic mode,
        the update rule's ``(incr_count, decr_count)`` after its update (from
        ``next_slots``); nothing is read."""
        self.iterations += 1
        fused = kernels.fused_ops_for(self._row)
        if fused is not None:
            self.fold()  # iterations left by another path come first
            counters = rule_counters or (self._zero_count, self._zero_count)
            fused.count_iteration(self._row, found, *counters, rule_counters is not None)
            return
        incr, decr = rule_counters or (None, None)
        self._unfolded.append((found, incr, decr))
        if len(self._unfolded) == _FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        """Count the iterations kept so far; call it before changing the rule's counters
        in place."""
        unfolded, self._unfolded = self._unfolded, []
        self._slots_handed_out = 0
        if not unfolded:
            return
        found = _C_ops.concat([flag for flag, _, _ in unfolded], 0)
        dynamic = [incr is not None for _, incr, _ in unfolded]
        if any(dynamic):
            # The counter of each iteration's kind, zero where the rule reset it.
            kind = _C_ops.where(
                found,
                _C_ops.concat([self._zero_count if d is None else d for _, _, d in unfolded], 0),
                _C_ops.concat([self._zero_count if i is None else i for _, i, _ in unfolded], 0),
            )
            changed = _C_ops.equal(kind, self._zero_count)
            if not all(dynamic):  # a fixed-scale iteration changed nothing
                changed = _C_ops.logical_and(changed, paddle.to_tensor(dynamic, place=found.place))
        else:
            changed = paddle.zeros_like(found)
        index = _C_ops.cast(_C_ops.stack([found, changed], 1), paddle.int64)
        self._row = _C_ops.matmul(
            self._row, self._product(_C_ops.gather_nd(self._transitions, index)), False, False
        )

    def _product(self, matrices: Tensor) -> Tensor:
        """``matrices[0] @ matrices[1] @ ...``, multiplied pairwise: log2(n) rounds."""
        while matrices.shape[0] > 1:
            if matrices.shape[0] % 2:
                matrices = _C_ops.concat([matrices, self._identity], 0)
            pairs = matrices.reshape([-1, 2, *matrices.shape[1:]])
            matrices = _C_ops.matmul(pairs[:, 0], pairs[:, 1], False, False)
        return matrices[0]

    def read(self, scale: Tensor) -> ScalerStats:
        """The counts and ``scale``, in one read of the device."""
        self.fold()
        values = paddle.concat([self._row[0, :-1], scale.astype(paddle.float64)]).numpy()
        skipped, streak, since_skip, growths, backoffs, current = values.tolist()
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
        self._unfolded = []
        self._slots_handed_out = 0
        since_skip = 0 if stats.last_skipped is None else stats.iterations - stats.last_skipped
        counts = [stats.skipped, stats.skip_streak, since_skip, stats.growths, stats.backoffs]
        self._row = paddle.to_tensor([[*counts, 1]], dtype=paddle.float64, place=self._row.place)
        self.iterations = stats.iterations


OnStuck = Union[str, Callable[[ScalerStats], Any]]


class StuckPolicy:
    """What to do when ``stuck_after`` consecutive iterations or more were skipped:
    ``"warn"`` (once per streak), ``"raise"`` or a callable taking ``ScalerStats``.

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

    def after_iteration(self, counters: RunCounters, read_stats: Callable[[], ScalerStats]) -> None:
        if self.check_interval is None or counters.iterations % self.check_interval:
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
            if streak_start != self._warned_streak_start:
                self._warned_streak_start = streak_start
                logger.warning(message)
                if distributed.on_rank_zero():  # as the log: one rank speaks for all
                    warnings.warn(message, RuntimeWarning, stacklevel=4)
