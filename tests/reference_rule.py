"""The tests' reference for the update rule: ``paddle_amp_scaler.core.rule.adjust`` itself,
the rule's specification (test_rule.py holds it to worked examples and to the
pseudo-code), with a count of how often it fired, for the statistics."""

from __future__ import annotations

from paddle_amp_scaler.core import rule


class ReferenceScaler:
    """A scaler's scale and counters as ``rule.adjust`` moves them, in float32."""

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
        policy = rule.Policy(
            incr_ratio,
            decr_ratio,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
            min_scale,
            max_scale,
        )
        self.state = rule.LossScaleState(scale, policy=policy)
        self.dynamic = dynamic
        # How often the rule fired: a growth refused at float32's limit, or a back-off held
        # at the floor, still counts.
        self.growths = 0
        self.backoffs = 0

    def update(self, found_inf: bool) -> None:
        if not self.dynamic:
            return
        self.state = rule.adjust(self.state, found_inf)
        if self.state.fired:
            if found_inf:
                self.backoffs += 1
            else:
                self.growths += 1

    @property
    def scale(self) -> float:
        return self.state.scale

    @property
    def incr_count(self) -> int:
        return self.state.incr_count

    @property
    def decr_count(self) -> int:
        return self.state.decr_count

    def snapshot(self):
        return self.scale, self.incr_count, self.decr_count
