"""Store behaviour: hits and misses, publish protocol, build errors, invalidation, locks, threads."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import attrs
import filelock
import pytest
from ctxcache_helpers import key_for

import qnnx_ctxcache as cc
from qnnx_ctxcache import _fs
from qnnx_ctxcache.errors import BuildOutputError, InvalidOptionsError
from qnnx_ctxcache.testing import FakeBuild, write_fake_context


def _staging_left(store: cc.ContextStore) -> list[str]:
    return sorted(p.name for p in (store.root / "v1" / "staging").iterdir())


def test_miss_builds_then_hit_serves(store: cc.ContextStore) -> None:
    """The first call builds and publishes; the second is a hit with the same files and metadata."""
    build = FakeBuild(metadata={"inputs": ["x"]})
    first = store.get_or_create(key_for(), build)
    second = store.get_or_create(key_for(), build)
    assert (first.hit, first.persisted, second.hit, second.persisted) == (False, True, True, True)
    assert build.calls == 1
    assert first.path == second.path == store.entry_dir(key_for())
    assert second.model_path.read_bytes() == first.model_path.read_bytes()
    assert dict(second.metadata) == {"inputs": ["x"]}
    assert _staging_left(store) == []
    assert store.stats().counters["hit"] == 1


def test_build_gets_fresh_empty_staging_dir_inside_root(store: cc.ContextStore) -> None:
    """build() receives an existing empty directory under the root's staging area."""
    seen: list[Path] = []

    def build(staging: Path) -> cc.BuildResult:
        seen.append(staging)
        assert staging.is_dir()
        assert list(staging.iterdir()) == []
        write_fake_context(staging, payload=b"abc")
        return cc.BuildResult()

    store.get_or_create(key_for(), build)
    assert seen[0].parent == store.root / "v1" / "staging"


def test_manifest_records_files_sizes_and_hashes(store: cc.ContextStore) -> None:
    """The manifest lists every file with size and SHA-256 plus the key material and EPContext nodes."""
    import hashlib

    entry = store.get_or_create(key_for(), FakeBuild(payload=b"payload-bytes"))
    manifest = json.loads((entry.path / "manifest.json").read_text())
    files = {f["path"]: f for f in manifest["files"]}
    assert set(files) == {"model_ctx.onnx", "model_ctx_qnn.bin"}
    assert files["model_ctx_qnn.bin"]["size"] == len(b"payload-bytes")
    assert files["model_ctx_qnn.bin"]["sha256"] == hashlib.sha256(b"payload-bytes").hexdigest()
    assert manifest["key"] == key_for().hex
    assert manifest["key_material"] == json.loads(cc.canonical_json(key_for().material))
    assert manifest["ep_contexts"][0]["file"] == "model_ctx_qnn.bin"
    assert manifest["ep_contexts"][0]["embed_mode"] == 0


def test_different_keys_are_different_entries(store: cc.ContextStore) -> None:
    """Two keys give two entries with their own payloads."""
    a = store.get_or_create(key_for("a"), FakeBuild(payload=b"A" * 10))
    b = store.get_or_create(key_for("b"), FakeBuild(payload=b"B" * 10))
    assert a.path != b.path
    assert (a.path / "model_ctx_qnn.bin").read_bytes() == b"A" * 10
    assert store.stats().entries == 2


def test_build_exception_propagates_unchanged_and_cleans_staging(store: cc.ContextStore) -> None:
    """An exception from build reaches the caller as the same object; no entry, no staging left."""
    error = RuntimeError("QNN said no")
    with pytest.raises(RuntimeError) as info:
        store.get_or_create(key_for(), FakeBuild(fail=error))
    assert info.value is error
    assert store.get(key_for()) is None
    assert _staging_left(store) == []
    assert store.stats().counters["build_failed"] == 1


