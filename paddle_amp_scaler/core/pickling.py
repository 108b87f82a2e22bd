"""Pickling on every Paddle: a scaler's device tensors travel as NumPy arrays with their device's
name, so that a pickled or deep-copied scaler continues its run exactly (Paddle 2.6's tensors do
not pickle, and Paddle 3's keep whatever place they had).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle
from paddle import Tensor


@dataclasses.dataclass(frozen=True)
class _OnHost:
    values: np.ndarray
    device: str


class TensorsOnHost:
    """Pickles (and deep-copies) the tensors in an object's attributes, also in lists, tuples, dicts
    and dataclasses, as host arrays: reading them is a device sync, which pickling may cost.
    """

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = _each(
            self.__dict__, Tensor, lambda tensor: _OnHost(tensor.numpy(), _device_of(tensor.place))
        )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(
            _each(
                state,
                _OnHost,
                lambda on_host: paddle.to_tensor(on_host.values, place=on_host.device),
            )
        )


def _each(value: Any, kind: type, convert: Callable[[Any], Any]) -> Any:
    """``value`` with every ``kind`` in it converted, also in dicts, lists, tuples, dataclasses."""
    if isinstance(value, kind):
        return convert(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
        return dataclasses.replace(value, **_each(fields, kind, convert))
    if type(value) is dict:
        return {key: _each(item, kind, convert) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_each(item, kind, convert) for item in value)
    return value


def _device_of(place: Any) -> str:
    if place.is_gpu_place():
        return f"gpu:{place.gpu_device_id()}"
    if place.is_xpu_place():
        return f"xpu:{place.xpu_device_id()}"
    if place.is_custom_place():
        return f"{place.custom_device_type()}:{place.custom_device_id()}"
    return "cpu"
