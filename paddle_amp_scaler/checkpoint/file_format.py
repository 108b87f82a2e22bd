"""A checkpoint file: its header and checksum, the reading that verifies them, the atomic
write, and the payload's reader, which builds only what ``save_checkpoint`` writes.

Layout: an 8-byte magic, then the format version (uint32), the payload's length
(uint64) and its SHA-256, then the payload. A crash while saving leaves the previous
file or the new one: the bytes go to a temporary file beside it, which is fsynced and
renamed over it.

The checksum finds corruption, not tampering, and a pickle can run any code its author
put in it. So the payload is read by an unpickler that builds NumPy arrays, dtypes and
scalars, Paddle's generator state and plain Python values, and nothing else: every
other class or function the file names is left unbuilt, as a :class:`NotLoaded` that
says what it would have been. Objects in ``extra``, the one place a user's own objects
go, are built only when the caller trusts the file.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import os
import pickle
import struct
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import paddle

FORMAT_VERSION = 1
MAGIC = b"PDAMPCK\x00"
HEADER = struct.Struct("<8sIQ32s")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: torn, corrupted, foreign, crafted, holding
    objects not trusted, or mismatched.
    """


def framed(body: bytes) -> bytes:
    """``body`` behind the header that lets a reader verify it."""
    return HEADER.pack(MAGIC, FORMAT_VERSION, len(body), hashlib.sha256(body).digest()) + body


def verified_body(path: str) -> tuple[int, bytes]:
    """The format version and the payload, once magic, version, length and checksum hold."""
    with open(path, "rb") as file:
        data = file.read()
    start = data[: len(MAGIC)]
    # Said before any length is checked: a text file is no torn checkpoint.
    if not start or start != MAGIC[: len(start)]:
        raise CheckpointError(
            f"{path!r} is not a checkpoint written by save_checkpoint: {_what_it_is(data)}"
        )
    if len(data) < HEADER.size:
        raise CheckpointError(
            f"checkpoint {path!r} is truncated: {len(data)} bytes, "
            f"shorter than its {HEADER.size}-byte header"
        )
    _, version, length, digest = HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path!r} has format version {version}; this "
            f"version of paddle_amp_scaler reads version {FORMAT_VERSION}"
        )
    body = data[HEADER.size :]
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
    return f"it starts with {data[:8]!r}, where a checkpoint starts with {MAGIC!r}"


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one."""
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


# What load_payload does with objects in extra: refuse them, unpickle them, or leave
# them unbuilt.
REFUSE, TRUST, KEEP_NOT_LOADED = "refuse", "trust", "keep"


class NotLoaded:
    """An object of a checkpoint that was not built, because building it would run code
    from the file: the class attributes ``module`` and ``name`` say what it would have
    been. Objects in ``extra`` come back as these from :func:`inspect_checkpoint`.
    """

    module = ""
    name = ""

    # The unpickler calls a class with the arguments the file gives, then hands it the
    # saved state and, for a list or dict subclass, the items: all taken and dropped.
    def __new__(cls, *args: Any, **kwargs: Any) -> NotLoaded:
        return super().__new__(cls)

    def _drop(self, *args: Any, **kwargs: Any) -> None:
        pass

    __init__ = __setstate__ = append = extend = __setitem__ = _drop

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
    from the file runs and the caller can say where such objects were.
    """

    def find_class(self, module: str, name: str) -> Any:
        allowed = _allowed().get((module, name))
        if allowed is not None:
            return allowed
        return type(f"NotLoaded[{module}.{name}]", (NotLoaded,), {"module": module, "name": name})


def load_payload(
    path: str, kinds: Mapping[str, type | tuple[type, ...]], extra_objects: str
) -> tuple[int, dict[str, Any]]:
    """The format version and the payload as ``save_checkpoint`` writes it: a dict with
    ``extra`` and each key of ``kinds`` holding a value of its kind (a list: of dicts).
    Only ``extra`` may hold objects outside the allow-list, which ``extra_objects``
    refuses, trusts or keeps unbuilt. ``CheckpointError`` naming ``path`` for anything
    else.
    """
    version, body = verified_body(path)
    try:
        payload = _AllowListUnpickler(io.BytesIO(body)).load()
    except Exception as error:
        raise CheckpointError(f"checkpoint {path!r} has an unreadable payload: {error}") from None
    outside_extra = payload
    if isinstance(payload, dict):
        outside_extra = {key: value for key, value in payload.items() if key != "extra"}
    # Said first: an object built where save_checkpoint writes none is what a crafted
    # file is made for.
    found = next(not_loaded_in(outside_extra, "payload"), None)
    if found is not None:
        where, built_by = found
        raise CheckpointError(
            f"checkpoint {path!r} was not written by save_checkpoint: its payload tries to "
            f"build {built_by} (as {where}), which no checkpoint holds there; it was "
            "refused, and nothing from the file ran"
        )
    not_written = f"checkpoint {path!r} was not written by save_checkpoint: its"
    if not isinstance(payload, dict) or not {*kinds, "extra"} <= payload.keys():
        raise CheckpointError(f"{not_written} payload is not a dict of {[*kinds, 'extra']}")
    for key, kind in kinds.items():
        value = payload[key]
        if not isinstance(value, kind) or (
            isinstance(value, list) and not all(isinstance(item, dict) for item in value)
        ):
            raise CheckpointError(f"{not_written} {key} is {value!r:.60}")
    in_extra = list(not_loaded_in(payload["extra"], "extra"))
    if not in_extra or extra_objects == KEEP_NOT_LOADED:
        return version, payload
    if extra_objects == REFUSE:
        where = in_extra[0][0]
        names = list(dict.fromkeys(name for _, name in in_extra))
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
    return version, payload


def not_loaded_in(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(where, what) of each object left unbuilt (a :class:`NotLoaded`) in ``value``,
    outer ones first: ``where`` names it from ``where``, as ``extra['sampler']``, and
    ``what`` is the class or function that would have built it, as ``mymodule.Sampler``.
    """
    queue: collections.deque[tuple[Any, str]] = collections.deque([(value, where)])
    seen: set[int] = set()  # a pickle may hold cycles
    while queue:
        item, at = queue.popleft()
        what = unbuilt(item)
        if what is not None:
            yield at, what
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


def unbuilt(value: Any) -> str | None:
    """What would have built ``value``, an object left unbuilt (or the class or function
    itself, where the file named one), as ``module.name``; None for anything else.
    """
    kind: type[Any] = value if isinstance(value, type) else type(value)
    return f"{kind.module}.{kind.name}" if issubclass(kind, NotLoaded) else None
