"""Checkpoints of a whole training state that are atomic, verified, and resume exactly.

File layout: an 8-byte magic, then format version (uint32), payload length (uint64)
and the payload's SHA-256, then the payload: a pickle of numpy arrays and plain
Python values only. A crash while saving leaves the previous file or the new one
(write to a temporary file beside it, fsync, rename); loading checks magic, version,
length and checksum, and the shapes against the live objects, before it changes
anything.

Optimizer state is stored by parameter position, not by Paddle's parameter names: the
names come from a process-wide counter (``linear_0.w_0``), so the same model built
again (or built after another one) gets other names, and Paddle's own
``set_state_dict`` would then silently start from fresh moments.

The payload is read by an unpickler that builds only what ``save_checkpoint`` writes
(NumPy arrays, dtypes and scalars, Paddle's generator state, plain Python values): the
checksum finds corruption, not tampering, and a pickle can run any code its author put
in it. Anything else the file would build is refused by name; objects in ``extra``, the
one place a user's own objects go, are built only with ``trust_extra=True``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import io
import os
import pickle
import struct
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import paddle

from .core import optimizers as optimizer_facts
from .core.state_dict import parse_state_dict

FORMAT_VERSION = 1
_MAGIC = b"PDAMPCK\x00"
_HEADER = struct.Struct("<8sIQ32s")
_Item = TypeVar("_Item")
_Saved = TypeVar("_Saved")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: torn, corrupted, foreign, crafted, holding
    objects not trusted, or mismatched."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint's content, as read by :func:`read_checkpoint`."""

    step: int
    models: list[dict[str, Any]]
    optimizers: list[dict[str, Any]]
    scaler: dict[str, Any]
    rng: dict[str, Any] | None
    extra: Any
    format_version: int = FORMAT_VERSION
    # The Paddle that wrote it (checkpoints have always recorded it).
    paddle_version: str | None = None


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: Any,
    optimizer: Any,
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
        model: a model (``paddle.nn.Layer``), or a list of them.
        optimizer: an optimizer (a ``LossScaleOptimizer`` too), or a list of them.
        scaler: the scaler, whose ``state_dict()`` is saved.
        step: an int >= 0, what :func:`load_checkpoint` returns.
        extra: any picklable value (data loader position, NumPy RNG state...);
            :func:`read_checkpoint` gives it back, objects other than plain values and
            NumPy arrays only with ``trust_extra=True``.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    payload = {
        "step": step,
        "models": [_model_state(m) for m in _as_list(model, "model")],
        "optimizers": [_optimizer_state(o) for o in _as_list(optimizer, "optimizer")],
        "scaler": scaler.state_dict(),
        "rng": _rng_state(),
        "extra": extra,
        "paddle_version": paddle.__version__,
    }
    body = pickle.dumps(payload, protocol=4)
    header = _HEADER.pack(_MAGIC, FORMAT_VERSION, len(body), hashlib.sha256(body).digest())
    _write_atomically(os.fspath(path), header + body)


def read_checkpoint(path: str | os.PathLike[str], *, trust_extra: bool = False) -> Checkpoint:
    """Read and verify a checkpoint without applying it; raises CheckpointError naming
    the path and the problem.

    Only what ``save_checkpoint`` writes is built: NumPy arrays and plain Python values
    (dicts, lists, numbers, strings...). Objects of other classes in ``extra`` make it
    raise, unless ``trust_extra=True``: then ``extra`` is unpickled as it stands, which
    runs whatever code its author put in it; pass it only for files you wrote yourself or
    whose source you trust. Objects anywhere else are refused even then.
    """
    return _read(path, _check_trust(trust_extra))


