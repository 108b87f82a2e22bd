"""What a checkpoint holds, as plain JSON values: what ``python -m paddle_amp_scaler
inspect`` prints, kept beside the code that writes the payload so that the two change
together."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.interval import IntervalRule
from ..core.state_dict import parse_state_dict, rule_named
from . import Checkpoint
from .unpickling import not_loaded_in, unbuilt


def summarize(path: str, content: Checkpoint) -> dict[str, Any]:
    """``content``, read from ``path`` by :func:`inspect_checkpoint`, as plain values."""
    rng: dict[str, Any] = {"saved": content.rng is not None}
    if content.rng is not None:
        rng["device"] = str(content.rng.get("device"))
        rng["generators"] = len(content.rng.get("states", ()))
    extra = _value(content.extra)
    if isinstance(content.extra, dict):
        extra["entries"] = {str(key): _value(entry) for key, entry in content.extra.items()}
    return {
        "path": path,
        "format_version": content.format_version,
        # inspect_checkpoint reads no file whose checksum fails.
        "checksum": "holds",
        "paddle_version": content.paddle_version,
        "step": content.step,
        "scaler": _scaler(content.scaler),
        "models": [_model(model) for model in content.models],
        "optimizers": [_optimizer(optimizer) for optimizer in content.optimizers],
        "rng": rng,
        "extra": extra,
    }


def _scaler(state: Mapping[str, Any]) -> dict[str, Any]:
    if not state:
        return {"enabled": False}
    try:
        saved = parse_state_dict(state)
    except (TypeError, ValueError) as error:
        return {"enabled": True, "error": str(error)}
    # A dict without a policy is the interval rule's, which every scaler follows by
    # default.
    rule = saved.rule_over(rule_named(saved.policy or IntervalRule.name)())
    summary = {
        "enabled": True,
        **dataclasses.asdict(saved),
        "policy": rule.name,
        "headroom_bits": rule.headroom_bits(saved.memory_at(rule, saved.scale)),
    }
    if saved.stats is not None:
        # The counts the state dict saves: it keeps no headroom_bits, and the scale is
        # the one beside them.
        for measured in ("scale", "headroom_bits", "subnormal_fraction"):
            del summary["stats"][measured]
    return summary


def _model(state: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "tensors": len(state),
        "values": sum(value.size for value in state.values() if isinstance(value, np.ndarray)),
        "entries": {name: _value(value) for name, value in state.items()},
    }


def _optimizer(state: Mapping[str, Any]) -> dict[str, Any]:
    accumulators: dict[str, int] = {}
    for _, suffix in state.get("accumulators", {}):
        # Paddle names an accumulator after its parameter: "linear_0.w_0" + "_moment1_0".
        name = suffix.lstrip("_")
        accumulators[name] = accumulators.get(name, 0) + 1
    return {
        "parameters": state.get("parameter_count"),
        "accumulators": accumulators,
        "master_weights": len(state.get("master_weights", {})),
        "other": sorted(str(key) for key in state.get("other", {})),
    }


def _value(value: Any) -> dict[str, Any]:
    """A value's type; the value itself if short (its repr, where JSON has no such
    value); an array's shape and dtype; a container's length and the classes of the
    objects left unbuilt in it; an object left unbuilt by its class's name."""
    built_by = unbuilt(value)
    if built_by is not None:
        return {"type": "object", "class": built_by, "loaded": False}
    if isinstance(value, np.ndarray):
        return {"type": "ndarray", "shape": list(value.shape), "dtype": str(value.dtype)}
    summary: dict[str, Any] = {"type": type(value).__name__}
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        summary["length"] = len(value)
        inside = sorted({built_by for _, built_by in not_loaded_in(value, "")})
        if inside:
            summary["not_loaded"] = inside
        return summary
    plain = value.item() if isinstance(value, np.generic) else value
    if len(repr(plain)) <= 60:
        if isinstance(plain, (bool, int, float, str, type(None))):
            summary["value"] = plain
        else:  # bytes, complex, range...: JSON has no such value
            summary["repr"] = repr(plain)
    return summary
