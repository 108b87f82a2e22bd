"""Paddle's getters and setters of a scaler, ``stats()``, ``state_dict()`` and its repr.

``Accessors`` reads and writes the scale, its counters, its policy and the statistics,
each read a device sync: outside a step, where the scaler itself never reads.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import kernels, rule, validation
from .scale_tensors import ScaleTensors, read_number
from .state_dict import HEADROOM_KEYS, SavedScaler, parse_state_dict
from .statistics import RunStatistics, ScalerStats

if TYPE_CHECKING:
    from .distributed import FoundInfSync
    from .overflow_report import OverflowRecorder
    from .stuck import StuckPolicy


class Accessors:
    """Paddle's getters and setters, ``stats``, ``state_dict`` and the repr of a scaler,
    over the tensors and settings its constructor made."""

    _enable: bool
    _use_dynamic_loss_scaling: bool
    _init_loss_scaling: float
    _policy: rule.Policy
    _tensors: ScaleTensors
    _run: RunStatistics
    _stuck_policy: StuckPolicy
    _overflows: OverflowRecorder | None
    _sync: FoundInfSync
    _option_defaults: dict[str, Any]

    def stats(self) -> ScalerStats:
        """The run so far: iterations, skipped ones, the current skip streak, the last
        skipped iteration, growths, back-offs and the scale (one read of the device)."""
        if not self._enable:
            return ScalerStats.nothing_yet()
        measures = self._policy.name == "headroom" and self._use_dynamic_loss_scaling
        return self._run.read(self._tensors.scale, self._tensors.amax if measures else None)

    def last_step_skipped(self) -> bool:
        """Whether the most recent iteration skipped its step (reads the device); False
        before the first. For an LR scheduler that must not advance on skipped steps."""
        return self.stats().skip_streak > 0

    # -- Paddle's getters and setters ------------------------------------------------

    def is_enable(self) -> bool:
        return self._enable

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self._use_dynamic_loss_scaling

    def get_loss_scaling(self) -> float:
        """The current scale (reads the device); 1.0 when disabled."""
        return read_number(self._tensors.scale) if self._enable else 1.0

    def get_init_loss_scaling(self) -> float:
        return self._init_loss_scaling if self._enable else 1.0

    def set_init_loss_scaling(self, new_init_loss_scaling: float) -> None:
        """Set the initial scale, and the current scale with it (within the bounds)."""
        value = self._within_bounds(new_init_loss_scaling, "new_init_loss_scaling")
        self._init_loss_scaling = value
        self._tensors.scale.fill_(value)

    def get_incr_ratio(self) -> float:
        return self._policy.incr_ratio

    def set_incr_ratio(self, new_incr_ratio: float) -> None:
        self._set_policy(incr_ratio=validation.check_incr_ratio(new_incr_ratio, "new_incr_ratio"))

    def get_decr_ratio(self) -> float:
        return self._policy.decr_ratio

    def set_decr_ratio(self, new_decr_ratio: float) -> None:
        self._set_policy(decr_ratio=validation.check_decr_ratio(new_decr_ratio, "new_decr_ratio"))

    def get_incr_every_n_steps(self) -> int:
        return self._policy.incr_every_n_steps

    def set_incr_every_n_steps(self, new_incr_every_n_steps: int) -> None:
        """Set the growth period; a streak already that long grows at the next finite step."""
        name = "new_incr_every_n_steps"
        period = validation.check_period(new_incr_every_n_steps, name, integral_float=True)
        self._set_policy(incr_every_n_steps=period)
        kernels.clamp_below_(self._tensors.incr_count, period)

    def get_decr_every_n_nan_or_inf(self) -> int:
        return self._policy.decr_every_n_nan_or_inf

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf: int) -> None:
        """Set the back-off period; a streak already that long backs off at the next inf/nan."""
        name = "new_decr_every_n_nan_or_inf"
        period = validation.check_period(new_decr_every_n_nan_or_inf, name, integral_float=True)
        self._set_policy(decr_every_n_nan_or_inf=period)
        kernels.clamp_below_(self._tensors.decr_count, period)

    def get_incr_count(self) -> int:
        """Finite steps since the last increase or inf/nan step (reads the device)."""
        return int(read_number(self._tensors.incr_count))

    def set_incr_count(self, new_incr_count: int) -> None:
        period = self._policy.incr_every_n_steps
        count = validation.check_count(
            new_incr_count, "new_incr_count", period, "incr_every_n_steps"
        )
        self._tensors.incr_count.fill_(count)

    def get_decr_count(self) -> int:
        """Inf/nan steps since the last decrease or finite step (reads the device)."""
        return int(read_number(self._tensors.decr_count))

    def set_decr_count(self, new_decr_count: int) -> None:
        period = self._policy.decr_every_n_nan_or_inf
        count = validation.check_count(
            new_decr_count, "new_decr_count", period, "decr_every_n_nan_or_inf"
        )
        self._tensors.decr_count.fill_(count)

    def _set_policy(self, **changes: Any) -> None:
        """Change the rule's settings (``rule.Policy`` fields, checked by the caller): the
        next update applies them. Part of the extension interface."""
        self._policy = dataclasses.replace(self._policy, **changes)

    def _within_bounds(self, scale: Any, name: str) -> float:
        bounds = (self._policy.min_scale, self._policy.max_scale)
        return validation.check_within(validation.check_scale(scale, name), name, bounds)

    # -- state_dict -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state in Paddle's format (reads the device); ``{}`` when disabled."""
        if not self._enable:
            return {}
        stats = self.stats()
        state = self._tensors.read(self._policy, stats.iterations)
        return SavedScaler(
            bounds=(self._policy.min_scale, self._policy.max_scale),
            scale=stats.scale,
            incr_ratio=self._policy.incr_ratio,
            decr_ratio=self._policy.decr_ratio,
            incr_every_n_steps=self._policy.incr_every_n_steps,
            decr_every_n_nan_or_inf=self._policy.decr_every_n_nan_or_inf,
            incr_count=state.incr_count,
            decr_count=state.decr_count,
            use_dynamic_loss_scaling=self._use_dynamic_loss_scaling,
            stats=stats,
            policy=self._policy.name,
            headroom={key: getattr(state, key) for key in HEADROOM_KEYS},
        ).to_paddle_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state dict of this package, of Paddle's scalers or of PyTorch's GradScaler.

        A bad dict raises ``ValueError`` naming the key and leaves the scaler unchanged.
        Like Paddle's, loading also makes the loaded scale the initial scale.
        """
        if not self._enable:
            return
        if isinstance(state_dict, Mapping) and len(state_dict) == 0:
            raise RuntimeError(
                "load_state_dict() got an empty dict, which is what a disabled scaler "
                "saves; load it into a scaler built with enable=False, or pass the "
                "state_dict of an enabled one"
            )
        loaded = parse_state_dict(state_dict)
        lower, upper = loaded.bounds or (self._policy.min_scale, self._policy.max_scale)
        self._set_policy(
            incr_ratio=loaded.incr_ratio,
            decr_ratio=loaded.decr_ratio,
            incr_every_n_steps=loaded.incr_every_n_steps,
            decr_every_n_nan_or_inf=loaded.decr_every_n_nan_or_inf,
            min_scale=lower,
            max_scale=upper,
            name=loaded.policy or self._policy.name,
        )
        self._init_loss_scaling = _clamped(loaded.scale, lower, upper)
        self._tensors.load(
            rule.LossScaleState(
                self._init_loss_scaling,
                loaded.incr_count,
                loaded.decr_count,
                self._policy,
                **(loaded.headroom or {}),
            )
        )
        self._use_dynamic_loss_scaling = loaded.use_dynamic_loss_scaling
        if loaded.stats is not None:
            self._run.load(loaded.stats)

    # -- repr ------------------------------------------------------------------------

    def __repr__(self) -> str:
        """The scale, counters, ratios and periods (reads the device), then each option
        that differs from its default."""
        if not self._enable:
            return f"{type(self).__name__}(enable=False)"
        options = {
            "use_dynamic_loss_scaling": self._use_dynamic_loss_scaling,
            "policy": self._policy.name,
            "min_loss_scaling": self._policy.min_scale,
            "max_loss_scaling": self._policy.max_scale,
            "stuck_after": self._stuck_policy.stuck_after,
            "on_stuck": self._stuck_policy.on_stuck,
            "report_overflows": self._overflows is not None,
            "group": self._sync.group,
            "sync_found_inf": self._sync.enabled,
        }
        fields = self._repr_fields()
        fields.update(
            {key: value for key, value in options.items() if value != self._option_defaults[key]}
        )
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"

    def _repr_fields(self) -> dict[str, Any]:
        """The numbers a repr shows first, by name: a face overrides it to show its own
        framework's names. Part of the extension interface."""
        return {
            "scale": self.get_loss_scaling(),
            "incr_count": self.get_incr_count(),
            "decr_count": self.get_decr_count(),
            "incr_ratio": self._policy.incr_ratio,
            "decr_ratio": self._policy.decr_ratio,
            "incr_every_n_steps": self._policy.incr_every_n_steps,
            "decr_every_n_nan_or_inf": self._policy.decr_every_n_nan_or_inf,
        }


def _clamped(scale: float, lower: float, upper: float | None) -> float:
    """A loaded scale, clamped into the bounds, with a warning if that changed it."""
    clamped = max(scale, lower) if upper is None else min(max(scale, lower), upper)
    if clamped != scale:
        warnings.warn(
            f"the loaded scale {scale!r} lies outside min_loss_scaling={lower!r} and "
            f"max_loss_scaling={upper!r}; it is clamped to {clamped!r}",
            UserWarning,
            stacklevel=3,
        )
    return clamped
