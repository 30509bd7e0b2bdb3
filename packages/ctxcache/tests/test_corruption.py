"""Corruption: truncated, missing, bit-flipped files and broken manifests are misses, never crashes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from ctxcache_helpers import key_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qnnx_ctxcache as cc
from qnnx_ctxcache.testing import FakeBuild, forget_verified
from qnnx_testkit.strategies import flipped_bytes, json_scalars, json_values

PAYLOAD = bytes(range(256)) * 16  # 4 KiB context binary


def _stored(store: cc.ContextStore, name: str = "m") -> Path:
    return store.get_or_create(key_for(name), FakeBuild(payload=PAYLOAD)).path


def _overwrite_keep_mtime(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place and restore the mtime: only a hash can notice."""
    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _quarantine_reasons(store: cc.ContextStore) -> list[str]:
    return sorted(json.loads(p.read_text())["reason"] for p in (store.root / "v1" / "quarantine").glob("*.json"))


@pytest.mark.parametrize("new_size", [0, len(PAYLOAD) // 2])
def test_truncated_binary_is_a_miss_then_rebuilt(store: cc.ContextStore, new_size: int) -> None:
    """A truncated .bin fails the cheap size check: quarantined, rebuilt, and the next lookup is a hit."""
    entry_dir = _stored(store)
    os.truncate(entry_dir / "model_ctx_qnn.bin", new_size)
    build = FakeBuild(payload=PAYLOAD)
    rebuilt = store.get_or_create(key_for(), build)
    assert (rebuilt.hit, build.calls) == (False, 1)
    assert (rebuilt.path / "model_ctx_qnn.bin").read_bytes() == PAYLOAD
    assert _quarantine_reasons(store) == ["corrupt:size"]
    assert store.get(key_for()) is not None
    counters = store.stats().counters
    assert counters["bad:corrupt:size"] == 1
    assert counters["miss:corrupt"] == 1


def test_missing_binary_is_a_miss(store: cc.ContextStore) -> None:
    """A deleted .bin that the manifest lists is a miss with reason corrupt:missing."""
    entry_dir = _stored(store)
    (entry_dir / "model_ctx_qnn.bin").unlink()
    assert store.get(key_for()) is None
    assert _quarantine_reasons(store) == ["corrupt:missing"]


def test_overwritten_bytes_with_new_mtime_are_caught_by_the_cheap_check(store: cc.ContextStore) -> None:
    """Bytes overwritten in place change the mtime, so even a hit already verified in this process rehashes."""
    entry_dir = _stored(store)
    assert store.get(key_for()) is not None  # verified and memoised
    with (entry_dir / "model_ctx_qnn.bin").open("r+b") as fh:
        fh.seek(2048)
        fh.write(b"\xff" * 8)
    os.utime(entry_dir / "model_ctx_qnn.bin", ns=(1, 1))  # any different mtime
    assert store.get(key_for()) is None
    assert _quarantine_reasons(store) == ["corrupt:checksum"]


def test_rewrite_with_restored_mtime_is_caught_in_the_writing_process(store: cc.ContextStore) -> None:
    """A same-size rewrite that restores the mtime still changes the ctime, so the writer's next hit rehashes."""
    entry_dir = _stored(store)
    assert store.get(key_for()) is not None  # memoised as verified by this process
    _overwrite_keep_mtime(entry_dir / "model_ctx_qnn.bin", 2048, b"\x00" * 8)
    assert store.get(key_for()) is None
    assert _quarantine_reasons(store) == ["corrupt:checksum"]


def test_stat_only_check_without_memo_needs_full_verify(tmp_path: Path) -> None:
    """With verify_on_first_use off and no memo, only a full verify sees a same-size, same-mtime rewrite."""
    writer = cc.ContextStore(tmp_path)
    entry_dir = writer.get_or_create(key_for(), FakeBuild(payload=PAYLOAD)).path
    forget_verified()
    reader = cc.ContextStore(tmp_path, options=cc.StoreOptions(verify_on_first_use=False))
    _overwrite_keep_mtime(entry_dir / "model_ctx_qnn.bin", 2048, b"\x00" * 8)
    assert reader.get(key_for()) is not None  # the documented cost of turning verification off
    assert reader.get(key_for(), full_verify=True) is None


def test_first_use_in_a_new_process_is_fully_verified(store: cc.ContextStore) -> None:
    """An entry this process did not write or verify is hashed on first use, catching a sneaky flip."""
    entry_dir = _stored(store)
    _overwrite_keep_mtime(entry_dir / "model_ctx_qnn.bin", 100, b"\x42")
    forget_verified()  # as if this were another process
    build = FakeBuild(payload=PAYLOAD)
    entry = store.get_or_create(key_for(), build)
    assert (entry.hit, build.calls) == (False, 1)
    assert (entry.path / "model_ctx_qnn.bin").read_bytes() == PAYLOAD


def test_verify_full_reports_and_fix_quarantines(store: cc.ContextStore) -> None:
    """verify(full=True) lists every bad entry; fix=True moves them to quarantine."""
    bad = [_stored(store, name) for name in ("a", "b")]
    _stored(store, "good")
    for entry_dir in bad:
        _overwrite_keep_mtime(entry_dir / "model_ctx_qnn.bin", 7, b"\x99")
    assert store.verify().ok  # cheap check cannot see it
    report = store.verify(full=True)
    assert {p.key for p in report.problems} == {key_for("a").hex, key_for("b").hex}
    fixed = store.verify(full=True, fix=True)
    assert set(fixed.quarantined) == {key_for("a").hex, key_for("b").hex}
    assert store.verify(full=True).ok
    assert store.stats().entries == 1


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_flip_is_detected_by_full_check(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """For any file of an entry, any offset and any non-zero XOR mask, the full check flags the entry."""
    root = tmp_path_factory.mktemp("flip")
    store = cc.ContextStore(root)
    entry_dir = _stored(store)
    name = data.draw(st.sampled_from(["model_ctx.onnx", "model_ctx_qnn.bin"]))
    target = entry_dir / name
    _overwrite_keep_mtime(target, 0, data.draw(flipped_bytes(target.read_bytes())))
    report = store.verify(full=True)
    assert [p.reason for p in report.problems] == ["corrupt:checksum"]
    assert store.get(key_for(), full_verify=True) is None


@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=st.sampled_from(["delete", "append"]), name=st.sampled_from(["model_ctx.onnx", "model_ctx_qnn.bin"]))
def test_deleting_or_growing_any_file_is_caught_by_cheap_check(
    tmp_path_factory: pytest.TempPathFactory, action: str, name: str
) -> None:
    """Deleting any file or appending one byte to it is caught without hashing."""
    store = cc.ContextStore(tmp_path_factory.mktemp("cheap"))
    target = _stored(store) / name
    if action == "delete":
        target.unlink()
    else:
        with target.open("ab") as fh:
            fh.write(b"\0")
    report = store.verify(full=False)
    assert [p.reason for p in report.problems] == ["corrupt:missing" if action == "delete" else "corrupt:size"]


def _edit_manifest(entry_dir: Path, edit: object) -> None:
    path = entry_dir / "manifest.json"
    if isinstance(edit, bytes):
        path.write_bytes(edit)
        return
    data = json.loads(path.read_text())
    edit(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (b"", "manifest:invalid-json"),
        (b"{not json", "manifest:invalid-json"),
        (b"[1, 2]", "manifest:not-an-object"),
        (lambda m: m.pop("files"), "manifest:files"),
        (lambda m: m.update(schema_version=99), "manifest:schema"),
        (lambda m: m.update(format="other"), "manifest:format"),
        (lambda m: m.update(key="0" * 64), "manifest:key"),
        (lambda m: m["key_material"].update(salt="x"), "manifest:key-material"),
        (lambda m: m.update(hash_algorithm="md5"), "manifest:hash-algorithm"),
        (lambda m: m["files"][0].update(path="../../x"), "untrusted:path"),
        (lambda m: m["files"][0].update(path="/etc/passwd"), "untrusted:path"),
        (lambda m: m["files"][0].update(size="12"), "manifest:files"),
        (lambda m: m.update(model_file="other.onnx"), "manifest:model-file"),
        (lambda m: m["files"].pop(1), "corrupt:missing"),
    ],
)
def test_broken_manifests_are_misses_with_precise_reasons(store: cc.ContextStore, edit: object, reason: str) -> None:
    """Each kind of manifest damage gives a miss with its own reason and never raises."""
    entry_dir = _stored(store)
    _edit_manifest(entry_dir, edit)
    forget_verified()
    assert store.get(key_for()) is None
    assert _quarantine_reasons(store) == [reason]


def test_verify_without_key_checks_material_hashes_to_entry_name(store: cc.ContextStore) -> None:
    """verify() (which has no caller key) flags a manifest whose key material does not hash to the entry name."""
    entry_dir = _stored(store)
    _edit_manifest(entry_dir, lambda m: m["key_material"].update(salt="tampered"))
    report = store.verify()
    assert [p.reason for p in report.problems] == ["manifest:key-material"]


def test_unknown_manifest_fields_are_tolerated(store: cc.ContextStore) -> None:
    """Extra fields written by a newer version do not make an entry invalid."""
    entry_dir = _stored(store)
    _edit_manifest(entry_dir, lambda m: m.update(future_field={"x": 1}))
    forget_verified()
    assert store.get(key_for()) is not None


def test_symlinked_file_inside_entry_is_untrusted(store: cc.ContextStore, tmp_path: Path) -> None:
    """A listed file replaced by a symlink (even to identical bytes) is rejected."""
    entry_dir = _stored(store)
    outside = tmp_path / "outside.bin"
    shutil.copy(entry_dir / "model_ctx_qnn.bin", outside)
    (entry_dir / "model_ctx_qnn.bin").unlink()
    (entry_dir / "model_ctx_qnn.bin").symlink_to(outside)
    assert store.get(key_for()) is None
    assert _quarantine_reasons(store) == ["untrusted:path"]
    assert outside.is_file()


def test_entry_path_that_is_a_file_or_symlink_is_replaced(store: cc.ContextStore, tmp_path: Path) -> None:
    """A regular file or a symlink squatting on an entry path is quarantined and a real entry published."""
    for name, make in (("f", lambda p: p.write_text("junk")), ("s", lambda p: p.symlink_to(tmp_path))):
        path = store.entry_dir(key_for(name))
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
        entry = store.get_or_create(key_for(name), FakeBuild())
        assert entry.persisted
        assert path.is_dir()
        assert not path.is_symlink()
    assert tmp_path.is_dir()


def test_junk_in_entries_is_ignored_and_reported(store: cc.ContextStore) -> None:
    """Stray files, .nfs files and odd dirs under entries/ do not disturb lookups; verify lists them."""
    _stored(store)
    entries = store.root / "v1" / "entries"
    (entries / "zz").mkdir()
    (entries / ".nfs0123").write_text("x")
    shard = entries / key_for().hex[:2]
    (shard / "foo.swp").write_text("x")
    (shard / "empty").mkdir()
    assert store.get(key_for()) is not None
    report = store.verify(full=True)
    assert report.ok
    assert set(report.junk) >= {".nfs0123", "zz", f"{shard.name}/foo.swp", f"{shard.name}/empty"}
    store.prune(0, min_age_seconds=0)
    assert (entries / ".nfs0123").exists()
    assert (shard / "foo.swp").exists()


def test_entry_from_other_versions_is_never_reached(store: cc.ContextStore) -> None:
    """An entry written for other runtime versions lives under another key and is not served."""
    store.get_or_create(key_for(versions={"onnxruntime": "1.31.0"}), FakeBuild())
    assert store.get(key_for()) is None


_json_values = json_values(json_scalars(max_int=None, max_text=10, floats=True), max_key=10, max_leaves=10)
_MANIFEST_FIELDS = [
    "format",
    "schema_version",
    "key",
    "key_material",
    "hash_algorithm",
    "files",
    "model_file",
    "ep_contexts",
]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_MANIFEST_FIELDS), value=_json_values)
def test_any_manifest_field_value_never_crashes_a_lookup(
    tmp_path_factory: pytest.TempPathFactory, field: str, value: object
) -> None:
    """Replacing any manifest field by any JSON value gives a hit or a miss, never an exception."""
    store = cc.ContextStore(tmp_path_factory.mktemp("fuzz"))
    entry_dir = _stored(store)
    _edit_manifest(entry_dir, lambda m: m.update({field: value}))
    forget_verified()
    entry = store.get(key_for(), full_verify=True)
    if entry is not None:  # only a value equal to the original can keep the entry valid
        assert (entry.path / "model_ctx_qnn.bin").read_bytes() == PAYLOAD
    assert store.verify(full=True).checked in (0, 1)
