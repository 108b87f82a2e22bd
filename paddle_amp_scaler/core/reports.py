"""What a scaler learns per gradient, each behind the ``Monitor`` interface: which
gradients held inf or nan (``OverflowRecorder``, for ``overflow_report`` and the log line
of a skipped iteration), and how the measured ones sit against float16's range
(``Measurements``, for ``stats()``' headroom and subnormal share, ``underflow_report``
and ``losing_gradients()``). Both count on the device; the recorder reads its counts once
per iteration, as its option says, and the measurements read nothing in a step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import paddle
from paddle import Tensor

from . import kernels, validation
from .kernels import dtype_name
from .monitor import IterationEnd, Monitor
from .pickling import TensorsOnHost

if TYPE_CHECKING:
    from .loss_scale import LossScale

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
        headroom_bits: ``log2(65504 / amax)`` of its largest magnitude at the current
            scale: how many doublings that scale leaves it before inf (None: all zero).
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
