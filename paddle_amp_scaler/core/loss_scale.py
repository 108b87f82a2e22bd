"""``LossScale``: the scale and the rule's memory on the device, moved by the rule once
per iteration.

Paddle's optimizers leave the found-inf flag behind as a Python bool, so the verdict
mostly reaches the host for free. The counters then follow on the host (``Rule.count``)
and the device is touched only where the rule acts or measures. Where the verdict is
known on the device only (plain SGD's skip by zeroing, MindSpore's ``adjust``), the
rule's device form runs and the device alone knows the counters until the next read.
``Counters`` names which of the two is current.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, cast

import numpy as np
import paddle
from paddle import Tensor

from . import kernels, validation
from .pickling import TensorsOnHost
from .rules import Memory, Rule
from .step import Verdict
from .validation import FLOAT32_MAX


class Counters(enum.Enum):
    """Where the streak counters (``incr_count``, ``decr_count``) are current."""

    # The host's copy and the device's memory agree.
    BOTH = "both"
    # The host's copy is ahead: the device takes it before the rule next runs there.
    HOST = "host"
    # Only the device's memory is current: the host learns it at its next read.
    DEVICE = "device"


class LossScale(TensorsOnHost):
    """The scale under ``rule``, with the rule's memory as [1] tensors on ``place``.

    ``memory.scale`` is always current: it is the scaler's ``_scale``. The counters are
    current where ``counters_at`` says.
    """

    def __init__(self, rule: Rule, scale: Any, place: Any) -> None:
        """``ValueError`` or ``TypeError`` for a scale outside the rule's bounds (by the
        constructor's name, ``init_loss_scaling``) or a place Paddle cannot use.
        """
        name = "init_loss_scaling"
        scale = validation.check_scale(scale, name)
        validation.check_within(scale, name, (rule.min_scale, rule.max_scale))
        place = validation.check_place(place)

        self.rule = rule
        try:
            self.memory = _on_device(rule.memory_type(np.float32(scale)), place)
        # Paddle's own words for an unusable device (AttributeError for "gpu" without CUDA).
        except (ValueError, AttributeError) as error:
            raise ValueError(f"place {place!r} cannot be used here: {error}") from None
        self._host_counters = (0, 0)
        self.counters_at = Counters.BOTH

    @property
    def scale(self) -> Tensor:
        return self.memory.scale

    @scale.setter
    def scale(self, scale: Tensor) -> None:
        self.memory = dataclasses.replace(self.memory, scale=scale)

    def update(self, verdict: Verdict, iteration: int) -> bool | Tensor:
        """Move the memory by the rule after ``iteration`` (1-based), from its verdict (and
        amax, where measured and the rule fits to it).

        Returns whether the rule acted: a host bool where the verdict and the counters
        are on the host, else a bool [1] tensor.
        """
        found = verdict.on_host
        amax = verdict.amax if self.rule.fits_amax else None

        # With the verdict and the counters on the host, the rule counts there first.
        counted_on_host = found is not None and self.counters_at is not Counters.DEVICE
        if counted_on_host:
            incr_count, decr_count, acts = self.rule.count(*self._host_counters, cast(bool, found))
            if not acts and amax is None:
                # The common iteration: nothing moves but the counters, and only on the host.
                self._host_counters, self.counters_at = (incr_count, decr_count), Counters.HOST
                return False

        # The rule's device form, the device's counters first brought up to date.
        if self.counters_at is Counters.HOST:
            self.memory.incr_count.fill_(self._host_counters[0])
            self.memory.decr_count.fill_(self._host_counters[1])
        flag = kernels.local_value(verdict.flag)
        memory = self._local_memory()
        acted = self.rule.adjust_(memory, flag, amax, iteration, verdict.loss_finite)

        if not counted_on_host:
            # The device alone knows the counters now; the host learns them at its next read.
            self.counters_at = Counters.DEVICE
            return acted

        # The device form moved the device's counters as ``count`` moved the host's.
        self._host_counters, self.counters_at = (incr_count, decr_count), Counters.BOTH
        return acted if amax is not None else acts

    def change_rule(self, **changes: Any) -> None:
        """Change the rule's settings (fields of ``Rule``, checked by the caller) from the
        next update on; a counter the new periods no longer allow is capped below them.
        """
        periods_before = _periods(self.rule)
        self.rule = dataclasses.replace(self.rule, **changes)
        periods = _periods(self.rule)
        if periods == periods_before:
            return

        # A streak already as long as a shortened period acts at the next iteration.
        incr_count, decr_count = self.counters()
        self.set_counters(min(incr_count, periods[0] - 1), min(decr_count, periods[1] - 1))

    def set_scale(self, scale: float | Tensor, name: str) -> float | Tensor:
        """Set the scale: a number must lie within the rule's bounds (``ValueError`` naming
        ``name``); a one-element tensor is clamped into them on the device, where checking
        it would read it. Returns the number or tensor set.
        """
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
        scale = kernels.local_value(scale.detach())
        paddle.assign(
            scale.astype(paddle.float32).reshape([1]), output=kernels.local_value(self.scale)
        )
        kernels.clip_(self.scale, bounds[0], bounds[1] or FLOAT32_MAX)
        return scale

    def counters(self) -> tuple[int, int]:
        """``incr_count`` and ``decr_count`` (one read where only the device has them)."""
        if self.counters_at is Counters.DEVICE:
            self.read()
        return self._host_counters

    def set_counters(self, incr_count: int, decr_count: int) -> None:
        """Set the counters on the host; the device takes them when the rule next runs there."""
        self._host_counters, self.counters_at = (incr_count, decr_count), Counters.HOST

    def read(self, *also: Tensor) -> tuple[Memory, list[float]]:
        """The memory as host numbers, and the one-element tensors ``also``, in one read."""
        fields = [field.name for field in dataclasses.fields(self.memory)]
        numbers = kernels.read_numbers(*(getattr(self.memory, name) for name in fields), *also)
        values = self.rule.memory_type(**dict(zip(fields, numbers))).numbers(np.float32)

        if self.counters_at is Counters.DEVICE:
            self._host_counters = (values["incr_count"], values["decr_count"])
            self.counters_at = Counters.BOTH
        values["incr_count"], values["decr_count"] = self._host_counters

        return self.rule.memory_type(**values), numbers[len(fields) :]

    def load(self, rule: Rule, memory: Memory) -> None:
        """Take ``rule``, and write host numbers into the memory in place: the scale tensor
        stays the one Paddle's trainers may hold.
        """
        self.rule = rule
        if type(memory) is not type(self.memory):
            on_device = _on_device(memory, self.scale.place)
            self.memory = dataclasses.replace(on_device, scale=self.scale)

        local_memory = self._local_memory()
        for name, number in memory.numbers().items():
            getattr(local_memory, name).fill_(number)
        self._host_counters = (memory.incr_count, memory.decr_count)
        self.counters_at = Counters.BOTH

    def _local_memory(self) -> Memory:
        """The memory as this rank holds it: Paddle may have made the scale a dist tensor
        (``kernels``' facts), and the rule writes it through its local value.
        """
        if not self.memory.scale.is_dist():
            # The memory itself, at no cost: a dataclass copy takes microseconds.
            return self.memory

        return dataclasses.replace(self.memory, scale=kernels.local_value(self.memory.scale))


def _periods(rule: Rule) -> tuple[int, int]:
    """The counts at which ``rule`` acts: each counter stays below its period."""
    return rule.incr_count_limit, rule.decr_every_n_nan_or_inf


def _on_device(memory: Memory, place: Any) -> Memory:
    """``memory`` as [1] tensors on ``place``: float32 for its ``FLOATS``, int32 else."""
    tensors: dict[str, Tensor] = {}
    for name, number in memory.numbers().items():
        dtype = "float32" if name in memory.FLOATS else "int32"
        tensors[name] = paddle.to_tensor([number], dtype=dtype, place=place)

    return dataclasses.replace(memory, **tensors)
