"""pack / unpack: ship compiled contexts to a fleet.

Round trips load on the other side; a damaged, truncated, tampered or unsafe archive is refused with
ArchiveError and leaves the destination cache exactly as it was.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from ctxcache_helpers import key_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qnnx_ctxcache as cc
import qnnx_ctxcache._key as key_module
from qnnx_ctxcache import _archive
from qnnx_ctxcache.__main__ import main
from qnnx_ctxcache.errors import (
    ArchiveError,
    EntryNotFoundError,
    InvalidOptionsError,
    QnnxCtxcacheError,
    StoreNotWritableError,
)
from qnnx_ctxcache.testing import FakeBuild, forget_verified
from qnnx_testkit.strategies import flipped_bytes, truncations

OPTIONS = cc.StoreOptions(min_age_seconds=0, durable=False)
Members = list[tuple[tarfile.TarInfo, bytes]]
_FIXTURE_CHECK = [HealthCheck.function_scoped_fixture]


def _store(root: Path) -> cc.ContextStore:
    return cc.ContextStore(root, options=OPTIONS)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fill(store: cc.ContextStore, payloads: dict[str, bytes]) -> dict[str, cc.CacheKey]:
    keys = {name: key_for(name) for name in payloads}
    for name, payload in payloads.items():
        store.get_or_create(keys[name], FakeBuild(payload=payload))
    return keys


def _listing(root: Path) -> list[tuple[str, str]]:
    """Every path under ``root`` with its content hash and mtime: equal listings mean an untouched cache."""
    out: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        out += [((base / name).relative_to(root).as_posix(), "dir") for name in dirnames]
        for name in filenames:
            path = base / name
            out.append((path.relative_to(root).as_posix(), f"{_sha(path.read_bytes())}@{path.stat().st_mtime_ns}"))
    return sorted(out)


def _entry_files(store: cc.ContextStore, key_hex: str) -> dict[str, bytes]:
    """The bytes of every file an entry's manifest lists, plus the manifest itself."""
    entry_dir = store.entry_dir(key_hex)
    manifest = json.loads((entry_dir / "manifest.json").read_bytes())
    files = {f["path"]: (entry_dir / f["path"]).read_bytes() for f in manifest["files"]}
    return {**files, "manifest.json": (entry_dir / "manifest.json").read_bytes()}


@attrs.frozen
class Shipped:
    """A build host's cache with three entries, packed as a plain and a gzip-compressed archive."""

    source: cc.ContextStore
    keys: dict[str, cc.CacheKey]
    tar: Path
    tgz: Path


@pytest.fixture
def shipped(tmp_path: Path) -> Shipped:
    source = _store(tmp_path / "build-host")
    keys = _fill(source, {name: name.encode() * 300 for name in "abc"})
    source.pack(tmp_path / "contexts.tar")
    source.pack(tmp_path / "contexts.tar.gz")
    return Shipped(source, keys, tmp_path / "contexts.tar", tmp_path / "contexts.tar.gz")


@pytest.fixture
def dest(tmp_path: Path) -> cc.ContextStore:
    """A device cache that already holds an unrelated entry."""
    store = _store(tmp_path / "device")
    store.get_or_create(key_for("already-here"), FakeBuild())
    return store


def _refused(dest: cc.ContextStore, archive: Path, *fragments: str) -> ArchiveError:
    """unpack must raise ArchiveError naming the problem and a fix, and change nothing in ``dest``."""
    before = _listing(dest.root)
    with pytest.raises(ArchiveError) as caught:
        dest.unpack(archive)
    assert _listing(dest.root) == before
    message = str(caught.value)
    assert "nothing was added" in message
    assert "Fix:" in message
    for fragment in fragments:
        assert fragment in message
    return caught.value


# ------------------------------------------------------------------------------------------ rewriting archives
def _members(archive: Path) -> Members:
    with tarfile.open(archive) as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]  # type: ignore[union-attr]