def test_keyboard_interrupt_in_build_cleans_up_and_releases_lock(store: cc.ContextStore) -> None:
    """KeyboardInterrupt during a build propagates, removes staging and frees the key lock."""
    with pytest.raises(KeyboardInterrupt):
        store.get_or_create(key_for(), FakeBuild(fail=KeyboardInterrupt()))
    assert _staging_left(store) == []
    lock = filelock.FileLock(str(store.root / "v1" / "locks" / f"{key_for().hex}.lock"))
    lock.acquire(timeout=0)
    lock.release()


def test_missing_referenced_binary_is_a_build_output_error(store: cc.ContextStore) -> None:
    """A model whose EPContext file was not written raises BuildOutputError naming the file; nothing stored."""
    with pytest.raises(BuildOutputError) as info:
        store.get_or_create(key_for(), FakeBuild(skip_bin=True))
    assert "model_ctx_qnn.bin" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert store.get(key_for()) is None
    assert _staging_left(store) == []


def test_build_output_problems_are_all_reported(store: cc.ContextStore) -> None:
    """A bad model_file and bad metadata are reported together."""

    def build(staging: Path) -> cc.BuildResult:
        return cc.BuildResult(model_file="../escape.onnx", metadata={"x": float("nan")})

    with pytest.raises(BuildOutputError) as info:
        store.get_or_create(key_for(), build)
    assert len(info.value.problems) == 2


def test_empty_and_escaping_references_are_rejected(store: cc.ContextStore) -> None:
    """An empty binary and an ep_cache_context pointing outside the build dir are both refused."""

    def build_empty(staging: Path) -> cc.BuildResult:
        write_fake_context(staging, payload=b"")
        return cc.BuildResult()

    def build_escape(staging: Path) -> cc.BuildResult:
        write_fake_context(staging, payload=b"x", bin_file="../outside.bin")
        return cc.BuildResult()

    with pytest.raises(BuildOutputError, match="empty"):
        store.get_or_create(key_for("e"), build_empty)
    with pytest.raises(BuildOutputError, match="relative path"):
        store.get_or_create(key_for("f"), build_escape)


def test_symlink_in_build_output_is_refused(store: cc.ContextStore, tmp_path: Path) -> None:
    """A symlink written by the build is never published (entries hold regular files only)."""
    outside = tmp_path / "secret"
    outside.write_text("s")

    def build(staging: Path) -> cc.BuildResult:
        write_fake_context(staging, payload=b"x")
        (staging / "link").symlink_to(outside)
        return cc.BuildResult()

    with pytest.raises(BuildOutputError, match="regular file"):
        store.get_or_create(key_for(), build)
    assert outside.read_text() == "s"


def test_wrong_return_type_is_a_type_error(store: cc.ContextStore) -> None:
    """A build that does not return a BuildResult is a TypeError and leaves no staging behind."""
    with pytest.raises(TypeError, match="BuildResult"):
        store.get_or_create(key_for(), lambda staging: "model_ctx.onnx")  # type: ignore[arg-type,return-value]
    assert _staging_left(store) == []


def test_no_ep_context_is_returned_uncached(store: cc.ContextStore) -> None:
    """A build where the EP compiled nothing is usable but not stored."""
    entry = store.get_or_create(key_for(), FakeBuild(no_ep_context=True))
    assert (entry.persisted, entry.reason) == (False, "no-ep-context")
    assert entry.model_path.is_file()
    assert store.get(key_for()) is None
    entry.release()
    assert not entry.path.exists()


