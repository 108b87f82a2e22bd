"""MindSpore's loss-scale managers and ``mindspore.amp`` functions, over this package's scaler.

A manager's ``get_update_cell()`` gives a ``GradScaler`` applying its policy; the
functional API serves loops written with ``paddle.grad`` (``docs/migration.md``)::

    loss_scaler = DynamicLossScaler(scale_value=2**10, scale_factor=2, scale_window=50)
    grads = loss_scaler.unscale(paddle.grad(loss_scaler.scale(loss), params))
    finite = all_finite(grads)
    ...                                     # apply grads if finite
    loss_scaler.adjust(finite)

The update rule is MindSpore's (``IntervalRule``, never below 1), in its arithmetic: a
manager's ``update_loss_scale`` multiplies a Python float by the factor's reciprocal;
``DynamicLossScaler.adjust`` divides a float32 scale by the factor on the device, through
the scaler's iteration end (which statistics and the stuck policy see).
"""

from __future__ import annotations

from typing import Any

import paddle
from paddle import Tensor

from .. import nested
from ..core import kernels, validation
from ..core.rules import IntervalRule, Memory
from ..core.scaler import GradScaler
from ..core.validation import FLOAT32_MAX, INT32_MAX

__all__ = [
    "DynamicLossScaleManager",
    "DynamicLossScaler",
    "FixedLossScaleManager",
    "StaticLossScaler",
    "all_finite",
]

# MindSpore's DynamicLossScaleManager gives up after this many consecutive overflows.
MAX_CONSECUTIVE_OVERFLOWS = 1000


class FixedLossScaleManager:
    """``mindspore.FixedLossScaleManager``: one scale for the whole run.

    Args:
        loss_scale: the scale, at least 1.
        drop_overflow_update: True: ``get_update_cell()`` gives a scaler that skips
            overflowing steps. False: it gives None and nothing is skipped, as in
            MindSpore.
    """

    @validation.keywords_checked
    def __init__(self, loss_scale: float = 128.0, drop_overflow_update: bool = True) -> None:
        self._fixed_scale = _at_least_one(loss_scale, "loss_scale")
        self._drop_overflow_update = validation.check_bool(
            drop_overflow_update, "drop_overflow_update"
        )

    def get_loss_scale(self) -> float:
        return self._fixed_scale

    def __repr__(self) -> str:
        return (
            f"FixedLossScaleManager(loss_scale={self._fixed_scale!r}, "
            f"drop_overflow_update={self._drop_overflow_update!r})"
        )

    def get_drop_overflow_update(self) -> bool:
        return self._drop_overflow_update

    def update_loss_scale(self, overflow: bool) -> None:
        """A fixed scale does not change."""
        validation.check_bool(overflow, "overflow")

    def get_update_cell(self) -> GradScaler | None:
        """A ``GradScaler`` that keeps this scale and skips overflowing steps; ``None`` when
        ``drop_overflow_update`` is False.
        """
        if not self._drop_overflow_update:
            return None
        return GradScaler(init_loss_scaling=self._fixed_scale, use_dynamic_loss_scaling=False)


