"""Autocast: Paddle's own helpers, and ``custom_fwd``/``custom_bwd`` for custom PyLayers.

``amp_guard``, ``auto_cast`` and ``decorate`` are Paddle's functions under the names
that fluid-era code imports: signatures and behaviour are Paddle's.

``custom_fwd``/``custom_bwd`` are what PyTorch offers for ``autograd.Function`` and
Paddle lacks for ``paddle.autograd.PyLayer``. Paddle runs a PyLayer's backward under
whatever autocast mode is current when ``backward()`` is called (usually none), not
the mode its forward ran under; these decorators record the one and restore it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
import paddle
from paddle import Tensor
from paddle.amp import amp_guard, auto_cast, decorate
from paddle.base import core
from paddle.base.framework import _dygraph_tracer, convert_np_dtype_to_dtype_

from . import nested

__all__ = ["amp_guard", "auto_cast", "custom_bwd", "custom_fwd", "decorate"]

# Where custom_fwd leaves its record on the PyLayer's context for custom_bwd: the
# autocast mode (None: no dygraph tracer, under paddle.jit.to_static) and input dtypes.
_RECORD = "_paddle_amp_scaler_autocast"
# Floating inputs that cast_inputs casts; float64 ones are kept, as PyTorch keeps them.
_CASTABLE = (paddle.float16, paddle.bfloat16, paddle.float32)
_FLOATING = (*_CASTABLE, paddle.float64)

# Under paddle.jit.to_static, Paddle 3.0 re-applies a forward's decorators from its
# source and converts each decorator on the way, losing its keyword-only defaults
# ("custom_fwd() missing 2 required keyword-only arguments"). Nothing here is meant
# for conversion: dy2static calls it as it is.
paddle.jit.ignore_module([sys.modules[__name__]])


@dataclasses.dataclass(frozen=True)
class AutocastMode:
    """Everything Paddle's autocast is: the tracer's level, dtype, op lists, promotion."""

    level: Any
    dtype: str
    white_list: frozenset[str]
    black_list: frozenset[str]
    use_promote: bool

    @classmethod
    def current(cls) -> AutocastMode | None:
        """The dygraph mode; None while ``paddle.jit.to_static`` builds a program (no
        tracer then: the program's own AMP passes decide the casts).
        """
        tracer = _dygraph_tracer()
        if tracer is None:
            return None
        white, black = tracer._get_amp_op_list()
        return cls(
            tracer._amp_level,
            tracer._amp_dtype,
            frozenset(white),
            frozenset(black),
            tracer._use_promote,
        )

    def disabled(self) -> AutocastMode:
        return dataclasses.replace(self, level=core.AmpLevel.O0, dtype="float32")

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Run under this mode; the mode that was current comes back on exit."""
        # Called only where a tracer runs: custom_fwd records no mode without one.
        previous = cast(AutocastMode, AutocastMode.current())
        self._install()
        try:
            yield
        finally:
            previous._install()

    def _install(self) -> None:
        # The fields auto_cast itself sets and restores, set directly: auto_cast would
        # refuse to enable on a CPU place and re-derive the lists from its arguments.
        tracer = _dygraph_tracer()
        tracer._amp_level = self.level
        tracer._amp_dtype = self.dtype
        tracer._set_amp_op_list(set(self.white_list), set(self.black_list))
        tracer._use_promote = self.use_promote


def custom_fwd(
    forward: Callable[..., Any] | None = None,
    *,
    cast_inputs: Any = None,
    device_type: str | None = None,
) -> Any:
    """Decorate a PyLayer's ``forward`` (below ``@staticmethod``), bare or called.

    Forward runs under the autocast mode of its call, which is recorded for
    ``custom_bwd``. With ``cast_inputs=dtype`` (any floating dtype, or its name), inside
    an enabled ``auto_cast``, its floating-point Tensor arguments (float64 excepted, as in
    PyTorch; also inside lists, tuples and dicts) are cast to ``dtype`` and forward and
    backward run with autocast off; outside ``auto_cast`` nothing is cast. ``device_type``
    is accepted for code written for ``torch.amp``: Paddle has one autocast mode for every
    device.
    """
    cast_dtype = None if cast_inputs is None else _floating_dtype(cast_inputs)
    _check_device_type(device_type)
    if forward is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs, device_type=device_type)
    if not callable(forward):
        raise TypeError(f"custom_fwd decorates a forward function, got {forward!r}")

    @functools.wraps(forward)
    def forward_under_recorded_autocast(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        mode = AutocastMode.current()
        if mode is None:
            setattr(ctx, _RECORD, (None, []))
            return forward(ctx, *args, **kwargs)
        # Paddle 2.6 hands backward's results to the inputs as they are (PyTorch casts
        # them): remember the inputs' dtypes, so custom_bwd can give each gradient its own.
        slots = _gradient_slots([*args, *kwargs.values()])
        if cast_dtype is not None and mode.level != core.AmpLevel.O0:
            # Inside an enabled auto_cast: forward and backward run on the cast inputs,
            # with autocast off.
            mode = mode.disabled()
            args, kwargs = nested.map_tensors(
                lambda tensor: tensor.astype(cast_dtype) if tensor.dtype in _CASTABLE else tensor,
                (args, kwargs),
            )
        setattr(ctx, _RECORD, (mode, slots))
        with mode.entered():
            return forward(ctx, *args, **kwargs)

    return forward_under_recorded_autocast


def custom_bwd(
    backward: Callable[..., Any] | None = None, *, device_type: str | None = None
) -> Any:
    """Decorate a PyLayer's ``backward`` (below ``@staticmethod``), bare or called, whose
    forward has ``@custom_fwd``: backward runs under the autocast mode forward recorded,
    and each gradient it returns gets its input's dtype. ``device_type`` as for
    ``custom_fwd``.
    """
    _check_device_type(device_type)
    if backward is None:
        return functools.partial(custom_bwd, device_type=device_type)
    if not callable(backward):
        raise TypeError(f"custom_bwd decorates a backward function, got {backward!r}")

    @functools.wraps(backward)
    def backward_under_recorded_autocast(ctx: Any, *grads: Any) -> Any:
        record = getattr(ctx, _RECORD, None)
        if record is None:
            raise RuntimeError(
                f"custom_bwd on {backward.__qualname__}: its forward was not decorated with "
                "custom_fwd, which records the autocast mode for backward; add @custom_fwd "
                "to the forward of the same PyLayer"
            )
        mode, dtypes = record
        if mode is None:
            return backward(ctx, *grads)
        with mode.entered():
            result = backward(ctx, *grads)
        if isinstance(result, tuple):
            return tuple(_as_dtypes(grad, slot) for grad, slot in zip(result, dtypes))
        return _as_dtypes(result, dtypes[0])

    return backward_under_recorded_autocast


def _check_device_type(device_type: Any) -> None:
    if device_type is not None and not isinstance(device_type, str):
        raise TypeError(f"device_type must be a string such as 'gpu', got {device_type!r}")


def _floating_dtype(value: Any) -> Any:
    """``cast_inputs`` as a Paddle dtype: any floating one (float64 too, as in PyTorch),
    given as a Paddle dtype, a NumPy one or a name Paddle understands; else ValueError.
    """
    if isinstance(value, (str, np.dtype, type)):
        # NumPy has no bfloat16; Paddle's own name for it is the one string to add.
        if value == "bfloat16":
            return paddle.bfloat16
        with contextlib.suppress(TypeError, ValueError):
            numpy_dtype: np.dtype[Any] = np.dtype(value)
            if numpy_dtype.kind == "f":
                return convert_np_dtype_to_dtype_(numpy_dtype)
    elif not isinstance(value, (bool, int)) and value is not None:
        for dtype in _FLOATING:
            if value == dtype:
                return dtype
    raise ValueError(
        "cast_inputs must be a floating-point dtype (paddle.float16, paddle.bfloat16, "
        f"paddle.float32 or paddle.float64, or its name), got {value!r}"
    )


def _gradient_slots(arguments: list[Any]) -> list[Any]:
    """The dtype of each argument that gets a gradient slot in PyLayer's backward: a
    Tensor's dtype, or for a list/tuple holding Tensors the list of their dtypes.
    """
    slots: list[Any] = []
    for argument in arguments:
        if isinstance(argument, Tensor):
            slots.append(argument.dtype)
        elif isinstance(argument, (list, tuple)) and nested.tensors_in(argument):
            slots.append([item.dtype if isinstance(item, Tensor) else None for item in argument])
    return slots


def _as_dtypes(grad: Any, slot: Any) -> Any:
    if isinstance(slot, list) and isinstance(grad, (list, tuple)):
        return type(grad)(_as_dtypes(item, dtype) for item, dtype in zip(grad, slot))
    if isinstance(grad, Tensor) and slot is not None and grad.dtype != slot:
        return grad.astype(slot)
    return grad
