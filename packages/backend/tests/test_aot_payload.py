"""Properties of the saved-graph payload format: it round-trips, and damaged input is refused with a clear error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend._payload import FORMAT_VERSION, MAGIC, fingerprint_differences, pack_payload, unpack_payload
from qnnx_backend.errors import SavedGraphError
from qnnx_testkit.strategies import flipped_bytes, json_values, truncations

# JSON values whose integers fit a double (|n| <= 2**53), nested at most 12 leaves deep.
headers = st.dictionaries(
    st.text(min_size=1, max_size=10).filter(lambda k: k not in ("format", "blobs")), json_values()
)
blob_lists = st.lists(st.binary(max_size=64), max_size=5)


@given(headers, blob_lists)
def test_payload_round_trips(header: dict, blobs: list[bytes]) -> None:
    """unpack(pack(header, blobs)) gives back the header (plus format and blob table) and the same blobs."""
    got, got_blobs = unpack_payload(pack_payload(header, blobs))
    assert {k: v for k, v in got.items() if k not in ("format", "blobs")} == header
    assert got["format"] == FORMAT_VERSION
    assert [bytes(b) for b in got_blobs] == blobs


@given(headers, blob_lists, st.data())
def test_truncated_payload_is_refused(header: dict, blobs: list[bytes], data: st.DataObject) -> None:
    """Any truncation raises SavedGraphError, never another exception."""
    truncated = data.draw(truncations(pack_payload(header, blobs)))
    with pytest.raises(SavedGraphError):
        unpack_payload(truncated)


@given(headers, blob_lists, st.data())
def test_any_flipped_byte_is_refused(header: dict, blobs: list[bytes], data: st.DataObject) -> None:
    """Every byte is covered by the magic, a length or a SHA-256: flipping any one raises SavedGraphError."""
    flipped = data.draw(flipped_bytes(pack_payload(header, blobs)))
    with pytest.raises(SavedGraphError):
        unpack_payload(flipped)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_refused(junk: bytes) -> None:
    """Bytes that are not a payload raise SavedGraphError."""
    with pytest.raises(SavedGraphError):
        unpack_payload(junk)


def test_a_newer_format_names_the_versions_and_the_fix() -> None:
    """A payload of a newer format says which format it has, which this version reads, and to upgrade."""
    payload = bytearray(pack_payload({}, []))
    struct.pack_into("<I", payload, len(MAGIC), FORMAT_VERSION + 1)
    with pytest.raises(SavedGraphError, match=rf"format {FORMAT_VERSION + 1}, newer.*upgrade qnnx-backend"):
        unpack_payload(bytes(payload))


def test_not_bytes_is_refused() -> None:
    """A payload must be bytes: another type is named in the error."""
    with pytest.raises(SavedGraphError, match="got str"):
        unpack_payload("QNNXAOT")  # type: ignore[arg-type]


@given(st.dictionaries(st.sampled_from(["onnxruntime", "onnxruntime-qnn", "qairt"]), st.text(max_size=6)), st.data())
def test_fingerprint_differences_name_each_changed_key(saved: dict, data: st.DataObject) -> None:
    """A fingerprint differs from itself nowhere; each changed or missing key is named with both values."""
    assert fingerprint_differences(saved, dict(saved)) == []
    current = dict(saved)
    changed = data.draw(st.sampled_from(sorted(saved))) if saved else None
    if changed is not None:
        current[changed] = current[changed] + "x"
        (line,) = fingerprint_differences(saved, current)
        assert line.startswith(changed) and repr(current[changed]) in line
