"""Checkpoints of a whole training state that are atomic, verified, and resume exactly.

``save_checkpoint`` writes models, optimizers, the scaler's ``state_dict()``, Paddle's
RNG state, the step and the caller's ``extra`` as one payload of NumPy arrays and plain
Python values, framed by a header with its checksum; ``load_checkpoint`` checks all of
it against the live objects before it changes anything. This module holds the API and
the training state (models, optimizers by parameter position, the RNG state);
``file_format``, the file: its header, the atomic write, and the reader that builds only
what ``save_checkpoint`` writes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle

from ..core.kernels import dtype_name
from ..core.optimizers import parameters_of
from ..core.state_dict import parse_state_dict
from . import file_format
from .file_format import CheckpointError, NotLoaded

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "NotLoaded",
    "inspect_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "rng_state_survives_pickling",
    "save_checkpoint",
]

# What save_checkpoint writes under each key of the payload, besides "extra" (anything);
# models and optimizers are lists of dicts.
_PAYLOAD: dict[str, type | tuple[type, ...]] = {
    "step": int,
    "models": list,
    "optimizers": list,
    "scaler": dict,
    "rng": (dict, type(None)),
    "paddle_version": str,  # the Paddle that wrote it
}


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint's content, as read by :func:`read_checkpoint`."""

    step: int
    models: list[dict[str, Any]]
    optimizers: list[dict[str, Any]]
    scaler: dict[str, Any]
    rng: dict[str, Any] | None
    extra: Any
    paddle_version: str  # the Paddle that wrote it
    format_version: int


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: Any = None,
    optimizer: Any = None,
    scaler: Any,
    step: int,
    extra: Any = None,
) -> None:
    """Write model(s), optimizer(s), scaler, Paddle's RNG state, ``step`` and ``extra``.

    The write is atomic: readers see the old file or the new one, never a mix. Where
    this Paddle cannot save its RNG state, a ``UserWarning`` says so and the rest is
    saved.

    Args:
        path: the file to write; its folder must exist.
        model: a model (``paddle.nn.Layer``), or a list of them; required.
        optimizer: an optimizer (a ``LossScaleOptimizer`` too), or a list of them;
            required.
        scaler: the scaler, whose ``state_dict()`` is saved.
        step: an int >= 0, what :func:`load_checkpoint` returns.
        extra: any picklable value (data loader position, NumPy RNG state...);
            :func:`read_checkpoint` gives it back, objects other than plain values and
            NumPy arrays only with ``trust_extra=True``.
    """
    missing = [
        name for name, given in (("model", model), ("optimizer", optimizer)) if given is None
    ]
    if missing:
        raise TypeError(
            f"save_checkpoint() needs {' and '.join(missing)}: a checkpoint holds the whole "
            "training state (models, optimizers, scaler, step, RNG); a scaler alone is saved "
            "with paddle.save(scaler.state_dict(), path)"
        )
    path = _path(path)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    models = _objects(model, "model", "state_dict")
    optimizers = _objects(optimizer, "optimizer", "state_dict")
    # One scaler serves every model and optimizer: wrapped, a list given here is refused.
    _objects([scaler], "scaler", "state_dict")
    payload = {
        "step": step,
        "models": [_model_state(live) for live in models],
        "optimizers": [_optimizer_state(live) for live in optimizers],
        "scaler": scaler.state_dict(),
        "rng": _rng_state(),
        "extra": extra,
        "paddle_version": paddle.__version__,
    }
    file_format.write_atomically(path, file_format.framed(pickle.dumps(payload, protocol=4)))


def read_checkpoint(path: str | os.PathLike[str], *, trust_extra: bool = False) -> Checkpoint:
    """Read and verify a checkpoint without applying it; raises CheckpointError naming
    the path and the problem.

    Only what ``save_checkpoint`` writes is built: NumPy arrays and plain Python values
    (dicts, lists, numbers, strings...). Objects of other classes in ``extra`` make it
    raise, unless ``trust_extra=True``: then ``extra`` is unpickled as it stands, which
    runs whatever code its author put in it; pass it only for files you wrote yourself or
    whose source you trust. Objects anywhere else are refused even then.
    """
    if not isinstance(trust_extra, bool):
        raise TypeError(f"trust_extra must be True or False, got {trust_extra!r}")
    return _read(_path(path), file_format.TRUST if trust_extra else file_format.REFUSE)