class DynamicLossScaleManager:
    """``mindspore.DynamicLossScaleManager``: the scale adapts to overflows.

    Args:
        init_loss_scale: the first scale, at least 1.
        scale_factor: the factor of a growth (> 1); a back-off multiplies by its
            reciprocal.
        scale_window: finite steps in a row before a growth.
    """

    @validation.keywords_checked
    def __init__(
        self, init_loss_scale: float = 2.0**24, scale_factor: float = 2, scale_window: int = 2000
    ) -> None:
        # A Python float, for Python's arithmetic, as MindSpore's manager has it.
        self._memory = Memory(_at_least_one(init_loss_scale, "init_loss_scale"))
        # MindSpore takes any positive factor; one at or below 1 would never back off.
        scale_factor = validation.check_incr_ratio(scale_factor, "scale_factor")
        self._dynamic_rule = IntervalRule(
            incr_ratio=scale_factor,
            decr_ratio=1 / scale_factor,
            incr_every_n_steps=validation.check_period(scale_window, "scale_window"),
            decr_every_n_nan_or_inf=1,
        )
        self._consecutive_overflows = 0

    def get_loss_scale(self) -> float:
        return float(self._memory.scale)

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaleManager(loss_scale={self.get_loss_scale()!r}, "
            f"scale_factor={self._dynamic_rule.incr_ratio!r}, "
            f"scale_window={self._dynamic_rule.incr_every_n_steps!r})"
        )

    def get_drop_overflow_update(self) -> bool:
        return True

    def update_loss_scale(self, overflow: bool) -> None:
        """One iteration of the rule, on the host, for a loop that decides overflow itself;
        ``RuntimeError`` after more than 1000 consecutive overflows (the scale has then
        been updated for this one too).
        """
        overflow = validation.check_bool(overflow, "overflow")
        self._memory, _ = self._dynamic_rule.adjust(self._memory, overflow)
        self._consecutive_overflows = self._consecutive_overflows + 1 if overflow else 0
        if self._consecutive_overflows > MAX_CONSECUTIVE_OVERFLOWS:
            raise RuntimeError(
                f"dynamic loss scale: {self._consecutive_overflows} consecutive overflows, "
                f"more than the {MAX_CONSECUTIVE_OVERFLOWS} allowed; the gradients are not "
                "finite at any scale (check the model and the data for inf/nan)"
            )

    def get_update_cell(self) -> GradScaler:
        """A new ``GradScaler`` that applies this policy in the step, from the current scale."""
        return GradScaler(
            init_loss_scaling=self.get_loss_scale(),
            incr_ratio=self._dynamic_rule.incr_ratio,
            decr_ratio=self._dynamic_rule.decr_ratio,
            incr_every_n_steps=self._dynamic_rule.incr_every_n_steps,
            stuck_after=MAX_CONSECUTIVE_OVERFLOWS + 1,
            on_stuck="raise",
        )


class _LossScaler:
    """What both functional scalers do: scale, unscale, and show the scale."""

    _scaler: GradScaler

    @property
    def scale_value(self) -> Tensor:
        """The current scale, a float32 0-d Tensor (a copy; no read). Assignable, as
        MindSpore's Parameter is: a number or a one-element Tensor, at least 1.
        """
        return self._scaler._scale.reshape([]).clone()

    @scale_value.setter
    def scale_value(self, value: Any) -> None:
        self._scaler.set_init_loss_scaling(
            _at_least_one(_host_value(value, "scale_value"), "scale_value")
        )

    def scale(self, inputs: Any) -> Any:
        """``inputs`` times the scale: a Tensor or (nested) lists/tuples of them."""
        # Straight to the kernel: MindSpore's scalers never switch themselves off (the
        # core's scale() does under bfloat16 autocast), and unscale() must match.
        scale, refuse = self._scaler._scale, nested.refuse_leaves("scale", "inputs")
        return nested.map_tensors(lambda tensor: kernels.scaled(tensor, scale), inputs, refuse)

    def unscale(self, inputs: Any) -> Any:
        """``inputs`` divided by the scale, as new Tensors in their own dtypes."""
        scale, refuse = self._scaler._scale, nested.refuse_leaves("unscale", "inputs")
        return nested.map_tensors(lambda tensor: kernels.unscaled(tensor, scale), inputs, refuse)

    def _finite_flag(self, grads_finite: Any) -> Tensor:
        """``grads_finite`` as a bool [1] tensor beside the scale, without reading it."""
        if isinstance(grads_finite, Tensor):
            if grads_finite.dtype != paddle.bool or grads_finite.size != 1:
                raise TypeError(
                    "grads_finite must be a bool or a one-element bool Tensor (what "
                    f"all_finite returns), got a {grads_finite.dtype} Tensor of shape "
                    f"{list(grads_finite.shape)}"
                )
            return grads_finite.reshape([1])
        finite = validation.check_bool(grads_finite, "grads_finite")
        return paddle.full_like(self._scaler._scale, finite, dtype=paddle.bool)