def test_entry_larger_than_cap_is_not_stored(tmp_path: Path) -> None:
    """An entry bigger than max_size_bytes is returned uncached and never published."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(max_size_bytes=4096))
    entry = store.get_or_create(key_for(), FakeBuild(payload=os.urandom(64 * 1024)))
    assert (entry.persisted, entry.reason) == (False, "too-large")
    assert (entry.path / "model_ctx_qnn.bin").stat().st_size == 64 * 1024
    assert store.stats().entries == 0


def test_invalidate_quarantines_and_next_call_rebuilds(store: cc.ContextStore) -> None:
    """invalidate() moves the entry to quarantine with its reason; the next get_or_create rebuilds."""
    build = FakeBuild()
    store.get_or_create(key_for(), build)
    store.invalidate(key_for(), "INVALID_GRAPH from ORT")
    assert store.get(key_for()) is None
    reasons = [json.loads(p.read_text())["detail"] for p in (store.root / "v1" / "quarantine").glob("*.json")]
    assert reasons == ["INVALID_GRAPH from ORT"]
    again = store.get_or_create(key_for(), build)
    assert (again.hit, build.calls) == (False, 2)
    store.invalidate(key_for("absent"), "nothing there")  # not an error


def test_load_or_rebuild_rebuilds_a_bad_hit_once(store: cc.ContextStore) -> None:
    """A hit whose load fails is quarantined and rebuilt once; the second load's result is returned."""
    build = FakeBuild()
    store.get_or_create(key_for(), build)
    attempts: list[bool] = []

    def load(entry: cc.Entry) -> str:
        attempts.append(entry.hit)
        if len(attempts) == 1:
            raise RuntimeError("INVALID_GRAPH")
        return "session"

    entry, session = store.load_or_rebuild(key_for(), build, load)
    assert (session, attempts, entry.hit, build.calls) == ("session", [True, False], False, 2)


def test_load_or_rebuild_surfaces_a_persistent_failure(store: cc.ContextStore) -> None:
    """If the rebuilt entry fails to load too, the loader's error propagates (no loop) and it is invalidated."""
    build = FakeBuild()
    store.get_or_create(key_for(), build)

    def load(entry: cc.Entry) -> str:
        raise ValueError("still broken")

    with pytest.raises(ValueError, match="still broken"):
        store.load_or_rebuild(key_for(), build, load)
    assert build.calls == 2
    assert store.get(key_for()) is None


def test_durability_call_order(store: cc.ContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files are fsynced, then the manifest, then the staging dir, then renamed, then the parent fsynced."""
    log: list[str] = []
    real_file, real_dir, real_rename = _fs.fsync_file, _fs.fsync_dir, os.rename
    real_fsync = os.fsync
    monkeypatch.setattr(_fs, "fsync_file", lambda p: (log.append(f"fsync_file:{p.name}"), real_file(p))[1])
    monkeypatch.setattr(
        _fs, "fsync_dir", lambda p: (log.append(f"fsync_dir:{p.parent.name}/{p.name[:8]}"), real_dir(p))[1]
    )
    monkeypatch.setattr(os, "fsync", lambda fd: (log.append("fsync_fd"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "rename", lambda a, b: (log.append(f"rename:{Path(b).parent.name}"), real_rename(a, b))[1])
    store.get_or_create(key_for(), FakeBuild())
    k = key_for().hex
    # The wrappers log their own name and then the os.fsync they issue ("fsync_fd").
    assert (
        log
        == [
            "fsync_file:model_ctx.onnx",
            "fsync_fd",
            "fsync_file:model_ctx_qnn.bin",
            "fsync_fd",
            "fsync_fd",  # manifest temp file, before its os.replace
            f"fsync_dir:staging/{k[:8]}",
            "fsync_fd",
            f"rename:{k[:2]}",
            f"fsync_dir:entries/{k[:2]}",
            "fsync_fd",
        ]
    )


def test_non_durable_store_never_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With durable=False no fsync is issued."""
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(durable=False))
    store.get_or_create(key_for(), FakeBuild())
    assert calls == []