def inspect_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint, as :func:`read_checkpoint` does, building nothing
    but plain values: each object of another class in ``extra`` stays a
    :class:`NotLoaded`, which names its class. What ``python -m paddle_amp_scaler
    inspect`` shows."""
    return _read(path, _KEEP_NOT_LOADED)


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
    path = os.fspath(path)
    checkpoint = read_checkpoint(path, trust_extra=trust_extra)
    models, opts = _as_list(model, "model"), _as_list(optimizer, "optimizer")
    try:
        for live, saved in _paired(models, checkpoint.models, "models"):
            _check_model_state(live, saved)
        optimizer_states = [
            _rebuild_optimizer_state(live, saved)
            for live, saved in _paired(opts, checkpoint.optimizers, "optimizers")
        ]
        if scaler.is_enable():
            if not checkpoint.scaler:
                raise ValueError("it was saved from a disabled scaler, but this scaler is enabled")
            parse_state_dict(checkpoint.scaler)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint {path!r} does not fit: {error}") from None

    for live, saved in zip(models, checkpoint.models):
        live.set_state_dict(saved)
    for live, state in zip(opts, optimizer_states):
        live.set_state_dict(state)
    scaler.load_state_dict(checkpoint.scaler)
    _restore_rng(checkpoint.rng, path)
    return checkpoint.step


# -- reading: the file, then a payload that builds only what save_checkpoint writes ---------

_PAYLOAD_KEYS = ("step", "models", "optimizers", "scaler", "rng", "extra")
# What _read does with objects in extra: refuse them, unpickle them, or leave them unbuilt.
_REFUSE, _TRUST, _KEEP_NOT_LOADED = "refuse", "trust", "keep"


def _check_trust(trust_extra: Any) -> str:
    if not isinstance(trust_extra, bool):
        raise TypeError(f"trust_extra must be True or False, got {trust_extra!r}")
    return _TRUST if trust_extra else _REFUSE


def _read(path: str | os.PathLike[str], extra_objects: str) -> Checkpoint:
    path = os.fspath(path)
    version, body = _verified_body(path)
    payload = _load_payload(body, path, extra_objects)
    try:
        return Checkpoint(
            step=payload["step"],
            models=payload["models"],
            optimizers=payload["optimizers"],
            scaler=payload["scaler"],
            rng=payload["rng"],
            extra=payload["extra"],
            format_version=version,
            paddle_version=payload.get("paddle_version"),
        )
    except Exception as error:  # a verified body that still does not parse
        raise CheckpointError(f"checkpoint {path!r} has an unreadable payload: {error}") from None


def _verified_body(path: str) -> tuple[int, bytes]:
    """The format version and the payload, once magic, version, length and checksum hold."""
    with open(path, "rb") as file:
        data = file.read()
    start = data[: len(_MAGIC)]
    # Said before any length is checked: a text file is no torn checkpoint.
    if not start or start != _MAGIC[: len(start)]:
        raise CheckpointError(
            f"{path!r} is not a checkpoint written by save_checkpoint: {_what_it_is(data)}"
        )
    if len(data) < _HEADER.size:
        raise CheckpointError(
            f"checkpoint {path!r} is truncated: {len(data)} bytes, "
            f"shorter than its {_HEADER.size}-byte header"
        )
    _, version, length, digest = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path!r} has format version {version}; this "
            f"version of paddle_amp_scaler reads version {FORMAT_VERSION}"
        )
    body = data[_HEADER.size :]
    if len(body) != length:
        raise CheckpointError(
            f"checkpoint {path!r} is truncated or padded: payload of "
            f"{len(body)} bytes, header says {length}"
        )
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"checkpoint {path!r} is corrupted: checksum mismatch")
    return version, body


_KNOWN_STARTS = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"PK\x03\x04", "a zip archive (torch.save writes these)"),
    (b"\x80", "a plain pickle (paddle.save and pickle.dump write these)"),
)


def _what_it_is(data: bytes) -> str:
    if not data:
        return "the file is empty"
    for start, kind in _KNOWN_STARTS:
        if data.startswith(start):
            return f"it is {kind}"
    # The cut may split a character: its bytes decode to one replacement mark at the end.
    text = data[:40].decode("utf-8", errors="replace").rstrip("\ufffd")
    if text and all(char.isprintable() or char in "\t\r\n" for char in text):
        return f"it is text, starting {text!r}"
    return f"it starts with {data[:8]!r}, where a checkpoint starts with {_MAGIC!r}"


class NotLoaded:
    """An object of a checkpoint that was not built, because building it would run code
    from the file: the class attributes ``module`` and ``name`` say what it would have
    been. Objects in ``extra`` come back as these from :func:`inspect_checkpoint`."""

    module = ""
    name = ""

    # The unpickler calls a class with the arguments the file gives, then hands it the
    # saved state and, for a list or dict subclass, the items: all taken and dropped.
    def __new__(cls, *args: Any, **kwargs: Any) -> NotLoaded:
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{self.module}.{self.name}, not loaded>"


@functools.cache
def _allowed() -> dict[tuple[str, str], Any]:
    """What a payload may build, by the (module, name) its pickle refers to."""
    # The functions NumPy's own pickles call to rebuild an array and a scalar, under the
    # module NumPy 1.x writes and the one 2.x writes: a file from either loads on both.
    rebuild_array = np.empty(0).__reduce__()[0]
    rebuild_scalar = np.float64(0).__reduce__()[0]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = rebuild_array
        allowed[(module, "scalar")] = rebuild_scalar
    # Plain values that pickle by naming a builtin type.
    for kind in (complex, set, frozenset, bytearray, slice, range):
        allowed[("builtins", kind.__name__)] = kind
    # Paddle's RNG state: a generator's seed, offset and engine numbers, rebuilt by
    # Paddle's own C++ from those values alone.
    generator_state = type(paddle.get_rng_state("cpu")[0])
    allowed[(generator_state.__module__, generator_state.__qualname__)] = generator_state
    return allowed


class _AllowListUnpickler(pickle.Unpickler):
    """Builds what ``_allowed()`` names; every other class or function the pickle refers
    to becomes a :class:`NotLoaded` subclass that records its name, so that nothing
    from the file runs and the caller can say where such objects were."""

    def __init__(self, body: bytes) -> None:
        super().__init__(io.BytesIO(body))
        self.refused: dict[tuple[str, str], type[NotLoaded]] = {}

    def find_class(self, module: str, name: str) -> Any:
        allowed = _allowed().get((module, name))
        if allowed is not None:
            return allowed
        if (module, name) not in self.refused:
            self.refused[(module, name)] = type(
                f"NotLoaded[{module}.{name}]", (NotLoaded,), {"module": module, "name": name}
            )
        return self.refused[(module, name)]


def _load_payload(body: bytes, path: str, extra_objects: str) -> dict[str, Any]:
    unpickler = _AllowListUnpickler(body)
    try:
        payload = unpickler.load()
    except Exception as error:
        refused = ", ".join(f"{module}.{name}" for module, name in unpickler.refused)
        hint = (
            f" (it refers to {refused}, which a checkpoint is not allowed to build; if they "
            "are in its extra and you trust the file, pass trust_extra=True)"
            if refused
            else ""
        )
        raise CheckpointError(
            f"checkpoint {path!r} has an unreadable payload: {error}{hint}"
        ) from None
    if not isinstance(payload, dict) or not set(_PAYLOAD_KEYS) <= set(payload):
        found = next(not_loaded_in(payload, "the payload itself"), None)
        if found is not None:
            raise _crafted(path, *found)
        raise CheckpointError(
            f"checkpoint {path!r} has an unreadable payload: not the dict save_checkpoint "
            f"writes (keys {list(_PAYLOAD_KEYS)})"
        )
    for key, value in payload.items():
        if key != "extra":
            found = next(not_loaded_in(value, key), None)
            if found is not None:
                raise _crafted(path, *found)
    in_extra = list(not_loaded_in(payload["extra"], "extra"))
    if not in_extra or extra_objects == _KEEP_NOT_LOADED:
        return payload
    if extra_objects == _REFUSE:
        where, kind = in_extra[0]
        names = list(dict.fromkeys(f"{kind.module}.{kind.name}" for _, kind in in_extra))
        others = f" (objects of {len(names) - 1} more: {', '.join(names[1:])})" if names[1:] else ""
        raise CheckpointError(
            f"checkpoint {path!r} holds objects in its extra that only code from the file "
            f"can build: {where} is built by {names[0]}{others}. If you trust this file "
            "(you wrote it), pass trust_extra=True, which unpickles extra as it stands and "
            "so runs that code"
        )
    try:
        # The rest of the payload has been seen to refer to nothing outside the allow-list:
        # the code this runs is the extra's.
        payload["extra"] = pickle.loads(body)["extra"]
    except Exception as error:
        raise CheckpointError(
            f"checkpoint {path!r}: its extra could not be unpickled: {error}"
        ) from None
    return payload


def _crafted(path: str, where: str, kind: type[NotLoaded]) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path!r} was not written by save_checkpoint: its payload tries to "
        f"build {kind.module}.{kind.name} (as {where}), which no checkpoint holds there; "
        "it was refused, and nothing from the file ran"
    )


def not_loaded_in(value: Any, where: str) -> Iterator[tuple[str, type[NotLoaded]]]:
    """(where, class) of each object left unbuilt (a :class:`NotLoaded`) in ``value``,
    outer ones first; ``where`` names it from ``where``, as ``extra['sampler']``."""
    queue: collections.deque[tuple[Any, str]] = collections.deque([(value, where)])
    seen: set[int] = set()  # a pickle may hold cycles
    while queue:
        item, at = queue.popleft()
        if isinstance(item, NotLoaded):
            yield at, type(item)
        elif isinstance(item, type) and issubclass(item, NotLoaded):
            yield at, item
        elif id(item) in seen:
            continue
        elif isinstance(item, dict):
            seen.add(id(item))
            for key, entry in item.items():
                queue.append((key, f"a key of {at}"))
                queue.append((entry, f"{at}[{key!r}]"))
        elif isinstance(item, (list, tuple)):
            seen.add(id(item))
            queue.extend((entry, f"{at}[{index}]") for index, entry in enumerate(item))
        elif isinstance(item, (set, frozenset)):
            seen.add(id(item))
            queue.extend((entry, f"an item of {at}") for entry in item)
        elif isinstance(item, np.ndarray) and item.dtype == object:
            seen.add(id(item))
            queue.extend((entry, f"{at}[{index}]") for index, entry in np.ndenumerate(item))


# -- models -----------------------------------------------------------------------------


def _model_state(model: Any) -> dict[str, Any]:
    return {name: _to_numpy(value) for name, value in model.state_dict().items()}


def _check_model_state(model: Any, saved: dict[str, Any]) -> None:
    live = model.state_dict()
    if set(live) != set(saved):
        missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
        raise ValueError(f"model keys differ (missing {missing}, unexpected {unexpected})")
    for name, value in live.items():
        _check_like(saved[name], value, f"model entry {name!r}")


# -- optimizers ---------------------------------------------------------------------------


def _optimizer_state(optimizer: Any) -> dict[str, Any]:
    """The optimizer's state_dict with every parameter name replaced by its position."""
    params = optimizer_facts.parameters_of(optimizer)
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
    params = optimizer_facts.parameters_of(optimizer)
    if saved["parameter_count"] != len(params):
        raise ValueError(
            f"the optimizer has {len(params)} parameters, the checkpoint's "
            f"has {saved['parameter_count']}"
        )
    state: dict[str, Any] = {
        params[index].name + suffix: paddle.to_tensor(value)
        for (index, suffix), value in saved["accumulators"].items()
    }
    if saved["master_weights"]:
        for index, value in saved["master_weights"].items():
            _check_like(
                value, params[index], f"master weight of parameter {index}", same_dtype=False
            )
        state["master_weights"] = {
            params[index].name: paddle.to_tensor(value)
            for index, value in saved["master_weights"].items()
        }
    for key, value in saved["other"].items():
        state[key] = paddle.to_tensor(value) if isinstance(value, np.ndarray) else value
    return state


