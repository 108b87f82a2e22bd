"""``inspect PATH``: what a checkpoint holds, as plain JSON values (``summarize``) and as
the lines it prints. Reading the file runs no code from it: objects in its ``extra`` are
named, never built.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..checkpoint import Checkpoint, CheckpointError, inspect_checkpoint
from ..checkpoint.file_format import not_loaded_in, unbuilt
from ..core.reports import Measured
from ..core.rules import IntervalRule
from ..core.state_dict import parse_state_dict
from .report import line


def run(path: str, as_json: bool) -> int:
    """Print the summary of ``path``; 1, with the reason on standard error, for a file
    that is no readable checkpoint or a scaler state that does not parse.
    """
    try:
        content = inspect_checkpoint(path)
    except (CheckpointError, OSError) as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
    summary = summarize(path, content)
    sys.stdout.write((json.dumps(summary) if as_json else inspect_report(summary)) + "\n")
    return 0 if summary["scaler"].get("error") is None else 1


def inspect_report(summary: Mapping[str, Any]) -> str:
    """What ``inspect`` prints: a line per fact, indented lines for the parts."""
    models, optimizers, rng = summary["models"], summary["optimizers"], summary["rng"]
    generators = f"{rng.get('generators')} generator{'' if rng.get('generators') == 1 else 's'}"
    lines = [
        line("checkpoint", summary["path"]),
        line("format", f"version {summary['format_version']}, SHA-256 checksum holds"),
        line("written with", f"Paddle {summary['paddle_version']}"),
        line("step", summary["step"]),
        *_scaler_lines(summary["scaler"]),
        line("models", len(models)),
        *(line(f"  model {index}", _model_text(model)) for index, model in enumerate(models)),
        line("optimizers", len(optimizers)),
        *(
            line(f"  optimizer {index}", _optimizer_text(opt))
            for index, opt in enumerate(optimizers)
        ),
        line(
            "RNG state",
            f"saved ({rng['device']}, {generators})"
            if rng["saved"]
            else "not saved (the Paddle that wrote it cannot save its position)",
        ),
        *_extra_lines(summary["extra"]),
    ]
    return "\n".join(lines)


def _scaler_lines(scaler: Mapping[str, Any]) -> list[str]:
    if not scaler["enabled"]:
        return [line("scaler", "disabled (saved from GradScaler(enable=False))")]
    if "error" in scaler:
        return [line("scaler", f"its state does not parse: {scaler['error']}")]
    kind = "dynamic" if scaler["use_dynamic_loss_scaling"] else "static"
    bounds = "not saved (Paddle's own defaults apply)"
    if scaler["bounds"] is not None:
        bounds = _named(dict(zip(("min_loss_scaling", "max_loss_scaling"), scaler["bounds"])))
    lines = [
        line("scaler", f"{kind} loss scaling"),
        line("  scale", scaler["scale"]),
        line("  counters", _named(scaler, "incr_count", "decr_count")),
        line("  ratios", _named(scaler, "incr_ratio", "decr_ratio")),
        line("  periods", _named(scaler, "incr_every_n_steps", "decr_every_n_nan_or_inf")),
        line("  policy", scaler["policy"]),
        line("  bounds", bounds),
    ]
    if scaler["memory"]:  # the rule's own memory, where it keeps one
        lines.append(line("  memory", _named(scaler["memory"])))
    if scaler["headroom_bits"] is not None:
        lines.append(line("  headroom", f"{scaler['headroom_bits']:.2f} bits below float16's top"))
        share = scaler["subnormal_fraction"]
        lines.append(line("  subnormal", f"{share:.3g} of the nonzero gradient elements"))
        lines.append(line("  losing", scaler["losing_gradients"]))
    if scaler["stats"] is not None:
        lines.append(line("  stats", _named(scaler["stats"])))
    return lines


def _named(values: Mapping[str, Any], *keys: str) -> str:
    """``keys`` (all of them by default) with their values: "incr_count 3, decr_count 0"."""
    shown = [(key, values[key]) for key in keys or values]
    return ", ".join(f"{key} {'none' if value is None else value}" for key, value in shown)


def _model_text(model: Mapping[str, Any], shown: int = 4) -> str:
    entries = list(model["entries"].items())
    # Its tensors' shapes and dtypes, without the type that each of them shares.
    parts = [
        f"{name} {_value_text(entry).removeprefix('ndarray ')}" for name, entry in entries[:shown]
    ]
    if len(entries) > shown:
        parts.append(f"... ({len(entries) - shown} more)")
    return f"{model['tensors']} tensors, {model['values']:,} values: " + ", ".join(parts)


def _optimizer_text(optimizer: Mapping[str, Any]) -> str:
    accumulators = ", ".join(
        f"{name} x{count}" for name, count in optimizer["accumulators"].items()
    )
    parts = [
        f"{optimizer['parameters']} parameters",
        f"accumulators: {accumulators or 'none'}",
        f"master weights: {optimizer['master_weights'] or 'none'}",
    ]
    if optimizer["other"]:
        parts.append("also " + ", ".join(optimizer["other"]))
    return "; ".join(parts)


def _extra_lines(extra: Mapping[str, Any]) -> list[str]:
    if "entries" not in extra:
        return [line("extra", "none" if extra["type"] == "NoneType" else _value_text(extra))]
    count = len(extra["entries"])
    lines = [line("extra", f"{extra['type']} of {count} {'entry' if count == 1 else 'entries'}")]
    return lines + [line(f"  {key}", _value_text(entry)) for key, entry in extra["entries"].items()]


def _value_text(entry: Mapping[str, Any]) -> str:
    kind = entry["type"]
    if kind == "object":
        return (
            f"an object built by {entry['class']}, not loaded: building it runs code from "
            "the file, which read_checkpoint(path, trust_extra=True) does"
        )
    if kind == "ndarray":
        return f"ndarray {entry['shape']} {entry['dtype']}"
    if "length" in entry:
        text = f"{kind} of {entry['length']}"
        if entry.get("not_loaded"):
            text += f", holding objects not loaded: {', '.join(entry['not_loaded'])}"
        return text
    if "value" in entry:
        return f"{kind} {entry['value']!r}"
    return f"{kind} {entry['repr']}" if "repr" in entry else str(kind)


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
    measured = saved.measured or Measured()
    summary = {
        "enabled": True,
        **dataclasses.asdict(saved),
        # A dict without a policy is the interval rule's, which scalers follow by default.
        "policy": saved.policy or IntervalRule.name,
    }
    summary["measured"] = None if saved.measured is None else measured._asdict()
    summary["headroom_bits"] = measured.headroom_bits
    summary["subnormal_fraction"] = measured.subnormal_fraction
    summary["losing_gradients"] = measured.reading(summary["policy"]).verdict
    if saved.stats is not None:
        # The counts the state dict saves; the measured numbers and the scale are beside.
        for key in ("scale", "headroom_bits", "subnormal_fraction"):
            del summary["stats"][key]
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
    objects left unbuilt in it; an object left unbuilt by its class's name.
    """
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
