"""Which gradients overflowed, and which sit lowest. With ``report_overflows=True`` each
unscale also counts on the device, per gradient as backward left it, its inf and nan
elements; the iteration's end reads the counts once, and keeps and logs an iteration that
found any. A measured iteration (``measure_every``) keeps per gradient, on the device, its
largest magnitude and its elements in float16's subnormal range, for ``stats()`` and
``underflow_report``."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
from paddle import Tensor

from . import kernels, validation
from .kernels import dtype_name
from .pickling import TensorsOnHost

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
    names each gradient as ``model.named_parameters()`` does, in reports and logs."""
    if isinstance(report_overflows, (bool, np.bool_)):
        return OverflowRecorder() if report_overflows else None
    if not callable(getattr(report_overflows, "named_parameters", None)):
        raise TypeError(
            "report_overflows must be a bool, or the model (a paddle.nn.Layer) whose parameter "
            f"names the report and its log lines should use, got {report_overflows!r}"
        )
    return OverflowRecorder({p.name: name for name, p in report_overflows.named_parameters()})


class OverflowRecorder:
    """Counts per gradient during an iteration; keeps the last iteration that had any.
    ``names`` maps Paddle's parameter names (``linear_0.w_0``) to the model's structured
    ones (``0.weight``) where it knows them."""

    def __init__(self, names: dict[str, str] | None = None) -> None:
        self.names = names or {}
        # Per unscale: (param, grad dtype) in the order of the tally's rows, and the tally.
        self._pending: list[tuple[list[tuple[Any, Any]], Tensor]] = []
        # The last iteration that found inf/nan: each entry with its parameter.
        self._last: list[tuple[Any, OverflowEntry]] = []

    def count_(self, params: list[Any], grads: list[Tensor | None]) -> None:
        """Queue each gradient's inf and nan counts (of a sharded one, this rank's shard),
        before an unscale writes them: five operations per gradient."""
        shards = (kernels.held(grad) for grad in grads)
        checked = [(param, grad) for param, grad in zip(params, shards) if kernels.is_checked(grad)]
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
        on_device = isinstance(found_inf, Tensor)
        if on_device:
            # The verdict (reduced over ranks) rides in the same read, as a row of its own.
            rows.insert(0, paddle.expand(kernels.local(found_inf).astype(paddle.int64), [1, 2]))
        counts = paddle.concat(rows).numpy().tolist() if rows else []
        if on_device:
            found_inf, counts = bool(counts[0][0]), counts[1:]
        owners = [owner for unscale_owners, _ in pending for owner in unscale_owners]
        overflowed = []
        for (param, dtype), (inf, nan) in zip(owners, counts):
            if inf or nan:
                name, shape = self.names.get(param.name, param.name), tuple(param.shape)
                entry = OverflowEntry(name, shape, dtype_name(dtype), inf, nan, iteration)
                overflowed.append((param, entry))
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
            logger.warning("iteration %d skipped: inf/nan in %s%s", iteration, named, more)
        else:
            logger.warning(
                "iteration %d skipped: inf/nan found, none in the gradients this rank "
                "counted (another rank's, in a distributed run)",
                iteration,
            )

    def __getstate__(self) -> dict[str, Any]:
        # Between iterations nothing is pending; the parameters kept for naming stay out
        # of a pickle (a copy of the weights): an unpickled report keeps its names.
        last = [(None, entry) for _, entry in self._last]
        return {**self.__dict__, "_pending": [], "_last": last}

    def report(self, model: Any = None) -> list[OverflowEntry]:
        """The gradients of the last iteration that found inf/nan, most elements first,
        named by ``model.named_parameters()`` if given (else as the recorder names them)."""
        names = {} if model is None else {id(p): n for n, p in model.named_parameters()}
        return [
            dataclasses.replace(entry, name=names.get(id(param), entry.name))
            for param, entry in self._last
        ]


def _keys(owners: list[tuple[Any, ...]]) -> list[int]:
    return [owner if isinstance(owner, int) else id(owner) for owner, _, _ in owners]


