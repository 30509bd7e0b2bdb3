"""Eviction: size cap, LRU by last use, grace period, pins, clock skew, stale leftovers, dry runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ctxcache_helpers import key_for

import qnnx_ctxcache as cc
from qnnx_ctxcache._layout import HOST_ID
from qnnx_ctxcache.testing import FakeBuild

KIB = 1024


def _put(store: cc.ContextStore, name: str, size: int = 16 * KIB) -> cc.Entry:
    return store.get_or_create(key_for(name), FakeBuild(payload=os.urandom(size)))


def _age(store: cc.ContextStore, name: str, seconds_ago: float) -> None:
    entry_dir = store.entry_dir(key_for(name))
    stamp = time.time() - seconds_ago
    for item in ("manifest.json", ".last_used"):
        os.utime(entry_dir / item, (stamp, stamp))


def test_lru_by_last_use_not_by_write(tmp_path: Path) -> None:
    """After put A, B, C and a hit on A, going over the cap evicts B (least recently used), not A."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_age_seconds=0, auto_prune=False))
    for i, name in enumerate("ABC"):
        _put(store, name)
        _age(store, name, 1000 - i)
    store.get(key_for("A"))  # touch: A becomes most recently used
    per_entry = store.entries()[0].size_bytes
    report = store.prune(per_entry * 2, min_age_seconds=0)
    assert report.removed == (key_for("B").hex,)
    assert {e.key for e in store.entries()} == {key_for("A").hex, key_for("C").hex}


def test_auto_prune_keeps_total_under_cap(tmp_path: Path) -> None:
    """Stores beyond the cap trigger eviction so the total stays within max_size_bytes."""
    probe = cc.ContextStore(tmp_path / "probe")
    _put(probe, "x")
    size = probe.entries()[0].size_bytes
    store = cc.ContextStore(tmp_path / "c", options=cc.StoreOptions(max_size_bytes=3 * size, min_age_seconds=0))
    for i in range(6):
        _put(store, f"e{i}")
        _age(store, f"e{i}", 100 - i)
        assert store.stats().total_bytes <= 3 * size
    assert store.stats().counters["evicted"] == 3


def test_grace_period_protects_fresh_entries(tmp_path: Path) -> None:
    """Entries younger than min_age are never evicted; with min_age 0 they are."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_age_seconds=600, auto_prune=False))
    _put(store, "fresh")
    report = store.prune(0)
    assert (report.removed, report.kept_young) == ((), (key_for("fresh").hex,))
    assert store.prune(0, min_age_seconds=0).removed == (key_for("fresh").hex,)


def test_pinned_entry_is_kept_in_process(tmp_path: Path) -> None:
    """An entry pinned by this process survives prune(0); released, it is evicted."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_age_seconds=0))
    _put(store, "p")
    with store.pin(key_for("p")) as entry:
        assert entry is not None
        assert store.prune(0).kept_pinned == (key_for("p").hex,)
        assert (entry.path / "model_ctx_qnn.bin").is_file()
    assert store.prune(0).removed == (key_for("p").hex,)


