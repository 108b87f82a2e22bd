"""Which gradients overflowed: inf and nan counted per gradient, on the device.

"Found inf or nan" says nothing about where. With ``report_overflows=True`` each
unscale also counts, per gradient as backward left it, its inf and its nan elements
(queued on the device, no read); the iteration's end reads the counts once, keeps those
of an iteration that found any, and logs it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import paddle
from paddle import Tensor

from . import kernels, validation

logger = logging.getLogger("paddle_amp_scaler")

# How many gradients a log line names.
_LOGGED = 5


@dataclasses.dataclass(frozen=True)
class OverflowEntry:
    """One gradient that held inf or nan in iteration ``iteration`` (1-based)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    num_inf: int
    num_nan: int
    iteration: int


def recorder_for(report_overflows: Any) -> OverflowRecorder | None:
    """The recorder ``report_overflows`` asks for: None for False; for a model, one that
    names each gradient as ``model.named_parameters()`` does, in the report and in the
    log lines alike."""
    if isinstance(validation.check_report_overflows(report_overflows), (bool, np.bool_)):
        return OverflowRecorder() if report_overflows else None
    names = {param.name: name for name, param in report_overflows.named_parameters()}
    return OverflowRecorder(names)


class OverflowRecorder:
    """Counts per gradient during an iteration; keeps the last iteration that had any.

    ``names`` maps Paddle's parameter names (``linear_0.w_0``) to the model's structured
    ones (``0.weight``); a parameter it does not know keeps Paddle's name.
    """

    def __init__(self, names: dict[str, str] | None = None) -> None:
        self._names = names or {}
        # Per unscale: (param, grad dtype) in the order of the tally's rows, and the tally.
        self._pending: list[tuple[list[tuple[Any, Any]], Tensor]] = []
        self._last: list[OverflowEntry] = []
        self._params: dict[str, Any] = {}  # the parameters of self._last, by Paddle name

    def count_(self, params: list[Any], grads: list[Tensor | None]) -> None:
        """Queue each gradient's inf and nan counts (of a sharded one, this rank's shard),
        before an unscale writes them: five operations per gradient."""
        local_grads = [kernels.held(grad) for grad in grads]
        checked = [
            (param, grad) for param, grad in zip(params, local_grads) if kernels.is_checked(grad)
        ]
        if checked:
            counts = [
                paddle.stack([paddle.isinf(grad).sum(), paddle.isnan(grad).sum()])
                for _, grad in checked
            ]
            owners = [(param, grad.dtype) for param, grad in checked]
            self._pending.append((owners, paddle.stack(counts)))

    def end_iteration(self, iteration: int, found_inf: bool | Tensor) -> None:
        """Read this iteration's counts and verdict (one device read); keep the counts of
        an iteration that found inf/nan, and log it if it skipped."""
        pending, self._pending = self._pending, []
        rows = [tally for _, tally in pending]
        if isinstance(found_inf, Tensor):
            # The verdict (reduced over ranks) rides in the same read, as a row of its own.
            flag = kernels.local(found_inf).astype(paddle.int64)
            rows.insert(0, paddle.expand(flag, [1, 2]))
        read = paddle.concat(rows).numpy().tolist() if rows else []
        if isinstance(found_inf, Tensor):
            found_inf, read = bool(read[0][0]), read[1:]
        skipped, counts = found_inf, read
        owners = [owner for unscale_owners, _ in pending for owner in unscale_owners]
        overflowed = [
            (
                param,
                OverflowEntry(
                    self._names.get(param.name, param.name),
                    tuple(param.shape),
                    _name_of(dtype),
                    inf,
                    nan,
                    iteration,
                ),
            )
            for (param, dtype), (inf, nan) in zip(owners, counts)
            if inf or nan
        ]
        if overflowed:
            self._last = sorted(
                (entry for _, entry in overflowed),
                key=lambda entry: -(entry.num_inf + entry.num_nan),
            )
            self._params = {entry.name: param for param, entry in overflowed}
        if not skipped:
            return
        # Logged on rank 0 only, by the package logger's filter: in a distributed run
        # another rank's gradients may be the ones that overflowed.
        if not overflowed:
            logger.warning(
                "iteration %d skipped: inf/nan found, none in the gradients this rank "
                "counted (another rank's, in a distributed run)",
                iteration,
            )
            return
        entries = self.report()
        named = ", ".join(
            f"{entry.name} ({entry.num_inf} inf, {entry.num_nan} nan)"
            for entry in entries[:_LOGGED]
        )
        more = f" and {len(entries) - _LOGGED} more" if len(entries) > _LOGGED else ""
        logger.warning("iteration %d skipped: inf/nan in %s%s", iteration, named, more)

    def __getstate__(self) -> dict[str, Any]:
        # Between iterations nothing is pending; the parameters kept for naming stay out
        # of a pickle (a copy of the weights), so an unpickled report names by param.name.
        return {**self.__dict__, "_pending": [], "_params": {}}

    def report(self, model: Any = None) -> list[OverflowEntry]:
        """The gradients of the last iteration that found inf/nan, most elements first;
        named as in ``model.named_parameters()`` when ``model`` is given (else as the
        recorder names them)."""
        if model is None:
            return list(self._last)
        names = {id(param): name for name, param in model.named_parameters()}
        return [
            dataclasses.replace(entry, name=names.get(id(self._params.get(entry.name)), entry.name))
            for entry in self._last
        ]


def _name_of(dtype: Any) -> str:
    return str(dtype).replace("paddle.", "")
