"""The dynamic loss-scaling rule, written once: a frozen state and a pure transition.

``adjust`` is the specification. The scalers apply the same rule on the device with no
read (``adjust_on_device_``: Paddle's ``update_loss_scaling`` kernel, or the compiled
CPU module), and the tests hold both to ``adjust`` on long random sequences. Code that
keeps its scale on the host, as MindSpore's loss-scale managers do, calls ``adjust``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import paddle
from paddle import Tensor

from . import kernels

# Untyped for the checker: see kernels.py.
_C_ops: Any = paddle._C_ops


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a dynamic loss scale moves: its ratios, its periods and its bounds (``None``:
    no upper bound but float32's range)."""

    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 1000
    decr_every_n_nan_or_inf: int = 1
    min_scale: float = 1.0
    max_scale: float | None = None


@dataclasses.dataclass(frozen=True)
class LossScaleState:
    """A loss scale between two iterations: the scale, its two streak counters and its
    policy. ``float32``: products are rounded to float32, as on the device; False keeps
    Python floats (MindSpore's managers do)."""

    scale: float
    incr_count: int = 0
    decr_count: int = 0
    policy: Policy = Policy()
    float32: bool = True

    def __post_init__(self) -> None:
        # The device holds the scale in float32 from the start.
        object.__setattr__(self, "scale", _rounded(self, self.scale))


def adjust(state: LossScaleState, found: bool) -> LossScaleState:
    """The state after one iteration whose gradients held inf/nan (``found``) or not::

        if found:
            incr_count = 0; decr_count += 1
            if decr_count == decr_every_n_nan_or_inf:        # back off
                scale = max(scale * decr_ratio, min_scale); decr_count = 0
        else:
            decr_count = 0; incr_count += 1
            if incr_count == incr_every_n_steps:             # grow
                if scale * incr_ratio is finite:
                    scale = min(scale * incr_ratio, max_scale)
                incr_count = 0

    The rule fires (a growth or a back-off, even one held at a bound or refused at
    float32's limit) exactly when it resets the counter of ``found``'s kind to 0.
    """
    policy = state.policy
    if found:
        decr_count = state.decr_count + 1
        if decr_count < policy.decr_every_n_nan_or_inf:
            return dataclasses.replace(state, incr_count=0, decr_count=decr_count)
        lowered = _product(state, policy.decr_ratio)
        return dataclasses.replace(
            state, scale=max(lowered, _rounded(state, policy.min_scale)), incr_count=0, decr_count=0
        )
    incr_count = state.incr_count + 1
    if incr_count < policy.incr_every_n_steps:
        return dataclasses.replace(state, incr_count=incr_count, decr_count=0)
    grown = _product(state, policy.incr_ratio)
    scale = state.scale
    if math.isfinite(grown):
        scale = grown if policy.max_scale is None else min(grown, _rounded(state, policy.max_scale))
    return dataclasses.replace(state, scale=scale, incr_count=0, decr_count=0)


def _rounded(state: LossScaleState, value: float) -> float:
    return float(np.float32(value)) if state.float32 else value


def _product(state: LossScaleState, ratio: float) -> float:
    if not state.float32:
        return state.scale * ratio
    with np.errstate(over="ignore"):
        return float(np.float32(state.scale) * np.float32(ratio))


def adjust_on_device_(
    found: Tensor, scale: Tensor, incr_count: Tensor, decr_count: Tensor, policy: Policy
) -> None:
    """``adjust`` on the device, in place, from a bool [1] verdict; nothing is read.

    The compiled CPU module where it serves, else Paddle's ``update_loss_scaling`` kernel.
    Both floor at 1.0: a lower ``min_scale`` redoes their back-off, a higher one or a
    ``max_scale`` clips after them (no operation for the default bounds).
    """
    fused = kernels.fused_ops_for(scale)
    rule = (
        policy.incr_every_n_steps,
        policy.decr_every_n_nan_or_inf,
        policy.incr_ratio,
        policy.decr_ratio,
    )
    before = scale.clone() if policy.min_scale < 1.0 else None
    if fused is not None:
        fused.update_scale(found, scale, incr_count, decr_count, *rule)
    else:
        # The kernel zeroes its ``xs`` when ``found``, and refuses an empty list: the
        # gradients were dealt with before, so it gets a stand-in.
        stand_in = kernels.stand_in(scale, paddle.float32)
        _C_ops.update_loss_scaling_([stand_in], found, scale, incr_count, decr_count, *rule, False)
    if before is not None:
        # A rare setting: readability over the handful of operations it costs.
        backed_off = paddle.logical_and(found, decr_count == 0)
        floor = paddle.full_like(before, policy.min_scale)
        lowered = paddle.maximum(before * policy.decr_ratio, floor)
        paddle.assign(paddle.where(backed_off, lowered, scale), output=scale)
    if policy.min_scale > 1.0 or policy.max_scale is not None:
        kernels.clip_(scale, policy.min_scale, policy.max_scale)