def _headroom_bits(amax: float) -> float | None:
    return math.log2(validation.FLOAT16_MAX / amax) if amax > 0 else None


class Measurements(TensorsOnHost):
    """What the measured iterations found, kept on the device until read: ``totals``, a
    float64 [3] tensor (largest magnitude, subnormal elements, nonzero elements) over the
    gradients of the last finite measured iteration (zeros before it), and per gradient
    its row of ``kernels.measure``'s table."""

    def __init__(self, place: Any) -> None:
        self.totals = paddle.to_tensor([0.0, 0.0, 0.0], dtype=paddle.float64, place=place)
        # Per unscale of this iteration: each measured gradient's (owner, shape, dtype),
        # its owner a parameter or, for gradients handed over without one, its position.
        self._pending: list[tuple[list[tuple[Any, ...]], Tensor]] = []
        self._owners: list[tuple[Any, ...]] = []
        self._table: Tensor | None = None

    def add(self, params: list[Any] | None, grads: Sequence[Tensor | None], table: Tensor) -> None:
        """Keep one unscale's table until the iteration's end."""
        shards = [kernels.held(grad) for grad in grads]
        owners = [
            (params[index] if params else index, tuple(shard.shape), dtype_name(shard.dtype))
            for index, shard in enumerate(shards)
            if kernels.is_checked(shard)
        ]
        self._pending.append((owners, table))

    def end_iteration(self, found: bool | Tensor, amax: Tensor | None) -> None:
        """Keep this iteration's measurement where it was finite, decided on the device;
        its amax the one the ranks agreed (``amax``), where they did."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if found is True:
            return
        table = paddle.concat([table for _, table in pending])
        owners = [owner for unscale_owners, _ in pending for owner in unscale_owners]
        largest = kernels.C_ops.max(table[:, 0], [], False) if amax is None else amax.reshape([])
        columns = [largest.astype(paddle.float64), table[:, 1].sum(), table[:, 2].sum()]
        totals = paddle.stack(columns)
        # By identity: a parameter compared with == is compared element by element.
        same = self._table is not None and _keys(owners) == _keys(self._owners)
        if isinstance(found, Tensor):
            found = kernels.local(found)
            totals = paddle.where(found, self.totals, totals)
            if same:
                table = paddle.where(found, self._table, table)
        self.totals, self._owners, self._table = totals, owners, table

    def load(self, measured: dict[str, float] | None) -> None:
        """Take the totals a state dict saved (None: none measured yet)."""
        values = [0.0, 0.0, 0.0] if measured is None else list(measured.values())
        self.totals = paddle.to_tensor(values, dtype=paddle.float64, place=self.totals.place)

    @staticmethod
    def readings(totals: list[float]) -> tuple[float | None, float | None]:
        """``headroom_bits`` and ``subnormal_fraction`` from the values of ``totals``."""
        amax, subnormal, nonzero = totals
        return _headroom_bits(amax), (subnormal / nonzero if nonzero else None)

    def report(self, model: Any, names: dict[str, str] | None) -> list[UnderflowEntry]:
        """Per gradient, the largest share near float16's floor first (one read)."""
        if self._table is None:
            return []
        by_id = {} if model is None else {id(p): n for n, p in model.named_parameters()}
        entries = []
        rows = self._table.numpy().tolist()
        for (owner, shape, dtype), (amax, subnormal, nonzero) in zip(self._owners, rows):
            if isinstance(owner, int):
                name = f"grads[{owner}]"
            else:
                name = by_id.get(id(owner)) or (names or {}).get(owner.name, owner.name)
            bits = _headroom_bits(amax)
            entries.append(UnderflowEntry(name, shape, dtype, int(subnormal), int(nonzero), bits))
        return sorted(
            entries,
            key=lambda entry: (-(entry.subnormal_fraction or 0.0), -(entry.headroom_bits or 0.0)),
        )

    def __getstate__(self) -> dict[str, Any]:
        # The parameters stay out of a pickle (a copy of the weights): so do their rows.
        return {**super().__getstate__(), "_pending": [], "_owners": [], "_table": None}
