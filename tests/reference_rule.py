"""An independent, pure-Python model of the dynamic loss-scaling rule (API.md).

Arithmetic is float32, as on the device: ``scale * ratio`` is a float32 product.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class ReferenceScaler:
    scale: float
    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 1000
    decr_every_n_nan_or_inf: int = 1
    incr_count: int = 0
    decr_count: int = 0
    dynamic: bool = True
    # How often the rule fired: a growth refused at float32's limit, or a back-off held
    # at the floor of 1.0, still counts.
    growths: int = 0
    backoffs: int = 0
    # min_loss_scaling and max_loss_scaling (None: float32's largest value).
    min_scale: float = 1.0
    max_scale: float | None = None

    def __post_init__(self):
        self.scale = np.float32(self.scale)

    def update(self, found_inf: bool) -> None:
        if not self.dynamic:
            return
        if found_inf:
            self.incr_count = 0
            self.decr_count += 1
            if self.decr_count == self.decr_every_n_nan_or_inf:
                self.scale = max(
                    self.scale * np.float32(self.decr_ratio), np.float32(self.min_scale)
                )
                self.decr_count = 0
                self.backoffs += 1
        else:
            self.decr_count = 0
            self.incr_count += 1
            if self.incr_count == self.incr_every_n_steps:
                with np.errstate(over="ignore"):
                    grown = self.scale * np.float32(self.incr_ratio)
                if np.isfinite(grown):
                    self.scale = grown
                if self.max_scale is not None:
                    self.scale = min(self.scale, np.float32(self.max_scale))
                self.incr_count = 0
                self.growths += 1

    def snapshot(self):
        return float(self.scale), self.incr_count, self.decr_count