def inspect_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint, as :func:`read_checkpoint` does, building nothing
    but plain values: each object of another class in ``extra`` stays a
    :class:`NotLoaded`, which names its class. What ``python -m paddle_amp_scaler
    inspect`` shows.
    """
    return _read(_path(path), file_format.KEEP_NOT_LOADED)


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: Any,
    optimizer: Any,
    scaler: Any,
    trust_extra: bool = False,
) -> int:
    """Restore model(s), optimizer(s), scaler and Paddle's RNG state; return the step.

    Everything is checked first (file integrity, the number of models and optimizers,
    every name and shape, the scaler state): on any problem a ``CheckpointError``
    naming the path is raised and nothing has changed. The whole file is read, ``extra``
    included.

    Args:
        path: a file written by :func:`save_checkpoint`.
        model: the model, or list of models, to restore: as many as were saved, in the
            same order.
        optimizer: the optimizer, or list of optimizers, likewise.
        scaler: the scaler to restore.
        trust_extra: a checkpoint whose ``extra`` holds objects other than plain values
            and NumPy arrays loads only with True, which runs code from the file to
            build them (as :func:`read_checkpoint`): for files you wrote yourself.

    Returns:
        The ``step`` that was saved.
    """
    path = _path(path)
    models = _objects(model, "model", "set_state_dict")
    optimizers = _objects(optimizer, "optimizer", "set_state_dict")
    _objects([scaler], "scaler", "load_state_dict")
    checkpoint = read_checkpoint(path, trust_extra=trust_extra)
    try:
        for live, saved in _paired(models, checkpoint.models, "models"):
            _check_model_state(live, saved)
        optimizer_states = [
            _rebuild_optimizer_state(live, saved)
            for live, saved in _paired(optimizers, checkpoint.optimizers, "optimizers")
        ]
        if scaler.is_enable():
            if not checkpoint.scaler:
                raise ValueError("it was saved from a disabled scaler, but this scaler is enabled")
            # Checked whole here, so that a bad one fails before anything has changed.
            parse_state_dict(checkpoint.scaler)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path!r} does not fit: {error}") from None

    for live, saved in zip(models, checkpoint.models):
        live.set_state_dict(saved)
    for live, state in zip(optimizers, optimizer_states):
        live.set_state_dict(state)
    scaler.load_state_dict(checkpoint.scaler)
    _restore_rng(checkpoint.rng, path)
    return checkpoint.step


def _read(path: str, extra_objects: str) -> Checkpoint:
    version, payload = file_format.load_payload(path, _PAYLOAD, extra_objects)
    return Checkpoint(**{key: payload[key] for key in (*_PAYLOAD, "extra")}, format_version=version)


def _path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or an os.PathLike, got {type(path).__name__}")
    return os.fspath(path)


_KINDS = {
    "model": "a paddle.nn.Layer",
    "optimizer": "an optimizer",
    "scaler": "a scaler such as GradScaler",
}


def _objects(value: Any, name: str, method: str) -> list[Any]:
    """``value``, one object or a list of them, as a list, each with ``method``."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ValueError(f"{name} must be {_KINDS[name]} or a non-empty list of them, got []")
    for item in items:
        # Said here, before an AttributeError deep inside would say it in its own words.
        if not callable(getattr(item, method, None)):
            raise TypeError(
                f"{name} must be {_KINDS[name]} (an object with .{method}()), "
                f"got {type(item).__name__}"
            )
    return items


def _paired(live: Sequence[Any], saved: Sequence[Any], what: str) -> zip[tuple[Any, Any]]:
    if len(live) != len(saved):
        raise ValueError(f"{len(live)} {what} given, the checkpoint holds {len(saved)}")
    return zip(live, saved)


# Optimizer state is stored by parameter position, not by Paddle's parameter names: the
# names come from a process-wide counter (``linear_0.w_0``), so the same model built
# again (or built after another one) gets other names, and Paddle's own
# ``set_state_dict`` would then silently start from fresh moments.


def _model_state(model: Any) -> dict[str, Any]:
    return {name: _to_numpy(value) for name, value in model.state_dict().items()}


def _check_model_state(model: Any, saved: dict[str, Any]) -> None:
    """ValueError where ``saved`` does not fit ``model``: other keys, shapes or dtypes."""
    live = model.state_dict()
    if set(live) != set(saved):
        missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
        raise ValueError(f"model keys differ (missing {missing}, unexpected {unexpected})")
    for name, value in live.items():
        _check_like(saved[name], value, f"model entry {name!r}")


