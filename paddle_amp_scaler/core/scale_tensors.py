"""The loss scale on the device: ``rule.LossScaleState``'s numbers as tensors that a step
updates in place and never reads."""

from __future__ import annotations

from typing import Any

import paddle
from paddle import Tensor

from . import rule
from .pickling import TensorsOnHost


class ScaleTensors(TensorsOnHost):
    """The scale (float32 [1]), its two streak counters (int32 [1]) and the headroom
    policy's memory (``margin``, ``margin_at`` and ``grown_at``, int32 [1]; ``anchor``
    and ``amax``, float32 [1]) on one place.

    Updated in place by the unscale path's form of the rule; read by the getters,
    ``stats()`` and ``state_dict()`` only. ``scale`` is the tensor Paddle's trainers know
    as the scaler's ``_scale``. The iteration count lives on the host (the statistics').
    """

    def __init__(self, scale: float, place: Any) -> None:
        initial = rule.LossScaleState(scale)
        self.scale = paddle.to_tensor([scale], dtype="float32", place=place)
        self.incr_count = paddle.to_tensor([0], dtype="int32", place=place)
        self.decr_count = paddle.to_tensor([0], dtype="int32", place=place)
        self.margin = paddle.to_tensor([initial.margin], dtype="int32", place=place)
        self.margin_at = paddle.to_tensor([initial.margin_at], dtype="int32", place=place)
        self.anchor = paddle.to_tensor([initial.anchor], dtype="float32", place=place)
        self.grown_at = paddle.to_tensor([initial.grown_at], dtype="int32", place=place)
        self.amax = paddle.to_tensor([initial.amax], dtype="float32", place=place)

    def read(self, policy: rule.Policy, iteration: int = 0) -> rule.LossScaleState:
        """The numbers as a host state, after ``iteration`` iterations (one read)."""
        tensors = (
            self.scale,
            self.incr_count,
            self.decr_count,
            self.margin,
            self.margin_at,
            self.anchor,
            self.grown_at,
            self.amax,
        )
        numbers = paddle.concat([tensor.astype("float64") for tensor in tensors])
        scale, incr, decr, margin, margin_at, anchor, grown_at, amax = numbers.numpy().tolist()
        return rule.LossScaleState(
            scale,
            int(incr),
            int(decr),
            policy,
            margin=int(margin),
            margin_at=int(margin_at),
            anchor=anchor,
            grown_at=int(grown_at),
            amax=amax,
            iteration=iteration,
        )

    def load(self, state: rule.LossScaleState) -> None:
        """Write a host state's numbers into the tensors, in place."""
        self.scale.fill_(state.scale)
        self.incr_count.fill_(state.incr_count)
        self.decr_count.fill_(state.decr_count)
        self.margin.fill_(state.margin)
        self.margin_at.fill_(state.margin_at)
        self.anchor.fill_(state.anchor)
        self.grown_at.fill_(state.grown_at)
        self.amax.fill_(state.amax)


def read_number(tensor: Tensor) -> float:
    """The value of a one-element device tensor: a device sync, for getters only."""
    return float(tensor.numpy().reshape(-1)[0])