def test_dry_run_reports_without_deleting(tmp_path: Path) -> None:
    """prune(dry_run=True) lists what it would remove and leaves the tree unchanged."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_age_seconds=0))
    for name in "ab":
        _put(store, name)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    report = store.prune(0, dry_run=True)
    assert report.dry_run
    assert set(report.removed) == {key_for("a").hex, key_for("b").hex}
    assert report.freed_bytes == report.total_bytes_before > 0
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_future_timestamp_is_clamped_not_immortal(tmp_path: Path) -> None:
    """A last-use time a year in the future counts as now and is reset, so the entry ages normally."""
    clock = [time.time()]
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_age_seconds=600), clock=lambda: clock[0])
    _put(store, "skewed")
    future = clock[0] + 365 * 86400
    os.utime(store.entry_dir(key_for("skewed")) / ".last_used", (future, future))
    assert store.prune(0).kept_young == (key_for("skewed").hex,)  # treated as just used
    clock[0] += 700  # real time passes beyond the grace period
    assert store.prune(0).removed == (key_for("skewed").hex,)


def test_clock_jumping_backwards_evicts_nothing_by_negative_age(tmp_path: Path) -> None:
    """When the clock jumps back a day, entries look young (negative age) and are kept, without errors."""
    clock = [time.time()]
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_age_seconds=600), clock=lambda: clock[0])
    _put(store, "a")
    clock[0] -= 86400
    report = store.prune(0)
    assert report.removed == ()
    assert report.kept_young == (key_for("a").hex,)


def test_stale_staging_and_locks_are_cleaned_fresh_ones_kept(tmp_path: Path) -> None:
    """gc removes a 2-hour-old staging dir of a dead writer and old locks; keeps fresh ones and .nfs files."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(stale_after_seconds=3600))
    staging = tmp_path / "v1" / "staging"
    host = HOST_ID
    old = staging / f"{'a' * 64}.{host}.999999999.{'0' * 32}"
    fresh = staging / f"{'b' * 64}.{host}.999999999.{'1' * 32}"
    live = staging / f"{'c' * 64}.{host}.{os.getpid()}.{'2' * 32}"
    nfs = staging / ".nfs000123"
    old_lock = tmp_path / "v1" / "locks" / f"{'a' * 64}.lock"
    for path in (old, fresh, live):
        path.mkdir()
    nfs.write_text("x")
    old_lock.write_text("")
    two_hours_ago = time.time() - 7200
    for path in (old, live, nfs, old_lock):
        os.utime(path, (two_hours_ago, two_hours_ago))
    report = store.prune()
    assert report.cleaned == 2
    assert sorted(p.name for p in staging.iterdir()) == sorted([fresh.name, live.name, nfs.name])
    assert not old_lock.exists()


def test_quarantine_is_emptied_after_stale_after(tmp_path: Path) -> None:
    """Quarantined entries are kept for inspection, then removed by gc once stale."""
    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(stale_after_seconds=0))
    _put(store, "q")
    store.invalidate(key_for("q"), "test")
    assert store.stats().quarantined == 1
    store.prune()
    assert store.stats().quarantined == 0


def test_second_pruner_skips_while_one_runs(tmp_path: Path) -> None:
    """Only one process prunes at a time; a concurrent prune returns skipped=True and deletes nothing."""
    import filelock

    store = cc.ContextStore(tmp_path, options=cc.StoreOptions(min_age_seconds=0))
    _put(store, "a")
    holder = filelock.FileLock(str(tmp_path / "v1" / "locks" / "gc.lock"))
    holder.acquire()
    try:
        report = store.prune(0)
    finally:
        holder.release()
    assert report.skipped
    assert store.stats().entries == 1


def test_remove_and_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """remove() deletes one entry; clear() deletes all entries but refuses a root without the marker."""
    store = cc.ContextStore(tmp_path)
    for name in "abc":
        _put(store, name)
    assert store.remove(key_for("a").hex)
    assert not store.remove(key_for("a").hex)
    assert store.clear() == 2
    assert store.stats().entries == 0
    (tmp_path / "ctxcache-root.json").unlink()
    with pytest.raises(cc.errors.NotACacheRootError):
        store.clear()


def test_auto_prune_never_evicts_the_entry_being_returned(tmp_path: Path) -> None:
    """With no grace period, a cap for one entry and the older entry pinned, a store still returns a live entry."""
    probe = cc.ContextStore(tmp_path / "probe")
    _put(probe, "x")
    size = probe.entries()[0].size_bytes
    store = cc.ContextStore(tmp_path / "c", options=cc.StoreOptions(max_size_bytes=size + size // 2, min_age_seconds=0))
    _put(store, "old")
    with store.pin(key_for("old")):
        fresh = _put(store, "new")
    assert fresh.model_path.is_file()
    assert {e.key for e in store.entries()} == {key_for("old").hex, key_for("new").hex}
    assert store.prune().removed == (key_for("old").hex,)  # once unpinned, the older one goes