def _optimizer_state(optimizer: Any) -> dict[str, Any]:
    """The optimizer's state_dict with every parameter name replaced by its position."""
    params = parameters_of(optimizer)
    position = {param.name: index for index, param in enumerate(params)}
    # Longest first, so that 'linear_1.w_0' never claims 'linear_1.w_0_x' of another.
    names = sorted(position.items(), key=lambda item: -len(item[0]))
    accumulators, master_weights, other = {}, {}, {}
    for key, value in optimizer.state_dict().items():
        if key == "master_weights":
            master_weights = {position[name]: _to_numpy(v) for name, v in value.items()}
        elif isinstance(value, paddle.Tensor):
            owner = next(
                ((index, key[len(name) :]) for name, index in names if key.startswith(name + "_")),
                None,
            )
            if owner is None:
                other[key] = _to_numpy(value)
            else:
                accumulators[owner] = _to_numpy(value)
        else:
            other[key] = value
    return {
        "parameter_count": len(params),
        "accumulators": accumulators,
        "master_weights": master_weights,
        "other": other,
    }


def _rebuild_optimizer_state(optimizer: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """What ``optimizer.set_state_dict`` takes, from ``saved`` and this optimizer's own
    parameter names; ValueError where it does not fit.
    """
    params = parameters_of(optimizer)
    if saved["parameter_count"] != len(params):
        raise ValueError(
            f"the optimizer has {len(params)} parameters, the checkpoint's "
            f"has {saved['parameter_count']}"
        )
    state: dict[str, Any] = {
        params[index].name + suffix: paddle.to_tensor(value)
        for (index, suffix), value in saved["accumulators"].items()
    }
    for index, value in saved["master_weights"].items():
        _check_like(value, params[index], f"master weight of parameter {index}", same_dtype=False)
        state.setdefault("master_weights", {})[params[index].name] = paddle.to_tensor(value)
    for key, value in saved["other"].items():
        state[key] = paddle.to_tensor(value) if isinstance(value, np.ndarray) else value
    return state


def _to_numpy(value: Any) -> Any:
    return np.array(value.numpy(), copy=True) if isinstance(value, paddle.Tensor) else value


def _check_like(saved: Any, live: Any, what: str, same_dtype: bool = True) -> None:
    if not isinstance(live, paddle.Tensor):
        return
    if list(np.shape(saved)) != list(live.shape):
        raise ValueError(
            f"{what} has shape {list(np.shape(saved))} in the checkpoint, {list(live.shape)} here"
        )
    if not same_dtype:
        return
    saved_dtype = str(np.asarray(saved).dtype)
    live_dtype = dtype_name(live.dtype)
    # NumPy has no bfloat16: Paddle hands its bits over as uint16.
    if saved_dtype != live_dtype and not (live_dtype == "bfloat16" and saved_dtype == "uint16"):
        raise ValueError(f"{what} is {saved_dtype} in the checkpoint, {live_dtype} here")


@functools.cache
def rng_state_survives_pickling() -> bool:
    """Whether Paddle's RNG state can be written to a file and read back.

    Paddle 2.6 pickles a CPU generator's seed but not its position, so a restored
    generator would start over. Checked once per process by a round trip; the
    caller's random stream is put back as it was.
    """
    untouched = paddle.get_rng_state()
    try:
        paddle.rand([1])
        position = paddle.get_rng_state()
        expected = paddle.rand([4]).numpy()
        paddle.set_rng_state(pickle.loads(pickle.dumps(position)))
        return bool(np.array_equal(paddle.rand([4]).numpy(), expected))
    finally:
        paddle.set_rng_state(untouched)


def _rng_state() -> dict[str, Any] | None:
    """Paddle's RNG state to save, or None with a UserWarning where it cannot be saved."""
    if rng_state_survives_pickling():
        return {"device": paddle.get_device(), "states": paddle.get_rng_state()}
    warnings.warn(
        f"Paddle {paddle.__version__} cannot save the position of its random generator: "
        "after a resume, random layers such as dropout draw other numbers than the "
        "uninterrupted run would have (parameters, optimizer and scaler resume exactly)",
        UserWarning,
        # Points at the caller of save_checkpoint.
        stacklevel=3,
    )
    return None


def _restore_rng(rng: dict[str, Any] | None, path: str) -> None:
    if rng is None:
        return
    here = paddle.get_device()
    if rng["device"].split(":")[0] != here.split(":")[0]:
        warnings.warn(
            f"checkpoint {path!r} holds the RNG state of {rng['device']}, not of "
            f"{here}: random ops (dropout) will not repeat the original run",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    paddle.set_rng_state(rng["states"])
