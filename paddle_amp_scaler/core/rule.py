"""The dynamic loss-scaling rule, written once: a frozen state and a pure transition.

``adjust`` is the specification, and this module holds nothing else: no Paddle, no
device. The scalers apply the same rule on the device with no read, in the form each
unscale path has (Paddle's ``update_loss_scaling`` kernel in ``kernels.py``, the
compiled CPU module in ``fused_cpu.py``), and the tests hold every form to ``adjust`` on
long random sequences. Code that keeps its scale on the host, as MindSpore's loss-scale
managers do, calls ``adjust`` itself.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a dynamic loss scale moves: its ratios, its periods and its bounds.

    Args:
        incr_ratio: the factor of a growth.
        decr_ratio: the factor of a back-off.
        incr_every_n_steps: finite iterations in a row before a growth.
        decr_every_n_nan_or_inf: iterations with inf/nan in a row before a back-off.
        min_scale: the scale never falls below it.
        max_scale: the scale never grows above it; None: no bound but float32's range.
        backoff_divisor: back off by dividing by it rather than multiplying by
            ``decr_ratio``, as MindSpore's ``amp.DynamicLossScaler`` does
            (``scale / 3`` and ``scale * float32(1 / 3)`` differ in the last bit).
    """

    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 1000
    decr_every_n_nan_or_inf: int = 1
    min_scale: float = 1.0
    max_scale: float | None = None
    backoff_divisor: float | None = None


@dataclasses.dataclass(frozen=True)
class LossScaleState:
    """A loss scale between two iterations.

    Args:
        scale: the scale.
        incr_count: finite iterations in a row towards the next growth.
        decr_count: iterations with inf/nan in a row towards the next back-off.
        policy: how the scale moves.
        float32: products are rounded to float32, as on the device; False keeps Python
            floats (MindSpore's managers do).
        fired: whether the ``adjust`` that made this state grew or backed off.
    """

    scale: float
    incr_count: int = 0
    decr_count: int = 0
    policy: Policy = Policy()
    float32: bool = True
    fired: bool = False

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

    ``fired`` says whether the rule grew or backed off, even where a bound held the
    scale or float32's limit refused the growth.
    """
    policy = state.policy
    if found:
        decr_count = state.decr_count + 1
        if decr_count < policy.decr_every_n_nan_or_inf:
            return dataclasses.replace(state, incr_count=0, decr_count=decr_count, fired=False)
        lowered = _backed_off(state)
        floor = _rounded(state, policy.min_scale)
        return dataclasses.replace(
            state, scale=max(lowered, floor), incr_count=0, decr_count=0, fired=True
        )
    incr_count = state.incr_count + 1
    if incr_count < policy.incr_every_n_steps:
        return dataclasses.replace(state, incr_count=incr_count, decr_count=0, fired=False)
    grown = _product(state, policy.incr_ratio)
    scale = state.scale
    if math.isfinite(grown):
        scale = grown if policy.max_scale is None else min(grown, _rounded(state, policy.max_scale))
    return dataclasses.replace(state, scale=scale, incr_count=0, decr_count=0, fired=True)


def _rounded(state: LossScaleState, value: float) -> float:
    return float(np.float32(value)) if state.float32 else value


def _product(state: LossScaleState, ratio: float) -> float:
    if not state.float32:
        return state.scale * ratio
    with np.errstate(over="ignore"):
        return float(np.float32(state.scale) * np.float32(ratio))


def _backed_off(state: LossScaleState) -> float:
    divisor = state.policy.backoff_divisor
    if divisor is None:
        return _product(state, state.policy.decr_ratio)
    if not state.float32:
        return state.scale / divisor
    return float(np.float32(state.scale) / np.float32(divisor))