def _write(path: Path, members: Members) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info = copy.copy(info)
            if info.isreg():
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _regular(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _manifest_member(manifest: dict[str, Any], *, checksum: bool = True) -> tuple[tarfile.TarInfo, bytes]:
    if checksum:
        manifest["checksum"] = _archive.manifest_checksum(manifest)
    return _regular(_archive.ARCHIVE_MANIFEST_NAME, _archive.encode_manifest(manifest))


def _reseal(members: Members) -> Members:
    """Make the archive manifest agree with the members again, as a careful tamperer would."""
    data = {info.name: payload for info, payload in members}
    manifest = json.loads(members[0][1])
    for record in manifest["entries"]:
        base = f"entries/{record['key']}/"
        entry_manifest = data[base + "manifest.json"]
        record["manifest"] = {"size": len(entry_manifest), "sha256": _sha(entry_manifest)}
        record["key_material"] = _archive.key_summary(json.loads(entry_manifest)["key_material"])
        for f in record["files"]:
            f["size"], f["sha256"] = len(data[base + f["path"]]), _sha(data[base + f["path"]])
    return [_manifest_member(manifest), *members[1:]]


def _replace(members: Members, name: str, data: bytes) -> Members:
    return [(info, data if info.name == name else payload) for info, payload in members]


# ------------------------------------------------------------------------------------------ round trips
def test_round_trip_every_entry_loads(shipped: Shipped, tmp_path: Path) -> None:
    """Unpacked into an empty cache, every packed entry is a verified hit with byte-identical files."""
    other = _store(tmp_path / "fresh")
    report = other.unpack(shipped.tgz)
    assert set(report.added) == {k.hex for k in shipped.keys.values()}
    assert (report.already_present, report.skipped, report.other_host) == ((), (), ())
    assert report.packed_by == cc.__version__
    forget_verified()  # as a fresh process on the device would
    for name, key in shipped.keys.items():
        entry = other.get(key, full_verify=True)
        assert entry is not None
        assert entry.hit
        assert entry.metadata == {"outputs": ["y"]}
        assert (entry.path / "model_ctx_qnn.bin").read_bytes() == name.encode() * 300
        assert _entry_files(other, key.hex) == _entry_files(shipped.source, key.hex)
        manifest = json.loads((entry.path / "manifest.json").read_bytes())
        for f in manifest["files"]:  # mtimes as on the build host, so cheap checks need not rehash
            assert (entry.path / f["path"]).stat().st_mtime_ns == f["mtime_ns"]
    assert other.verify(full=True).ok
    assert list((other.root / "v1" / "staging").iterdir()) == []


def test_archive_layout_and_manifest(shipped: Shipped) -> None:
    """The archive manifest comes first and lists key, key material summary, sizes and SHA-256s."""
    members = _members(shipped.tar)
    assert members[0][0].name == "qnnx-ctxcache-archive.json"
    assert all(info.isreg() for info, _ in members)
    manifest = json.loads(members[0][1])
    assert (manifest["format"], manifest["format_version"]) == ("qnnx-ctxcache-archive", 1)
    assert manifest["ctxcache_version"] == cc.__version__ == "0.2.0"
    record = next(r for r in manifest["entries"] if r["key"] == shipped.keys["a"].hex)
    assert record["key_material"]["target"] == {"soc_model": 60}
    assert record["key_material"]["versions"]["onnxruntime-qnn"] == "2.7.0"
    data = {info.name: payload for info, payload in members}
    for f in record["files"]:
        payload = data[f"entries/{record['key']}/{f['path']}"]
        assert (f["size"], f["sha256"]) == (len(payload), _sha(payload))
    assert shipped.tgz.read_bytes()[:2] == b"\x1f\x8b"
    assert shipped.tar.read_bytes()[:2] != b"\x1f\x8b"


@settings(max_examples=15, deadline=None, suppress_health_check=_FIXTURE_CHECK)
@given(
    payloads=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=4), st.binary(min_size=1, max_size=2048), max_size=4
    ),
    gz=st.booleans(),
)
def test_round_trip_property(tmp_path_factory: pytest.TempPathFactory, payloads: dict[str, bytes], gz: bool) -> None:
    """Any set of entries packed from one cache unpacks into an empty one where every entry loads."""
    base = tmp_path_factory.mktemp("round-trip")
    source = _store(base / "source")
    keys = _fill(source, payloads)
    archive = base / ("ctx.tar.gz" if gz else "ctx.tar")
    packed = source.pack(archive)
    assert set(packed.entries) == {k.hex for k in keys.values()}
    assert packed.sha256 == _sha(archive.read_bytes())
    other = _store(base / "other")
    report = other.unpack(archive)
    assert sorted(report.added) == sorted(packed.entries)
    for name, key in keys.items():
        entry = other.get(key)
        assert entry is not None
        assert (entry.path / "model_ctx_qnn.bin").read_bytes() == payloads[name]
        assert _entry_files(other, key.hex) == _entry_files(source, key.hex)


def test_unpack_twice_is_already_present(shipped: Shipped, dest: cc.ContextStore) -> None:
    """A second unpack adds nothing: every entry is reported as already present."""
    first = dest.unpack(shipped.tar)
    second = dest.unpack(shipped.tar)
    assert len(first.added) == 3
    assert (second.added, second.skipped) == ((), ())
    assert set(second.already_present) == set(first.added)