def test_lock_timeout_compiles_anyway(tmp_path: Path) -> None:
    """When another holder keeps the key lock past lock_timeout, the caller compiles and publishes anyway."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(lock_timeout=0.2))
    holder = filelock.FileLock(str(tmp_path / "v1" / "locks" / f"{key_for().hex}.lock"))
    holder.acquire()
    try:
        entry = store.get_or_create(key_for(), FakeBuild())
    finally:
        holder.release()
    assert entry.persisted
    assert store.stats().counters["lock:timeout"] == 1


def test_unusable_lock_dir_still_stores(tmp_path: Path) -> None:
    """If the lock file cannot be created the store still publishes (locks only save work)."""
    store = cc.ContextStore(tmp_path)
    (tmp_path / "v1" / "locks").rmdir()
    (tmp_path / "v1" / "locks").write_text("not a dir")
    entry = store.get_or_create(key_for(), FakeBuild())
    assert entry.persisted
    assert store.stats().counters["lock:unavailable"] == 1


def test_threads_race_on_one_key(store: cc.ContextStore) -> None:
    """Eight threads asking for one key get the same entry from exactly one build."""
    build = FakeBuild(sleep=0.2)
    results: list[cc.Entry] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(store.get_or_create(key_for(), build))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert build.calls == 1
    assert {e.path for e in results} == {store.entry_dir(key_for())}


def test_first_writer_wins_and_loser_uses_winner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If an entry appears while we build, our staging is discarded and the published entry is returned."""
    store = cc.ContextStore(tmp_path)
    other = cc.ContextStore(tmp_path)

    def racing_build(staging: Path) -> cc.BuildResult:
        other.get_or_create.__func__(other, key_for(), FakeBuild(payload=b"winner"))  # type: ignore[attr-defined]
        write_fake_context(staging, payload=b"loser")
        return cc.BuildResult()

    # Bypass the lock (a second store object in one process would wait on it) to force the race.
    monkeypatch.setattr(cc.ContextStore, "_key_lock", lambda self, key: _null())
    entry = store.get_or_create(key_for(), racing_build)
    assert (entry.hit, entry.persisted) == (False, True)
    assert (entry.path / "model_ctx_qnn.bin").read_bytes() == b"winner"
    assert store.stats().counters["store_lost_race"] == 1
    assert _staging_left(store) == []


def _null():  # type: ignore[no-untyped-def]
    import contextlib

    return contextlib.nullcontext()


