"""``LossScale``: a rule and its memory on the device, moved once per iteration. Paddle's
optimizers leave the found-inf flag behind as a Python bool, so the verdict mostly reaches
the host for free: the counters then follow on the host (``Rule.count``) and the device is
touched only where the rule acts or measures. A verdict known on the device only (plain
SGD's skip by zeroing, MindSpore's ``adjust``) runs the device form.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np
import paddle
from paddle import Tensor

from . import kernels, validation
from .interval import Memory, Rule
from .optimizers import Verdict
from .pickling import TensorsOnHost
from .validation import FLOAT32_MAX


class LossScale(TensorsOnHost):
    """The scale under ``rule``, with the rule's memory as [1] tensors on ``place``;
    ``memory.scale``, always current, is the scaler's ``_scale``. The device's counters
    may lag the host's (``_counters``) until the rule's device form next runs."""

    def __init__(self, rule: Rule, scale: float, place: Any) -> None:
        self.rule = rule
        self.memory = _on_device(rule.memory_type(np.float32(scale)), place)
        # The host's counters (None: the device alone knows them); whether the device has them.
        self._counters: tuple[int, int] | None = (0, 0)
        self._counters_on_device = True

    @property
    def scale(self) -> Tensor:
        return self.memory.scale

    @scale.setter
    def scale(self, scale: Tensor) -> None:
        self.memory = dataclasses.replace(self.memory, scale=scale)

    def advance(self, verdict: Verdict, iteration: int) -> bool | Tensor:
        """Move the memory by the rule after ``iteration`` (1-based), from its verdict (and
        amax, where measured); return whether the rule acted: a host bool where the verdict
        and the counters are on the host, else a bool [1] tensor."""
        found = verdict.on_host
        amax = verdict.amax if self.rule.fits_amax else None
        if found is not None and self._counters is not None:
            incr_count, decr_count, acts = self.rule.count(*self._counters, found)
            touches_device = acts or amax is not None
            if touches_device:
                # The device form moves the device's counters as ``count`` moved these.
                acted = self._adjust_(self._flag(found), amax, iteration)
            self._counters, self._counters_on_device = (incr_count, decr_count), touches_device
            return acted if amax is not None else acts
        flag = cast(Tensor, verdict.flag) if found is None else self._flag(found)
        acted = self._adjust_(flag, amax, iteration)
        # The device alone knows the counters now; the host learns them at its next read.
        self._counters = None
        return acted

    def _flag(self, found: bool) -> Tensor:
        return paddle.full_like(self.memory.incr_count, found, dtype=paddle.bool)

    def _adjust_(self, flag: Tensor, amax: Tensor | None, iteration: int) -> Tensor:
        """The rule's device form, its counters first brought up to date."""
        if self._counters is not None and not self._counters_on_device:
            self.memory.incr_count.fill_(self._counters[0])
            self.memory.decr_count.fill_(self._counters[1])
        return self.rule.adjust_(self._local_memory(), kernels.local(flag), amax, iteration)

    def set_scale(self, scale: float | Tensor, name: str) -> float | Tensor:
        """Set the scale: a number must lie within the rule's bounds (``ValueError`` naming
        ``name``); a one-element tensor is clamped into them on the device, where checking
        it would read it. Returns the number or tensor set."""
        bounds = (self.rule.min_scale, self.rule.max_scale)
        if not isinstance(scale, Tensor):
            number = validation.check_within(validation.check_scale(scale, name), name, bounds)
            self.memory.scale.fill_(number)
            return number
        if scale.size != 1 or not scale.is_floating_point():
            raise ValueError(
                f"{name} must be a float or a one-element floating-point Tensor, got a "
                f"{scale.dtype} Tensor of shape {list(scale.shape)}"
            )
        scale = kernels.local(scale.detach())
        paddle.assign(scale.astype(paddle.float32).reshape([1]), output=kernels.local(self.scale))
        kernels.clip_(self.scale, bounds[0], bounds[1] or FLOAT32_MAX)
        return scale

    def counters(self) -> tuple[int, int]:
        """``incr_count`` and ``decr_count``: the host's copy, else one read."""
        if self._counters is None:
            self.read()
        return cast(tuple[int, int], self._counters)

    def read(self, *also: Tensor) -> tuple[Memory, list[float]]:
        """The memory and the one-element tensors ``also`` as host numbers, in one device read."""
        fields = [field.name for field in dataclasses.fields(self.memory)]
        numbers = kernels.read_numbers(*(getattr(self.memory, name) for name in fields), *also)
        values = self.rule.memory_type(**dict(zip(fields, numbers))).numbers(np.float32)
        if self._counters is None:
            self._counters = (values["incr_count"], values["decr_count"])
        values["incr_count"], values["decr_count"] = self._counters
        return self.rule.memory_type(**values), numbers[len(fields) :]

    def load(self, rule: Rule, memory: Memory) -> None:
        """Take ``rule``, and write host numbers into the memory, in place (the scale
        tensor stays the one Paddle's trainers may hold)."""
        self.rule = rule
        if type(memory) is not type(self.memory):
            on_device = _on_device(memory, self.scale.place)
            self.memory = dataclasses.replace(on_device, scale=self.scale)
        local_memory = self._local_memory()
        for name, number in memory.numbers().items():
            getattr(local_memory, name).fill_(number)
        self._counters, self._counters_on_device = (memory.incr_count, memory.decr_count), True

    def set_counters(self, incr_count: int, decr_count: int) -> None:
        """Set the counters on the host; the device takes them when the rule next runs there."""
        self._counters, self._counters_on_device = (incr_count, decr_count), False

    def _local_memory(self) -> Memory:
        """The memory as this rank holds it: Paddle may have made the scale a dist tensor
        (``kernels``' facts), and the rule writes it through its local value."""
        if not self.memory.scale.is_dist():
            return self.memory  # as a rule, at no cost: a dataclass copy is microseconds
        return dataclasses.replace(self.memory, scale=kernels.local(self.memory.scale))


def _on_device(memory: Memory, place: Any) -> Memory:
    """``memory`` as [1] tensors on ``place``: float32 for its ``FLOATS``, int32 else."""
    tensors: dict[str, Tensor] = {}
    for name, number in memory.numbers().items():
        dtype = "float32" if name in memory.FLOATS else "int32"
        tensors[name] = paddle.to_tensor([number], dtype=dtype, place=place)
    return dataclasses.replace(memory, **tensors)