def test_an_existing_entry_is_kept(shipped: Shipped, dest: cc.ContextStore) -> None:
    """An entry the device compiled itself is kept (first writer wins), the others are added."""
    mine = dest.get_or_create(shipped.keys["a"], FakeBuild(payload=b"compiled-on-the-device"))
    report = dest.unpack(shipped.tar)
    assert report.already_present == (shipped.keys["a"].hex,)
    assert set(report.added) == {shipped.keys["b"].hex, shipped.keys["c"].hex}
    assert (mine.path / "model_ctx_qnn.bin").read_bytes() == b"compiled-on-the-device"


@pytest.mark.parametrize(
    "theirs",
    [{"target": {"soc_model": 69}}, {"versions": {"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.8.0"}}],
    ids=["other-soc", "other-onnxruntime-qnn"],
)
def test_entries_for_another_soc_or_runtime_are_installed_but_never_looked_up(
    tmp_path: Path, theirs: dict[str, Any]
) -> None:
    """An entry keyed for another target or runtime is present, but this machine's key never finds it."""
    source = _store(tmp_path / "build-host")
    their_key = key_for("m", **theirs)
    source.get_or_create(their_key, FakeBuild())
    source.pack(tmp_path / "ctx.tar")
    device = _store(tmp_path / "device")
    report = device.unpack(tmp_path / "ctx.tar")
    assert report.added == (their_key.hex,)
    assert [info.key for info in device.entries()] == [their_key.hex]
    assert device.get(key_for("m")) is None  # this machine's key: SoC 60, onnxruntime-qnn 2.7.0
    assert device.get(their_key) is not None  # still there for a machine that does match


