"""Environment failures: read-only, missing, unusable roots degrade with one warning, never fail a compile."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctxcache_helpers import CHILD_PRELUDE, key_for, run_child

import qnnx_ctxcache as cc
from qnnx_ctxcache.testing import FakeBuild


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in sorted(root.rglob("*"))}


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory an unprivileged user can traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="ctxcache-ro-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_read_only_root_serves_hits_and_writes_nothing(shared_tmp: Path) -> None:
    """In a root the process cannot write, hits are served, misses build privately, nothing changes on disk."""
    root = shared_tmp / "cache"
    store = cc.ContextStore(root, options=cc.StoreOptions(private=False))
    store.get_or_create(key_for("cached"), FakeBuild(payload=b"cached-bytes"))
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    before = _tree(root)
    drop = "os.setgid(65534); os.setuid(65534)" if os.getuid() == 0 else ""
    if os.getuid() != 0:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
    done = run_child(
        CHILD_PRELUDE
        + f"""
import os, logging, io
log = io.StringIO(); logging.basicConfig(stream=log, level=logging.WARNING)
FakeBuild().__call__  # the package and onnx are imported before privileges are dropped
import onnx
# and the store's parts, which it imports when first used (unreadable to the dropped user here)
import filelock, qnnx_ctxcache._lookup, qnnx_ctxcache._prune, qnnx_ctxcache._publish
{drop}
store = cc.ContextStore({str(root)!r}, options=cc.StoreOptions(touch_interval_seconds=0))
hit = store.get(key_for("cached"))
miss = store.get_or_create(key_for("new"), FakeBuild(payload=b"new-bytes"))
print(json.dumps({{"mode": store.mode, "hit": (hit.path / "model_ctx_qnn.bin").read_bytes().decode(),
    "miss": [miss.persisted, miss.reason, (miss.path / "model_ctx_qnn.bin").read_bytes().decode()],
    "prune": store.prune(0, min_age_seconds=0).skipped, "warnings": log.getvalue().count("WARNING")}}))
"""
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {
        "mode": "readonly",
        "hit": "cached-bytes",
        "miss": [False, "readonly", "new-bytes"],
        "prune": True,
        "warnings": 1,
    }
    assert _tree(root) == before


def test_readonly_mode_can_be_forced_by_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QNNX_CTXCACHE_MODE=readonly serves hits and builds misses uncached even in a writable root."""
    cc.ContextStore(tmp_path).get_or_create(key_for("a"), FakeBuild())
    monkeypatch.setenv("QNNX_CTXCACHE_MODE", "readonly")
    store = cc.ContextStore(tmp_path)
    assert store.mode == "readonly"
    assert store.get(key_for("a")) is not None
    assert store.get_or_create(key_for("b"), FakeBuild()).persisted is False
    assert not store.entry_dir(key_for("b")).exists()


@pytest.mark.parametrize("kind", ["file", "unreachable"])
def test_unusable_root_disables_cache_with_one_warning(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A root that is a file, or under a file, gives mode disabled; compiles still work; one warning."""
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    root = blocker if kind == "file" else blocker / "sub" / "cache"
    with caplog.at_level(logging.WARNING, logger="qnnx_ctxcache"):
        store = cc.ContextStore(root)
        first = store.get_or_create(key_for(), FakeBuild())
        second = store.get_or_create(key_for(), FakeBuild())
        cc.ContextStore(root)
    assert store.mode == "disabled"
    assert (first.persisted, first.reason, second.hit) == (False, "disabled", False)
    assert first.model_path.is_file()
    assert store.get(key_for()) is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert blocker.read_text() == "x"


def test_disabled_mode_by_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QNNX_CTXCACHE_MODE=disabled compiles every time and creates nothing under the root."""
    monkeypatch.setenv("QNNX_CTXCACHE_MODE", "disabled")
    build = FakeBuild()
    store = cc.ContextStore(tmp_path / "c")
    store.get_or_create(key_for(), build)
    store.get_or_create(key_for(), build)
    assert build.calls == 2
    assert not (tmp_path / "c").exists()


def test_low_free_space_builds_uncached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below min_free_bytes the build runs outside the cache and the result is returned uncached."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_free_bytes=2**62))
    entry = store.get_or_create(key_for(), FakeBuild())
    assert (entry.persisted, entry.reason) == (False, "low-disk")
    assert not str(entry.path).startswith(str(tmp_path))


def test_staging_dir_creation_failure_degrades(tmp_path: Path) -> None:
    """If staging/ cannot be used, the build runs privately and is returned uncached."""
    store = cc.ContextStore(tmp_path)
    (tmp_path / "v1" / "staging").rmdir()
    (tmp_path / "v1" / "staging").write_text("blocked")
    entry = store.get_or_create(key_for(), FakeBuild())
    assert entry.persisted is False
    assert entry.reason.startswith("store-failed:")
    assert entry.model_path.is_file()


def test_existing_directory_with_user_files_is_left_alone(tmp_path: Path) -> None:
    """Opening a cache in a folder with user files adds only ctxcache's own names."""
    (tmp_path / "notes.txt").write_text("mine")
    store = cc.ContextStore(tmp_path)
    store.get_or_create(key_for(), FakeBuild())
    store.clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CACHEDIR.TAG", "ctxcache-root.json", "notes.txt", "v1"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_invalidate_in_read_only_mode_builds_privately(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In read-only mode an invalidated hit cannot be quarantined, so this process stops using it and builds privately."""
    cc.ContextStore(tmp_path).get_or_create(key_for(), FakeBuild(payload=b"bad"))
    monkeypatch.setenv("QNNX_CTXCACHE_MODE", "readonly")
    store = cc.ContextStore(tmp_path)
    calls: list[bool] = []

    def load(entry: cc.Entry) -> bytes:
        calls.append(entry.hit)
        data = (entry.path / "model_ctx_qnn.bin").read_bytes()
        if data == b"bad":
            raise RuntimeError("INVALID_GRAPH")
        return data

    entry, data = store.load_or_rebuild(key_for(), FakeBuild(payload=b"good"), load)
    assert (data, calls, entry.persisted, entry.reason) == (b"good", [True, False], False, "readonly")
    assert store.entry_dir(key_for()).is_dir()  # nothing under the root was touched
