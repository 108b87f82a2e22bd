"""The underflow census: where gradient values land in float16's range (flushed to zero,
subnormal, overflowed), counted per iteration."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle

# Where float32 magnitudes land in float16, rounding to nearest, ties to even: at most
# half the smallest subnormal (2**-25, a tie that goes to the even 0) flushes to zero;
# below the midpoint between the largest subnormal and 2**-14 (a tie that goes to the
# even 2**-14) stays subnormal; from the midpoint between 65504 and 65536 up is inf.
FLUSH_LIMIT = 2.0**-25
SUBNORMAL_LIMIT = 2.0**-14 - 2.0**-25
OVERFLOW_LIMIT = 65520.0
_FLOAT32_MANTISSA_BITS, _FLOAT32_EXPONENTS = 23, 256


@dataclasses.dataclass
class CensusCounts:
    """Gradient elements counted by an ``UnderflowCensus``.

    Args:
        nonzero: finite elements other than zero, before rounding.
        flushed: those of them that float16 rounds to zero.
        subnormal: those that float16 holds only as subnormals (nonzero, below 2**-14).
        overflowed: finite elements that float16 rounds to inf.
    """

    nonzero: int = 0
    flushed: int = 0
    subnormal: int = 0
    overflowed: int = 0

    def __add__(self, other: CensusCounts) -> CensusCounts:
        return CensusCounts(
            self.nonzero + other.nonzero,
            self.flushed + other.flushed,
            self.subnormal + other.subnormal,
            self.overflowed + other.overflowed,
        )

    @property
    def flushed_fraction(self) -> float:
        """``flushed / nonzero`` (0.0 with nothing counted)."""
        return self.flushed / self.nonzero if self.nonzero else 0.0

    @property
    def subnormal_fraction(self) -> float:
        """``subnormal / nonzero`` (0.0 with nothing counted)."""
        return self.subnormal / self.nonzero if self.nonzero else 0.0


def count_float16_range(values: Any) -> CensusCounts:
    """Where the elements of ``values`` (a tensor or an array) land when rounded to
    float16: ``CensusCounts`` of them. Elements already inf or nan are left out."""
    return _counted(_finite_magnitudes(values))


def _finite_magnitudes(values: Any) -> np.ndarray:
    array = values.numpy() if isinstance(values, paddle.Tensor) else np.asarray(values)
    magnitudes = np.abs(array.astype(np.float32, copy=False))
    finite: np.ndarray = magnitudes[np.isfinite(magnitudes)]
    return finite


def _counted(finite: np.ndarray) -> CensusCounts:
    nonzero = int(np.count_nonzero(finite))
    at_most_flush = int(np.count_nonzero(finite <= FLUSH_LIMIT))
    below_normal = int(np.count_nonzero(finite < SUBNORMAL_LIMIT))
    zeros = finite.size - nonzero
    return CensusCounts(
        nonzero=nonzero,
        flushed=at_most_flush - zeros,
        subnormal=below_normal - at_most_flush,
        overflowed=int(np.count_nonzero(finite >= OVERFLOW_LIMIT)),
    )


def _add_to_label(by_label: dict[str, CensusCounts], label: str, counts: CensusCounts) -> None:
    by_label[label] = by_label.get(label, CensusCounts()) + counts


class UnderflowCensus:
    """Counts, per iteration, what float16 does to the gradients that reach tensors
    rounded by ``round_through_float16`` (``round_linear_layers`` included): of the
    nonzero finite elements, how many it flushes to zero, how many it keeps only as
    subnormals and how many it turns into inf. With a loss scale these are the scaled
    gradients, as a GPU's fp16 backward holds them.

    Each gradient is read to the host once, in the backward pass (on a GPU, a sync per
    rounded tensor: a tool for experiments, not for production loops). End every
    iteration with ``end_iteration``, saying whether its step was skipped: a skipped
    iteration's counts are discarded, since its gradients never reached the weights::

        census = UnderflowCensus()
        round_linear_layers(model, census)
        for batch in batches:
            scaler.scale(loss_of(model, batch)).backward()
            scaler.step(optimizer)
            scaler.update()
            census.end_iteration(skipped=scaler.last_step_skipped())
        census.kept.flushed_fraction

    Args:
        by_label: also count by the label given to ``round_through_float16``
            (``round_linear_layers`` gives each layer's path in the model): the kept
            iterations' in ``kept_by_label``, the last iteration's (kept or not, in the
            order the backward pass reached them) in ``last_by_label``.
        exponents: also count the nonzero elements of each iteration by their float32
            exponent: after ``end_iteration``, ``last_exponents[e]`` is how many had
            the biased exponent ``e`` (magnitudes in ``[2**(e-127), 2**(e-126))``; 0
            holds float32's subnormals), and ``last_amax`` is their largest magnitude,
            for asking what another scale would have kept.
    """

    def __init__(self, *, by_label: bool = False, exponents: bool = False) -> None:
        self.kept = CensusCounts()
        self.kept_iterations = 0
        self.discarded_iterations = 0
        self.kept_by_label: dict[str, CensusCounts] = {}
        self.last_by_label: dict[str, CensusCounts] = {}
        self.last_exponents: np.ndarray | None = None
        self.last_amax = 0.0
        self._by_label = by_label
        self._current = CensusCounts()
        self._current_by_label: dict[str, CensusCounts] = {}
        self._current_exponents: np.ndarray | None = (
            np.zeros(_FLOAT32_EXPONENTS, dtype=np.int64) if exponents else None
        )
        self._current_amax = 0.0

    def observe(self, grad: paddle.Tensor, label: str = "") -> None:
        """Count one gradient into the current iteration (the hook's body)."""
        finite = _finite_magnitudes(grad)
        counts = _counted(finite)
        self._current = self._current + counts
        if self._by_label:
            _add_to_label(self._current_by_label, label, counts)
        if self._current_exponents is not None:
            # The sign bit is clear: the exponent is all that is left above the mantissa.
            biased = finite[finite > 0].view(np.uint32) >> _FLOAT32_MANTISSA_BITS
            self._current_exponents += np.bincount(biased, minlength=_FLOAT32_EXPONENTS)
            if finite.size:
                self._current_amax = max(self._current_amax, float(finite.max()))

    def hook(self, label: str = "") -> Callable[[paddle.Tensor], None]:
        """A gradient hook that counts into this census and leaves the gradient as it is."""

        def counting(grad: paddle.Tensor) -> None:
            # None leaves the gradient to Paddle as it was; a hook that returns anything
            # but a tensor or None crashes Paddle's backward pass.
            self.observe(grad, label)

        return counting

    def end_iteration(self, *, skipped: bool = False) -> CensusCounts:
        """Close the current iteration: its counts are kept, or discarded if its step was
        ``skipped``. Returns them either way."""
        counts, by_label = self._current, self._current_by_label
        self._current, self._current_by_label = CensusCounts(), {}
        self.last_by_label = by_label
        if self._current_exponents is not None:
            self.last_exponents = self._current_exponents
            self._current_exponents = np.zeros_like(self.last_exponents)
            self.last_amax, self._current_amax = self._current_amax, 0.0
        if skipped:
            self.discarded_iterations += 1
            return counts
        self.kept = self.kept + counts
        self.kept_iterations += 1
        for label, label_counts in by_label.items():
            _add_to_label(self.kept_by_label, label, label_counts)
        return counts
