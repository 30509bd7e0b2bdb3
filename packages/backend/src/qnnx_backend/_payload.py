"""The saved-graph payload: a checksummed header of plain data and the blobs it lists (private).

Torch-free on purpose: :mod:`qnnx_backend._arrays` reads a saved file in a process without torch. The layout:

- a fixed prefix: magic ``QNNXAOT\\0``, format version (uint32), header length (uint64), SHA-256 of the header;
- a JSON header (its ``blobs`` key lists each blob's size and SHA-256);
- the blobs, back to back.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from qnnx_backend.errors import SavedGraphError

MAGIC = b"QNNXAOT\x00"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIQ32s")  # magic, format version, header length, SHA-256 of the header
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
"""A file name a saved graph may list: no folder, no leading dot."""
FIX_SAVE = "save the compiled function again with this qnnx-backend"
"""The fix every payload error names."""


def pack_payload(header: Mapping[str, Any], blobs: Sequence[bytes]) -> bytes:
    """The payload bytes of ``header`` (JSON-able) and ``blobs``; :func:`unpack_payload` reads them back."""
    table = [{"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for b in blobs]
    text = json.dumps({**header, "format": FORMAT_VERSION, "blobs": table}, sort_keys=True, allow_nan=False)
    encoded = text.encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(encoded), hashlib.sha256(encoded).digest())
    return b"".join([prefix, encoded, *blobs])


def unpack_payload(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any], list[memoryview]]:
    """The header and blobs of a payload written by :func:`pack_payload`, every checksum verified.

    Raises:
        SavedGraphError: the data is not a qnnx payload, is damaged or truncated, or has a newer format.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SavedGraphError(f"a saved qnnx graph is bytes; got {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size or bytes(view[: len(MAGIC)]) != MAGIC:
        raise SavedGraphError(
            f"the saved graph does not start with {MAGIC!r} (it starts with {bytes(view[:8])!r}, {len(view)} bytes "
            f"in all): it was not written by qnnx-backend, or is damaged; {FIX_SAVE}"
        )
    _magic, version, header_len, header_sha = _PREFIX.unpack_from(view)
    if version > FORMAT_VERSION:
        raise SavedGraphError(
            f"the saved graph has format {version}, newer than this qnnx-backend reads (format {FORMAT_VERSION} "
            "and older); upgrade qnnx-backend, or save it again with this version"
        )
    if version < 1:
        raise SavedGraphError(f"the saved graph has format {version}; accepted: 1 to {FORMAT_VERSION}; {FIX_SAVE}")
    end = _PREFIX.size + header_len
    if end > len(view):
        raise SavedGraphError(
            f"the saved graph is truncated: its header needs {end} bytes, the data has {len(view)}; {FIX_SAVE}"
        )
    raw = bytes(view[_PREFIX.size : end])
    if hashlib.sha256(raw).digest() != header_sha:
        raise SavedGraphError(f"the saved graph's header does not match its SHA-256 (damaged); {FIX_SAVE}")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SavedGraphError(f"the saved graph's header is not JSON ({exc}); {FIX_SAVE}") from exc
    if not isinstance(header, dict) or header.get("format") != version:
        raise SavedGraphError(f"the saved graph's header is not a dict saying format {version}; {FIX_SAVE}")
    table = header.get("blobs")
    if not isinstance(table, list) or not all(_blob_entry(b) for b in table):
        raise SavedGraphError(f"the saved graph's blob table is malformed; {FIX_SAVE}")
    total = sum(b["size"] for b in table)
    if end + total != len(view):
        raise SavedGraphError(
            f"the saved graph has {len(view) - end} bytes of data after its header, its table lists {total} "
            f"(truncated or padded); {FIX_SAVE}"
        )
    blobs = []
    for k, entry in enumerate(table):
        blob = view[end : end + entry["size"]]
        end += entry["size"]
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            raise SavedGraphError(f"blob {k} of the saved graph does not match its SHA-256 (damaged); {FIX_SAVE}")
        blobs.append(blob)
    return header, blobs


def _blob_entry(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("size"), int)
        and not isinstance(value.get("size"), bool)
        and value["size"] >= 0
        and isinstance(value.get("sha256"), str)
        and re.fullmatch(r"[0-9a-f]{64}", value["sha256"]) is not None
    )


def fingerprint_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Each key whose saved value differs from the current one, as ``name saved (here: current)``."""
    return [
        f"{name} {saved.get(name)!r} (here: {current.get(name)!r})"
        for name in sorted(set(saved) | set(current))
        if saved.get(name) != current.get(name)
    ]