# -- shared -------------------------------------------------------------------------------


def _as_list(value: Any, name: str) -> list[Any]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ValueError(f"{name} must be an object or a non-empty list of them")
    return items


def _paired(live: Sequence[_Item], saved: Sequence[_Saved], what: str) -> zip[tuple[_Item, _Saved]]:
    if len(live) != len(saved):
        raise ValueError(f"{len(live)} {what} given, the checkpoint holds {len(saved)}")
    return zip(live, saved)


def _to_numpy(value: Any) -> Any:
    return np.array(value.numpy(), copy=True) if isinstance(value, paddle.Tensor) else value


def _check_like(saved: Any, live: Any, what: str, same_dtype: bool = True) -> None:
    if not isinstance(live, paddle.Tensor):
        return
    saved_shape = list(np.shape(saved))
    if saved_shape != list(live.shape):
        raise ValueError(
            f"{what} has shape {saved_shape} in the checkpoint, {list(live.shape)} here"
        )
    if not same_dtype:
        return
    saved_dtype = str(np.asarray(saved).dtype)
    live_dtype = str(live.dtype).replace("paddle.", "")
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
    if rng_state_survives_pickling():
        return {"device": paddle.get_device(), "states": paddle.get_rng_state()}
    warnings.warn(
        f"Paddle {paddle.__version__} cannot save the position of its random generator: "
        "after a resume, random layers such as dropout draw other numbers than the "
        "uninterrupted run would have (parameters, optimizer and scaler resume exactly)",
        UserWarning,
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


def _write_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        # Said before the temporary file is tried, whose name would be all the error shows.
        raise FileNotFoundError(
            f"cannot save the checkpoint {path!r}: its folder {directory!r} does not exist; "
            "create it first (os.makedirs(folder, exist_ok=True))"
        )
    handle, temporary = tempfile.mkstemp(
        dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    # The rename itself must reach the disk, or a power cut could undo it.
    directory_handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_handle)
    finally:
        os.close(directory_handle)
