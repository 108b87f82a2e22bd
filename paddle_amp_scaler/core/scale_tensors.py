"""The loss scale on the device: ``rule.LossScaleState``'s numbers as tensors that a step
updates in place and never reads."""

from __future__ import annotations

from typing import Any

import paddle
from paddle import Tensor

from . import rule
from .pickling import TensorsOnHost


class ScaleTensors(TensorsOnHost):
    """The scale (float32 [1]) and its two streak counters (int32 [1]) on one place.

    Updated in place by the unscale path's form of the rule; read by the getters,
    ``stats()`` and ``state_dict()`` only. ``scale`` is the tensor Paddle's trainers know
    as the scaler's ``_scale``.
    """

    def __init__(self, scale: float, place: Any) -> None:
        self.scale = paddle.to_tensor([scale], dtype="float32", place=place)
        self.incr_count = paddle.to_tensor([0], dtype="int32", place=place)
        self.decr_count = paddle.to_tensor([0], dtype="int32", place=place)

    def read(self, policy: rule.Policy) -> rule.LossScaleState:
        """The numbers as a host state (one read of the device per tensor)."""
        return rule.LossScaleState(
            read_number(self.scale),
            int(read_number(self.incr_count)),
            int(read_number(self.decr_count)),
            policy,
        )

    def load(self, state: rule.LossScaleState) -> None:
        """Write a host state's numbers into the tensors, in place."""
        self.scale.fill_(state.scale)
        self.incr_count.fill_(state.incr_count)
        self.decr_count.fill_(state.decr_count)


def read_number(tensor: Tensor) -> float:
    """The value of a one-element device tensor: a device sync, for getters only."""
    return float(tensor.numpy().reshape(-1)[0])
