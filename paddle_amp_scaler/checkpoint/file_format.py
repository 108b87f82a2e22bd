"""A checkpoint file: its header and checksum, the reading that verifies them, and the
atomic write.

Layout: an 8-byte magic, then the format version (uint32), the payload's length
(uint64) and its SHA-256, then the payload. A crash while saving leaves the previous
file or the new one: the bytes go to a temporary file beside it, which is fsynced and
renamed over it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile

FORMAT_VERSION = 1
MAGIC = b"PDAMPCK\x00"
HEADER = struct.Struct("<8sIQ32s")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: torn, corrupted, foreign, crafted, holding
    objects not trusted, or mismatched."""


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