class StaticLossScaler(_LossScaler):
    """``mindspore.amp.StaticLossScaler``: scale and unscale by a fixed value.

    Args:
        scale_value: the scale, at least 1.
    """

    @validation.keywords_checked
    def __init__(self, scale_value: float) -> None:
        scale = _at_least_one(scale_value, "scale_value")
        self._scaler = GradScaler(init_loss_scaling=scale, use_dynamic_loss_scaling=False)

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale_value={self._scaler.get_loss_scaling()!r})"

    def adjust(self, grads_finite: Any) -> bool:
        """A static scale does not change: returns False, as MindSpore's does."""
        self._finite_flag(grads_finite)
        return False


class DynamicLossScaler(_LossScaler):
    """``mindspore.amp.DynamicLossScaler``: the scale adapts, on the device.

    Args:
        scale_value: the first scale, at least 1.
        scale_factor: an int >= 2: the scale is multiplied by it after ``scale_window``
            finite steps and divided by it on an overflow.
        scale_window: finite steps in a row before a growth.
    """

    @validation.keywords_checked
    def __init__(self, scale_value: float, scale_factor: int, scale_window: int) -> None:
        # MindSpore takes 1, which would never change the scale.
        scale_factor = validation.check_int_within(scale_factor, "scale_factor", 2, INT32_MAX)
        self._scaler = GradScaler(
            init_loss_scaling=_at_least_one(scale_value, "scale_value"),
            incr_ratio=float(scale_factor),
            decr_ratio=1.0 / scale_factor,
            incr_every_n_steps=validation.check_period(scale_window, "scale_window"),
        )
        # MindSpore divides its float32 scale by the factor, where 1 / factor would
        # round differently (scale_factor=3: 33.333332, not 33.333336, from 100).
        self._scaler.set_backoff_divisor(scale_factor)

    @property
    def counter(self) -> Tensor:
        """Finite steps since the scale last changed, an int32 0-d Tensor (a read of the
        device where the scaler does not know it on the host). Assignable, as MindSpore's
        Parameter is: an int (or a one-element integer Tensor) from 0 to
        ``scale_window - 1``.
        """
        return paddle.to_tensor(self._scaler.get_incr_count(), dtype=paddle.int32)

    @counter.setter
    def counter(self, value: Any) -> None:
        value, window = _host_value(value, "counter"), self._scaler.get_incr_every_n_steps()
        self._scaler.set_incr_count(
            validation.check_count(value, "counter", window, "scale_window")
        )

    def __repr__(self) -> str:
        scaler = self._scaler
        return (
            f"DynamicLossScaler(scale_value={scaler.get_loss_scaling()!r}, "
            f"scale_factor={int(scaler.get_incr_ratio())!r}, "
            f"scale_window={scaler.get_incr_every_n_steps()!r}, "
            f"counter={scaler.get_incr_count()!r})"
        )

    def adjust(self, grads_finite: Any) -> bool:
        """Update the scale from ``grads_finite`` (a bool Tensor or a bool), on the device:
        grow after ``scale_window`` finite steps, back off on an overflow. Returns True.
        """
        found = paddle.logical_not(self._finite_flag(grads_finite))
        self._scaler.end_iteration(found=found)
        return True


def all_finite(inputs: Any) -> Tensor:
    """Whether every element of every Tensor in ``inputs`` (a Tensor, or nested lists and
    tuples of them) is finite: a bool 0-d Tensor, computed on the device and not read.
    """
    tensors = nested.tensors_in(inputs, nested.refuse_leaves("all_finite", "inputs"))
    # Integer and bool tensors always pass; the unscale kernel would write its inputs.
    checked = [tensor for tensor in tensors if tensor.is_floating_point() and tensor.size]
    if not checked:
        return paddle.to_tensor(True)
    return paddle.stack([paddle.isfinite(tensor).all() for tensor in checked]).all()


def _host_value(value: Any, name: str) -> Any:
    """A number assigned to a scaler's state, read from a one-element Tensor if it is one
    (an assignment, not a training step: the read is the caller's).
    """
    if not isinstance(value, Tensor):
        return value
    if value.size != 1:
        raise ValueError(
            f"{name} must be a number or a one-element Tensor, got shape {value.shape}"
        )
    return value.numpy().reshape(-1)[0]


def _at_least_one(value: Any, name: str) -> float:
    return validation.check_number_within(value, name, 1.0, FLOAT32_MAX)