def test_entries_compiled_on_another_host_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keys include the compiling host's OS/CPU: unpack names entries this machine's keys can never match."""
    with monkeypatch.context() as patch:
        patch.setattr(key_module, "host_material", lambda: {"os": "win32", "machine": "arm64"})
        foreign = key_for("m")
    assert foreign.hex != key_for("m").hex
    source = _store(tmp_path / "build-host")
    source.get_or_create(foreign, FakeBuild())
    source.pack(tmp_path / "ctx.tar")
    report = _store(tmp_path / "device").unpack(tmp_path / "ctx.tar")
    assert (report.added, report.other_host) == ((foreign.hex,), (foreign.hex,))
    assert main(["--root", str(tmp_path / "device2"), "unpack", str(tmp_path / "ctx.tar")]) == 0
    assert "another OS or CPU" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ choosing entries
def test_pack_by_prefix_and_key(shipped: Shipped, tmp_path: Path) -> None:
    """Keys may be CacheKeys, full keys or unique prefixes; repeats are packed once, in the order given."""
    a, b = shipped.keys["a"], shipped.keys["b"]
    report = shipped.source.pack(tmp_path / "two.tar", [b.hex[:6].upper(), a, a.hex])
    assert report.entries == (b.hex, a.hex)
    other = _store(tmp_path / "other")
    assert set(other.unpack(tmp_path / "two.tar").added) == {a.hex, b.hex}
    assert other.get(shipped.keys["c"]) is None
    assert shipped.source.pack(tmp_path / "one.tar", a.hex[:8]).entries == (a.hex,)
    assert shipped.source.pack(tmp_path / "none.tar", []).entries == ()


def _colliding_names() -> tuple[str, str]:
    """Two key names whose keys share their first 4 hex digits."""
    seen: dict[str, str] = {}
    for i in range(200_000):
        name = f"n{i}"
        prefix = key_for(name).hex[:4]
        if prefix in seen:
            return seen[prefix], name
        seen[prefix] = name
    raise AssertionError("no collision found")  # pragma: no cover


def test_pack_unknown_or_ambiguous_key_is_a_clear_error(shipped: Shipped, tmp_path: Path) -> None:
    """A prefix matching no entry, several entries, or no key at all raises EntryNotFoundError; nothing is written."""
    unknown = next(p for p in ("ffffffff", "00000000") if not any(k.hex.startswith(p) for k in shipped.keys.values()))
    with pytest.raises(EntryNotFoundError) as caught:
        shipped.source.pack(tmp_path / "x.tar", [shipped.keys["a"].hex, unknown])
    assert caught.value.matches == 0
    assert f"{unknown!r}" in str(caught.value)
    assert "qnnx-ctxcache ls" in str(caught.value)
    assert "Fix:" in str(caught.value)
    assert isinstance(caught.value, LookupError)
    assert isinstance(caught.value, QnnxCtxcacheError)
    with pytest.raises(EntryNotFoundError, match="is not a cache key") as caught:
        shipped.source.pack(tmp_path / "x.tar", ["zz"])
    assert caught.value.matches is None
    first, second = _colliding_names()
    store = _store(tmp_path / "collide")
    store.get_or_create(key_for(first), FakeBuild())
    store.get_or_create(key_for(second), FakeBuild())
    with pytest.raises(EntryNotFoundError, match="2 entries") as caught:
        store.pack(tmp_path / "x.tar", [key_for(first).hex[:4]])
    assert caught.value.matches == 2
    assert not (tmp_path / "x.tar").exists()


def test_pack_leaves_out_a_corrupt_entry_and_changes_nothing(shipped: Shipped, tmp_path: Path) -> None:
    """A source entry with a flipped byte fails the full check: reported, never packed; the cache is untouched."""
    target = shipped.source.entry_dir(shipped.keys["a"]) / "model_ctx_qnn.bin"
    st_before = target.stat()
    data = bytearray(target.read_bytes())
    data[7] ^= 0x40
    target.write_bytes(bytes(data))
    os.utime(target, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    forget_verified()
    before = _listing(shipped.source.root)
    report = shipped.source.pack(tmp_path / "ctx.tar")
    assert _listing(shipped.source.root) == before  # no quarantine, no last-use touch, no leftover pin
    assert [(p.key, p.reason) for p in report.skipped] == [(shipped.keys["a"].hex, "corrupt:checksum")]
    assert set(report.entries) == {shipped.keys["b"].hex, shipped.keys["c"].hex}


def test_pack_pins_entries_against_a_concurrent_prune(
    shipped: Shipped, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune running while pack reads the entries keeps every one of them (they are pinned)."""
    reports: list[cc.PruneReport] = []
    real_addfile = tarfile.TarFile.addfile

    def addfile_with_prune(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> None:
        if not reports:  # another process prunes to zero while we are writing the archive
            reports.append(_store(shipped.source.root).prune(0, min_age_seconds=0))
        real_addfile(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "addfile", addfile_with_prune)
    packed = shipped.source.pack(tmp_path / "ctx.tar")
    monkeypatch.undo()
    assert reports[0].removed == ()
    assert set(reports[0].kept_pinned) == set(packed.entries) == {k.hex for k in shipped.keys.values()}
    assert len(_store(tmp_path / "other").unpack(tmp_path / "ctx.tar").added) == 3
    assert len(_store(shipped.source.root).prune(0, min_age_seconds=0).removed) == 3  # pins released


def test_a_failed_pack_leaves_no_archive(shipped: Shipped, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack that fails half-way (disk full) leaves the previous archive and no temp file."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "ctx.tar.gz").write_bytes(b"previous archive")
    real_addfile = tarfile.TarFile.addfile
    calls: list[int] = []

    def failing_addfile(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_addfile(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "addfile", failing_addfile)
    with pytest.raises(OSError, match="No space left"):
        shipped.source.pack(out / "ctx.tar.gz")
    assert [p.name for p in out.iterdir()] == ["ctx.tar.gz"]
    assert (out / "ctx.tar.gz").read_bytes() == b"previous archive"


def test_compression_option(shipped: Shipped, tmp_path: Path) -> None:
    """gzip follows the name unless forced; an unknown value is rejected with the accepted ones."""
    assert shipped.source.pack(tmp_path / "a.tgz").compression == "gz"
    assert shipped.source.pack(tmp_path / "b.bin", compression="gz").compression == "gz"
    assert (tmp_path / "b.bin").read_bytes()[:2] == b"\x1f\x8b"
    assert shipped.source.pack(tmp_path / "c.tar.gz", compression="none").compression == "none"
    assert len(_store(tmp_path / "other").unpack(tmp_path / "c.tar.gz").added) == 3
    with pytest.raises(InvalidOptionsError, match=r"\('auto', 'gz', 'none'\), got 'zip'"):
        shipped.source.pack(tmp_path / "d.zip", compression="zip")


def test_unpack_needs_a_writable_store(shipped: Shipped, tmp_path: Path) -> None:
    """A read-only store refuses to unpack with StoreNotWritableError (a PermissionError) naming the fix."""
    _store(tmp_path / "ro")
    readonly = cc.ContextStore(tmp_path / "ro", options=cc.StoreOptions(mode="readonly"))
    with pytest.raises(StoreNotWritableError, match="readonly") as caught:
        readonly.unpack(shipped.tar)
    assert isinstance(caught.value, PermissionError)
    assert "Fix:" in str(caught.value)


# ------------------------------------------------------------------------------------------ refusals
def test_error_classes() -> None:
    """ArchiveError is a QnnxCtxcacheError and a ValueError."""
    assert issubclass(ArchiveError, QnnxCtxcacheError)
    assert issubclass(ArchiveError, ValueError)


def _spans(archive: Path) -> list[tuple[str, int, int]]:
    """(name, offset of the data, size) of every member of a plain tar."""
    with tarfile.open(archive) as tar:
        return [(m.name, m.offset_data, m.size) for m in tar.getmembers()]


@settings(max_examples=30, deadline=None, suppress_health_check=_FIXTURE_CHECK)
@given(data=st.data())
def test_a_flipped_byte_in_any_member_is_refused(shipped: Shipped, dest: cc.ContextStore, data: st.DataObject) -> None:
    """One changed byte anywhere in any member (the archive manifest included) is refused."""
    raw = shipped.tar.read_bytes()
    _name, offset, size = data.draw(st.sampled_from(_spans(shipped.tar)), label="member")
    bad = shipped.tar.with_name("flipped.tar")
    bad.write_bytes(data.draw(flipped_bytes(raw, start=offset, stop=offset + size), label="flipped"))
    _refused(dest, bad)


@settings(max_examples=30, deadline=None, suppress_health_check=_FIXTURE_CHECK)
@given(data=st.data())
def test_any_damage_is_refused_or_harmless(
    shipped: Shipped, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """A flipped byte or a cut anywhere in the file: refused, or it hit only bytes that carry nothing
    (tar padding, the gzip header's time) and every entry arrives byte-identical. Never a wrong entry."""
    archive = data.draw(st.sampled_from([shipped.tar, shipped.tgz]), label="archive")
    raw = archive.read_bytes()
    base = tmp_path_factory.mktemp("damage")
    bad = base / archive.name
    bad.write_bytes(data.draw(truncations(raw) | flipped_bytes(raw), label="damaged"))
    device = _store(base / "device")
    before = _listing(device.root)
    try:
        report = device.unpack(bad)
    except ArchiveError:
        assert _listing(device.root) == before
        return
    assert set(report.added) == {k.hex for k in shipped.keys.values()}
    for key in shipped.keys.values():
        assert _entry_files(device, key.hex) == _entry_files(shipped.source, key.hex)


@pytest.mark.parametrize(
    ("kind", "cut"),
    [(kind, cut) for kind in ("tar", "tgz") for cut in ("empty", "gzip-header-only", "half")]
    + [("tar", "member-boundary"), ("tar", "inside-last-member")],  # member offsets: plain tar only
)
def test_truncated_archive_is_refused(shipped: Shipped, dest: cc.ContextStore, kind: str, cut: str) -> None:
    """An archive cut short anywhere inside its members is refused."""
    archive = shipped.tar if kind == "tar" else shipped.tgz
    raw = archive.read_bytes()
    spans = _spans(shipped.tar)
    length = {
        "empty": 0,
        "gzip-header-only": 10,
        "half": len(raw) // 2,
        "member-boundary": spans[-1][1] - 512,  # the last member's header is gone, the rest is whole
        "inside-last-member": spans[-1][1] + spans[-1][2] // 2,
    }[cut]
    bad = archive.with_name(f"cut.{kind}")
    bad.write_bytes(raw[:length])
    error = _refused(dest, bad)
    if cut in ("member-boundary", "inside-last-member"):
        assert "truncated" in error.problem


def _edit_manifest(edit: Callable[[dict[str, Any]], None], *, checksum: bool = True) -> Callable[[Members], Members]:
    def mutate(members: Members) -> Members:
        manifest = json.loads(members[0][1])
        edit(manifest)
        return [_manifest_member(manifest, checksum=checksum), *members[1:]]

    return mutate


def _first_file(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(manifest: dict[str, Any]) -> None:
        manifest["entries"][0]["files"][-1][field] = value

    return edit


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest.__setitem__(field, value)


def _changed_binary(members: Members) -> Members:
    """New context bytes of the same size, archive manifest resealed, entry manifest left as it was."""
    name, size = next((info.name, info.size) for info, _ in members if info.name.endswith("_qnn.bin"))
    return _reseal(_replace(members, name, b"\xee" * size))


def _unlisted_entry(manifest: dict[str, Any]) -> None:
    del manifest["entries"][0]


def _not_json(members: Members) -> Members:
    return [_regular(_archive.ARCHIVE_MANIFEST_NAME, b"{not json"), *members[1:]]


def _deeply_nested(members: Members) -> Members:
    return [_regular(_archive.ARCHIVE_MANIFEST_NAME, b"[" * 100_000 + b"]" * 100_000), *members[1:]]


def _manifest_not_first(members: Members) -> Members:
    return [*members[1:], members[0]]


def _respelled(members: Members) -> Members:
    """The same values with other whitespace: the checksum still matches, the bytes do not."""
    return [_regular(_archive.ARCHIVE_MANIFEST_NAME, json.dumps(json.loads(members[0][1]), indent=2).encode())]


def _extra_file(members: Members) -> Members:
    """A file the entry manifest does not list, added to the archive record and the members."""
    key = _key_of(members)
    manifest = json.loads(members[0][1])
    manifest["entries"][0]["files"].append({"path": "extra.bin", "size": 1, "sha256": _sha(b"x")})
    return _reseal([_manifest_member(manifest), *members[1:], _regular(f"entries/{key}/extra.bin", b"x")])


def _summary_lies(manifest: dict[str, Any]) -> None:
    manifest["entries"][0]["key_material"]["target"] = {"soc_model": 69}


TAMPERING: dict[str, tuple[Callable[[Members], Members], str]] = {
    "file sha256, checksum kept": (_edit_manifest(_first_file("sha256", "0" * 64), checksum=False), "checksum"),
    "file sha256, checksum redone": (_edit_manifest(_first_file("sha256", "0" * 64)), "SHA-256"),
    "file size, checksum redone": (_edit_manifest(_first_file("size", 5)), "the archive manifest says 5"),
    "file size negative": (_edit_manifest(_first_file("size", -1)), "accepted: an integer >= 0"),
    "file path escapes": (_edit_manifest(_first_file("path", "../../evil.bin")), "not a plain relative path"),
    "unknown format version": (_edit_manifest(_set("format_version", 2)), "format_version 2"),
    "not our format": (_edit_manifest(_set("format", "something-else")), "accepted: 'qnnx-ctxcache-archive'"),
    "entries not a list": (_edit_manifest(_set("entries", {})), "no 'entries' list"),
    "entry dropped": (_edit_manifest(_unlisted_entry), "is not listed in the archive manifest"),
    "manifest not JSON": (_not_json, "not valid JSON"),
    "manifest not first": (_manifest_not_first, "its first member is"),
    "manifest nested too deeply": (_deeply_nested, "not valid JSON"),
    "manifest re-spelled": (lambda members: [*_respelled(members), *members[1:]], "exact form"),
    "extra file in record and members": (_extra_file, "lists other files"),
    "key material summary lies": (_edit_manifest(_summary_lies), "key material summary"),
    "binary changed, archive manifest resealed": (_changed_binary, "corrupt:checksum"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_tampered_archive_is_refused(shipped: Shipped, dest: cc.ContextStore, case: str) -> None:
    """A changed archive manifest or member is refused, with or without a recomputed checksum."""
    mutate, fragment = TAMPERING[case]
    bad = _write(shipped.tar.with_name("tampered.tar"), mutate(_members(shipped.tar)))
    _refused(dest, bad, fragment)


def test_unknown_format_version_names_accepted_and_fix(shipped: Shipped, dest: cc.ContextStore) -> None:
    """A newer format version says which versions this reader accepts and what to install."""
    mutate = _edit_manifest(_set("format_version", 2))
    error = _refused(dest, _write(shipped.tar.with_name("v2.tar"), mutate(_members(shipped.tar))))
    assert "accepted: 1" in error.problem
    assert "install the qnnx-ctxcache that packed it" in error.fix


def _key_of(members: Members, index: int = 0) -> str:
    return json.loads(members[0][1])["entries"][index]["key"]


def _material_changed(members: Members) -> Members:
    """The entry manifest's key material says SoC 69 but the key is still that of SoC 60."""
    name = f"entries/{_key_of(members)}/manifest.json"
    manifest = json.loads(next(data for info, data in members if info.name == name))
    manifest["key_material"]["target"] = {"soc_model": 69}
    return _reseal(_replace(members, name, json.dumps(manifest, indent=1, sort_keys=True).encode()))


def _renamed(*, rewrite_key_field: bool) -> Callable[[Members], Members]:
    """Move an entry under another key (directory and archive record), its material unchanged."""

    def mutate(members: Members) -> Members:
        old, new = _key_of(members), "ab" * 32
        out: Members = []
        for info, data in members:
            if info.name.startswith(f"entries/{old}/"):
                info = copy.copy(info)
                info.name = info.name.replace(old, new)
                if rewrite_key_field and info.name.endswith("/manifest.json"):
                    data = data.replace(old.encode(), new.encode())
            out.append((info, data.replace(old.encode(), new.encode()) if info.name == members[0][0].name else data))
        return _reseal(out)

    return mutate


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (_material_changed, "manifest:key-material"),
        (_renamed(rewrite_key_field=True), "manifest:key-material"),
        (_renamed(rewrite_key_field=False), "manifest:key"),
    ],
    ids=["material-changed", "moved-to-another-key", "moved-manifest-key-kept"],
)
def test_entry_whose_key_does_not_match_its_material_is_refused(
    shipped: Shipped, dest: cc.ContextStore, mutate: Callable[[Members], Members], fragment: str
) -> None:
    """The key is recomputed from the key material (the lookup's own check): a mismatch refuses the archive."""
    bad = _write(shipped.tar.with_name("wrong-key.tar"), mutate(_members(shipped.tar)))
    error = _refused(dest, bad, fragment, "is not a valid cache entry")
    assert error.archive == str(bad)


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.devmajor, info.devminor = 1, 3
    return info, b""


def _unsafe_members(key: str, outside: Path) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    return {
        "dot-dot": _regular("../escape.txt", b"x"),
        "absolute": _regular(str(outside), b"x"),
        "dot-dot-inside": _regular(f"entries/{key}/../../../escape.txt", b"x"),
        "empty-part": _regular(f"entries/{key}//model_ctx.onnx", b"x"),
        "backslash": _regular("entries\\..\\..\\escape.txt", b"x"),
        "symlink": _special(f"entries/{key}/model_ctx_qnn.bin", tarfile.SYMTYPE, str(outside)),
        "hardlink": _special(f"entries/{key}/model_ctx_qnn.bin", tarfile.LNKTYPE, "../../escape.txt"),
        "directory": _special(f"entries/{key}", tarfile.DIRTYPE),
        "char-device": _special(f"entries/{key}/null", tarfile.CHRTYPE),
        "fifo": _special(f"entries/{key}/fifo", tarfile.FIFOTYPE),
        "unlisted": _regular(f"entries/{key}/extra.bin", b"x"),
        "duplicate": _regular(f"entries/{key}/model_ctx_qnn.bin", b"x"),
    }


_PLAIN = "not a plain relative path"
UNSAFE_REASONS = {
    "dot-dot": _PLAIN,
    "absolute": _PLAIN,
    "dot-dot-inside": _PLAIN,
    "empty-part": _PLAIN,
    "backslash": _PLAIN,
    "symlink": "is a symlink",
    "hardlink": "is a hard link",
    "directory": "is a directory",
    "char-device": "special file",
    "fifo": "special file",
    "unlisted": "is not listed in the archive manifest",
    "duplicate": "appears twice",
}


@pytest.mark.parametrize("where", ["after-manifest", "at-end"])
@pytest.mark.parametrize("case", list(UNSAFE_REASONS))
def test_member_escaping_the_archive_is_refused(
    shipped: Shipped, dest: cc.ContextStore, tmp_path: Path, case: str, where: str
) -> None:
    """Traversal, links, devices, directories, unlisted and repeated members are refused; nothing lands outside."""
    members = _members(shipped.tar)
    outside = tmp_path / "escape.txt"
    evil = _unsafe_members(_key_of(members), outside)[case]
    if case == "duplicate" and where == "after-manifest":
        where = "at-end"  # a repeat must come after the original
    index = 1 if where == "after-manifest" else len(members)
    bad = _write(tmp_path / "evil.tar", [*members[:index], evil, *members[index:]])
    error = _refused(dest, bad, UNSAFE_REASONS[case])
    assert repr(evil[0].name) in error.problem
    assert not outside.exists()
    assert not (tmp_path.parent / "escape.txt").exists()


@pytest.mark.parametrize("content", [b"", b"not an archive at all" * 40, b"PK\x03\x04" + b"\x00" * 200])
def test_not_an_archive_is_refused(dest: cc.ContextStore, tmp_path: Path, content: bytes) -> None:
    """Empty files, random bytes and zip files are refused as unreadable."""
    path = tmp_path / "junk.tar"
    path.write_bytes(content)
    _refused(dest, path, "cannot be read")


def test_missing_archive_is_refused(dest: cc.ContextStore, tmp_path: Path) -> None:
    """A path that is not there (or is a directory) is refused with a fix that says to check the path."""
    error = _refused(dest, tmp_path / "nope.tar", "cannot be opened")
    assert error.fix == "check the archive path"
    _refused(dest, tmp_path, "cannot be opened")


# ------------------------------------------------------------------------------------------ CLI
def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_pack_and_unpack_json(shipped: Shipped, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`pack --json` and `unpack --json` exit 0 and report keys, size, SHA-256 and what was added."""
    root, archive = str(shipped.source.root), tmp_path / "cli.tar.gz"
    code, out, _ = _run(capsys, "--root", root, "pack", str(archive), "--json")
    packed = json.loads(out)
    assert code == 0
    assert set(packed["entries"]) == {k.hex for k in shipped.keys.values()}
    assert (packed["sha256"], packed["compression"], packed["skipped"]) == (_sha(archive.read_bytes()), "gz", [])
    device = str(tmp_path / "device")
    code, out, _ = _run(capsys, "--root", device, "unpack", str(archive), "--json")
    assert (code, set(json.loads(out)["added"])) == (0, set(packed["entries"]))
    code, out, _ = _run(capsys, "--root", device, "unpack", str(archive), "--json")
    assert (code, json.loads(out)["added"], len(json.loads(out)["already_present"])) == (0, [], 3)
    code, out, _ = _run(capsys, "--root", root, "pack", str(tmp_path / "a.tar"), shipped.keys["a"].hex[:6], "--json")
    assert (code, json.loads(out)["entries"]) == (0, [shipped.keys["a"].hex])


def test_cli_human_output(shipped: Shipped, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json, pack prints the count and SHA-256; unpack prints what it added."""
    code, out, _ = _run(capsys, "--root", str(shipped.source.root), "pack", str(tmp_path / "h.tar"))
    assert code == 0
    assert "packed 3 entries" in out
    assert _sha((tmp_path / "h.tar").read_bytes()) in out
    code, out, _ = _run(capsys, "--root", str(tmp_path / "device"), "unpack", str(tmp_path / "h.tar"))
    assert (code, out.startswith("added 3, already present 0, skipped 0")) == (0, True)


def test_cli_refusals_exit_3(
    shipped: Shipped,
    dest: cc.ContextStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A damaged archive, an unknown key or a read-only cache exit 3 with the problem and the fix on stderr."""
    raw = bytearray(shipped.tar.read_bytes())
    name, offset, size = _spans(shipped.tar)[-1]
    raw[offset + size // 2] ^= 1
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(raw))
    before = _listing(dest.root)
    code, out, err = _run(capsys, "--root", str(dest.root), "unpack", str(bad))
    assert (code, out) == (3, "")
    assert "refusing archive" in err
    assert name in err
    assert "qnnx-ctxcache: fix: copy the archive again" in err
    code, out, err = _run(capsys, "--root", str(dest.root), "unpack", str(bad), "--json")
    assert (code, json.loads(out)["error"]["type"]) == (3, "ArchiveError")
    assert _listing(dest.root) == before
    code, _, err = _run(capsys, "--root", str(shipped.source.root), "pack", str(tmp_path / "x.tar"), "ffffffff")
    assert code == 3
    assert "'ffffffff'" in err
    assert not (tmp_path / "x.tar").exists()
    monkeypatch.setenv("QNNX_CTXCACHE_MODE", "readonly")
    code, _, err = _run(capsys, "--root", str(dest.root), "unpack", str(shipped.tar))
    assert code == 3
    assert "'readonly'" in err


@pytest.mark.parametrize(
    "argv",
    [["pack"], ["unpack"], ["pack", "x.tar", "zz"], ["pack", "x.tar", "abc"], ["unpack", "a.tar", "b.tar"]],
)
def test_cli_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """Missing arguments and keys that are not hex prefixes of >= 4 digits are usage errors."""
    assert main(["--root", str(tmp_path / "cache"), *argv]) == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_help_lists_pack_and_unpack(capsys: pytest.CaptureFixture[str]) -> None:
    """--help shows both commands and an example."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "qnnx-ctxcache pack contexts.tar.gz" in out
    assert "unpack" in out


def test_file_record_without_a_path_is_refused() -> None:
    """An archive manifest whose file record has no path (or a non-string one) is malformed, not a path None."""
    from qnnx_ctxcache import _archive

    base = {"key": "0" * 64, "key_material": {}, "manifest": {"size": 1, "sha256": "0" * 64}}
    for item in ({"size": 1, "sha256": "0" * 64}, {"path": 7, "size": 1, "sha256": "0" * 64}):
        problem = _archive._record_problem({**base, "files": [item]})
        assert "is not a plain relative path" in problem
    assert (
        _archive._record_problem({**base, "files": [{"path": "model_ctx.onnx", "size": 1, "sha256": "0" * 64}]}) == ""
    )
