"""The tests' reference for the update rule: ``IntervalRule.adjust`` itself, the rule's
specification (test_rule.py holds it to worked examples and to the pseudo-code), with a
count of how often it acted, for the statistics."""

from __future__ import annotations

import numpy as np

from paddle_amp_scaler.core.interval import IntervalRule, Memory


class ReferenceScaler:
    """A scaler's scale and counters as ``IntervalRule.adjust`` moves them, in float32."""

    def __init__(
        self,
        scale: float,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 1000,
        decr_every_n_nan_or_inf: int = 1,
        dynamic: bool = True,
        min_scale: float = 1.0,
        max_scale: float | None = None,
    ):
        self.rule = IntervalRule(
            incr_ratio,
            decr_ratio,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
            min_scale,
            max_scale,
        )
        self.memory = Memory(np.float32(scale))
        self.dynamic = dynamic
        # How often the rule acted: a growth refused at float32's limit, or a back-off held
        # at the floor, still counts.
        self.growths = 0
        self.backoffs = 0

    def update(self, found_inf: bool) -> None:
        if not self.dynamic:
            return
        self.memory, acted = self.rule.adjust(self.memory, found_inf)
        if acted:
            if found_inf:
                self.backoffs += 1
            else:
                self.growths += 1

    @property
    def scale(self) -> float:
        return float(self.memory.scale)

    @property
    def incr_count(self) -> int:
        return self.memory.incr_count

    @property
    def decr_count(self) -> int:
        return self.memory.decr_count

    def snapshot(self):
        return self.scale, self.incr_count, self.decr_count
