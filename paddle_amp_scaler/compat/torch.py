"""PyTorch's ``torch.amp.GradScaler``, by its names, over this package's ``GradScaler``.

Code written for PyTorch ports by changing its import (``docs/migration.md``)::

    from paddle_amp_scaler.compat.torch import GradScaler

    scaler = GradScaler()
    ...
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)          # optional: clip true gradients here
    scaler.step(optimizer)
    scaler.update()

The update rule is PyTorch's. Unlike PyTorch's scaler, this one never lets the scale fall
below 1.0, and a step reads nothing back from the device but, once, a Paddle optimizer's
found-inf flag (plain SGD's not even that).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Mapping
from typing import Any

import paddle
from paddle import Tensor

from .. import nested
from ..core import optimizers, validation
from ..core.scaler import GradScaler as _CoreGradScaler
from ..core.state_dict import parse_state_dict

__all__ = ["GradScaler", "TorchAssertionError"]

# PyTorch's device types by Paddle's names for them.
_DEVICE_TYPES = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "xpu": "xpu"}
_DEVICE = re.compile(r"^([a-z_]+)(?::(\d+))?$")


class TorchAssertionError(AssertionError, RuntimeError):
    """Misuse that PyTorch's ``GradScaler`` asserts against (``step(optimizer)`` for an
    optimizer none of whose parameters has a gradient, ``update()`` with no step since the
    last, a pickle mid-iteration): the ``AssertionError`` PyTorch code catches, and the
    ``RuntimeError`` this package raises for misuse.
    """


class GradScaler(_CoreGradScaler):
    """``torch.amp.GradScaler`` on Paddle, with PyTorch's arguments and defaults.

    Args:
        device: None (Paddle's current device) or a device string, PyTorch's or
            Paddle's (``"cuda:1"`` and ``"gpu:1"`` are the same). As in PyTorch, a GPU
            device in a Paddle without one gives a warning and a disabled scaler.
        init_scale: the first scale.
        growth_factor: the factor of a growth (> 1).
        backoff_factor: the factor of a back-off, on every overflow (between 0 and 1).
        growth_interval: finite steps in a row before a growth.
        enabled: False makes every method a pass-through.
        **options: the core ``GradScaler``'s keyword-only options (``min_loss_scaling``,
            ``stuck_after``, ``report_overflows``, ...), ``place`` aside.
    """

    def __init__(
        self,
        device: str | None = None,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        **options: Any,
    ) -> None:
        # PyTorch's arguments, then the core's keyword-only options but place (device= sets it).
        known = validation.keyword_names(GradScaler.__init__)
        known += validation.keyword_names(_CoreGradScaler.__init__, keyword_only=True)
        known.remove("place")
        validation.check_keywords("GradScaler", options, known)
        place = None if device is None else _paddle_place(device)
        # PyTorch's names in the messages; the core checks the same values again.
        enabled = validation.check_bool(enabled, "enabled")
        validation.check_scale(init_scale, "init_scale")
        validation.check_incr_ratio(growth_factor, "growth_factor")
        validation.check_decr_ratio(backoff_factor, "backoff_factor")
        validation.check_period(growth_interval, "growth_interval")
        if enabled and place is not None and not _available(place):
            warnings.warn(
                f"GradScaler is enabled, but device {device!r} is not available to this "
                "Paddle build; the scaler is disabled (is_enabled() is False)",
                stacklevel=2,
            )
            enabled, place = False, None
        options["place"] = place
        # decr_every_n_nan_or_inf keeps its default, 1: PyTorch backs off on every overflow.
        super().__init__(
            enabled, init_scale, growth_factor, backoff_factor, growth_interval, **options
        )

    def scale(self, outputs: Any) -> Any:
        """``outputs`` times the scale: a Tensor, or lists/tuples of them (same structure)."""
        return nested.map_tensors(super().scale, outputs, nested.refuse_leaves("scale", "outputs"))

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step(*args, **kwargs)`` unless its gradients hold inf/nan; returns
        what it returned, ``None`` when skipped (Paddle's optimizers return ``None``).
        """
        optimizers.check_optimizer(optimizer, "step")
        if self.is_enable() and "closure" in kwargs:
            raise RuntimeError(
                "step() does not take a closure while the scaler is enabled: compute the "
                "loss, call scaler.scale(loss).backward(), then scaler.step(optimizer)"
            )
        result = self.step_optimizer(optimizer, functools.partial(optimizer.step, *args, **kwargs))
        # An optimizer that takes the found-inf flag is called even when it skips. PyTorch
        # returns None for a skipped step; for a step that returns something, worth a read.
        skipped = result is not None and self.is_enable() and bool(self._cache_found_inf)
        return None if skipped else result

    def _nothing_checked(self, optimizer: Any) -> None:
        # PyTorch refuses the step; the core then leaves the optimizer as if never touched.
        raise TorchAssertionError(
            "No inf checks were recorded for this optimizer: none of its parameters has a "
            "gradient. Call scaler.scale(loss).backward() before scaler.step(optimizer)"
        )

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """End the iteration: update the scale from this iteration's steps, or set it to
        ``new_scale`` (a float within the scaler's bounds, or a one-element Tensor, copied
        on the device and clamped into them).
        """
        if new_scale is not None:
            self.end_iteration(new_scale=new_scale)
        elif not self.end_iteration():
            raise TorchAssertionError(
                "No inf checks were recorded prior to update(): call "
                "scaler.step(optimizer) for each optimizer first, then update() once"
            )

    def __repr__(self) -> str:
        return "GradScaler(enabled=False)" if not self.is_enable() else super().__repr__()

    def _repr_fields(self) -> dict[str, Any]:
        # PyTorch's numbers, as its state_dict names them.
        return {key.lstrip("_"): value for key, value in self.state_dict().items()}

    def __getstate__(self) -> dict[str, Any]:
        try:
            return super().__getstate__()
        except RuntimeError as mid_iteration:  # PyTorch asserts here
            raise TorchAssertionError(str(mid_iteration)) from None

    get_scale = _CoreGradScaler.get_loss_scaling  # reads the device; 1.0 when disabled
    get_growth_factor = _CoreGradScaler.get_incr_ratio
    get_backoff_factor = _CoreGradScaler.get_decr_ratio
    get_growth_interval = _CoreGradScaler.get_incr_every_n_steps
    is_enabled = _CoreGradScaler.is_enable

    def set_growth_factor(self, new_factor: float) -> None:
        self.set_incr_ratio(validation.check_incr_ratio(new_factor, "new_factor"))

    def set_backoff_factor(self, new_factor: float) -> None:
        self.set_decr_ratio(validation.check_decr_ratio(new_factor, "new_factor"))

    def set_growth_interval(self, new_interval: int) -> None:
        self.set_incr_every_n_steps(validation.check_period(new_interval, "new_interval"))

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's five keys as Python numbers (reads the device); ``{}`` when disabled."""
        if not self.is_enable():
            return {}
        return {
            "scale": self.get_loss_scaling(),
            "growth_factor": self.get_growth_factor(),
            "backoff_factor": self.get_backoff_factor(),
            "growth_interval": self.get_growth_interval(),
            "_growth_tracker": self.get_incr_count(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load PyTorch's format or Paddle's; a Paddle dict must describe PyTorch's rule
        (back off on every overflow, dynamic), or it is refused and nothing changes.
        """
        if self.is_enable() and isinstance(state_dict, Mapping) and state_dict:
            loaded = parse_state_dict(state_dict)
            if loaded.decr_every_n_nan_or_inf != 1 or not loaded.use_dynamic_loss_scaling:
                raise ValueError(
                    "state_dict describes a scaler that backs off after "
                    f"{loaded.decr_every_n_nan_or_inf} overflows"
                    f"{'' if loaded.use_dynamic_loss_scaling else ' with a fixed scale'}; "
                    "this PyTorch-style GradScaler backs off on every overflow: load it "
                    "into paddle_amp_scaler.GradScaler instead"
                )
        super().load_state_dict(state_dict)


def _paddle_place(device: Any) -> str:
    """Paddle's device string for a PyTorch or Paddle one; ValueError if unknown."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cuda' or 'cpu', got {device!r}")
    match = _DEVICE.match(device.strip().lower())
    custom = paddle.device.get_all_custom_device_type() or []
    kinds = dict(_DEVICE_TYPES, **{kind: kind for kind in custom})
    if match is None or match.group(1) not in kinds:
        raise ValueError(
            f"device must be one of {sorted(kinds)}, optionally with ':index', got {device!r}"
        )
    kind, index = kinds[match.group(1)], match.group(2)
    return kind if kind == "cpu" or index is None else f"{kind}:{index}"


def _available(place: str) -> bool:
    kind = place.split(":")[0]
    if kind == "gpu":
        return bool(paddle.device.is_compiled_with_cuda()) and paddle.device.cuda.device_count() > 0
    # The CPU is, and so is a custom device, which _paddle_place found in Paddle's list.
    return kind != "xpu" or bool(paddle.device.is_compiled_with_xpu())