def test_options_are_validated_with_helpful_messages() -> None:
    """Bad StoreOptions values raise InvalidOptionsError naming the field and accepted values."""
    with pytest.raises(InvalidOptionsError, match="max_size_bytes"):
        cc.StoreOptions(max_size_bytes=-1)
    with pytest.raises(InvalidOptionsError, match="readonly"):
        cc.StoreOptions(mode="fast")
    with pytest.raises(InvalidOptionsError, match="StoreOptions"):
        cc.ContextStore("/tmp/x", options={"max_size_bytes": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cc.StoreOptions(10)  # type: ignore[misc]


def test_root_defaults_to_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QNNX_CTXCACHE_DIR sets the default root; an explicit root wins over it."""
    monkeypatch.setenv("QNNX_CTXCACHE_DIR", str(tmp_path / "env"))
    assert cc.ContextStore().root == tmp_path / "env"
    assert cc.ContextStore(tmp_path / "arg").root == tmp_path / "arg"
    assert (tmp_path / "env" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert json.loads((tmp_path / "env" / "ctxcache-root.json").read_text())["format"] == "qnnx-ctxcache-root"


def test_default_root_is_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without env or argument the root is the platformdirs user cache folder."""
    import platformdirs

    assert cc.default_root() == Path(platformdirs.user_cache_dir("qnnx-ctxcache", appauthor=False))


def test_private_dirs(tmp_path: Path) -> None:
    """Directories the store creates are private to the user (0o700) by default."""
    store = cc.ContextStore(tmp_path / "c")
    store.get_or_create(key_for(), FakeBuild())
    assert (store.root.stat().st_mode & 0o777) == 0o700
    assert (store.entry_dir(key_for()).stat().st_mode & 0o777) == 0o700


def test_recache_rebuilds_each_key_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """recache (option or $QNNX_CTXCACHE_RECACHE=1) replaces an existing entry once per key, then serves hits."""
    cc.ContextStore(tmp_path).get_or_create(key_for(), FakeBuild(payload=b"old"))
    monkeypatch.setenv("QNNX_CTXCACHE_RECACHE", "1")
    store = cc.ContextStore(tmp_path)
    build = FakeBuild(payload=b"new")
    first = store.get_or_create(key_for(), build)
    second = store.get_or_create(key_for(), build)
    assert (first.hit, second.hit, build.calls) == (False, True, 1)
    assert (second.path / "model_ctx_qnn.bin").read_bytes() == b"new"


def test_same_pid_writers_without_lock_use_distinct_staging(store: cc.ContextStore, tmp_path: Path) -> None:
    """Writers sharing a PID (threads here, containers in the field) get distinct staging dirs; one entry wins."""
    unlocked = cc.ContextStore(store.root, options=cc.StoreOptions(single_flight=False))
    seen: list[str] = []
    barrier = threading.Barrier(4)

    def build(staging: Path) -> cc.BuildResult:
        seen.append(staging.name)
        barrier.wait(timeout=30)
        write_fake_context(staging, payload=staging.name.encode())
        return cc.BuildResult()

    results: list[cc.Entry] = []
    threads = [
        threading.Thread(target=lambda: results.append(unlocked.get_or_create(key_for(), build))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(set(seen)) == 4
    assert len({(e.path / "model_ctx_qnn.bin").read_bytes() for e in results}) == 1
    assert _staging_left(store) == []


def test_unicode_and_spaces_in_root(tmp_path: Path) -> None:
    """A root with spaces and non-ASCII characters works like any other."""
    store = cc.ContextStore(tmp_path / "my caché ñ 目录")
    assert store.get_or_create(key_for(), FakeBuild()).persisted
    assert store.get(key_for()) is not None


def test_inspect_returns_entry_details_and_the_old_dict(tmp_path: Path) -> None:
    """`inspect` gives a frozen EntryDetails; `to_dict()` is the manifest plus path, size, last use and pin state."""
    store = cc.ContextStore(tmp_path)
    key = key_for("details")
    entry = store.get_or_create(key, FakeBuild())
    details = store.inspect(key)
    assert isinstance(details, cc.EntryDetails)
    assert (details.key, details.path, details.pinned, details.error) == (key.hex, entry.path, False, "")
    assert details.size_bytes is not None and details.size_bytes > 0
    assert details.key_material == json.loads(cc.canonical_json(key.material))
    assert details.model_file == "model_ctx.onnx"
    manifest = json.loads((entry.path / "manifest.json").read_text())
    assert details.to_dict() == {
        **manifest,
        "path": str(entry.path),
        "size_bytes": details.size_bytes,
        "last_used": details.last_used,
        "pinned": False,
    }
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        details.pinned = True  # type: ignore[misc]
    assert store.inspect(key_for("absent")) is None


def test_inspect_reports_a_damaged_manifest_as_an_error(tmp_path: Path) -> None:
    """A manifest that does not parse comes back as EntryDetails with `error` set; `to_dict()` is {key, error}."""
    store = cc.ContextStore(tmp_path)
    key = key_for("damaged")
    entry = store.get_or_create(key, FakeBuild())
    (entry.path / "manifest.json").write_text("{not json")
    details = store.inspect(key)
    assert details is not None
    assert (details.error, details.key_material, details.size_bytes) == ("manifest:invalid-json", None, None)
    assert details.to_dict() == {"key": key.hex, "error": "manifest:invalid-json"}


def test_releasing_runs_every_step_and_passes_over_only_os_errors() -> None:
    """The best-effort release of locks and markers: every step runs when the block ends, even after a step's
    OSError or the block's own exception; any other error of a step propagates."""
    ran: list[str] = []

    def refuse() -> None:
        ran.append("refuse")
        raise PermissionError("read-only")

    with pytest.raises(KeyError), _fs.releasing(refuse, lambda: ran.append("second")):
        raise KeyError("block")
    assert ran == ["refuse", "second"]
    with pytest.raises(ValueError), _fs.releasing(lambda: int("x")):
        pass
    with _fs.releasing():
        pass
