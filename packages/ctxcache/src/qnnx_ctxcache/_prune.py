"""Eviction to a size cap (least recently used first), removal, and garbage collection of leftovers."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import filelock

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey
from qnnx_ctxcache._layout import HEX64, ROOT_MARKER
from qnnx_ctxcache._listing import _ListingMixin
from qnnx_ctxcache._results import PruneReport
from qnnx_ctxcache.errors import InvalidOptionsError, NotACacheRootError

_log = logging.getLogger(__name__)


class _PruneMixin(_ListingMixin):
    """Keeping the cache under its size cap, deleting entries, and cleaning up what crashed processes left."""

    def _auto_prune(self, keep: frozenset[str]) -> None:
        try:
            total = sum(_fs.tree_disk_usage(p) for _, p in self._iter_entry_dirs())
            if total > self._options.max_size_bytes:
                self._prune(self._options.max_size_bytes, self._options.min_age_seconds, False, keep)
        except Exception as exc:  # eviction is best effort and must never fail a compile
            _log.warning("automatic prune of %s failed: %s", self._root, exc)

    def prune(
        self,
        max_size_bytes: int | None = None,
        *,
        min_age_seconds: float | None = None,
        dry_run: bool = False,
    ) -> PruneReport:
        """Evict least recently used entries until the total fits, and clean up leftovers.

        Whole entries are renamed into ``trash/`` (atomic) and then deleted, so a crash never leaves a
        half-deleted entry. Pinned entries and entries younger than the grace period are kept. Only one
        process prunes at a time; others return at once with ``skipped=True``. Never raises for
        filesystem problems.

        Args:
            max_size_bytes: the target; default ``StoreOptions.max_size_bytes``.
            min_age_seconds: grace period; default ``StoreOptions.min_age_seconds``.
            dry_run: report what would be removed without touching anything.
        """
        limit = self._options.max_size_bytes if max_size_bytes is None else max_size_bytes
        grace = self._options.min_age_seconds if min_age_seconds is None else min_age_seconds
        if not isinstance(limit, int) or limit < 0:
            raise InvalidOptionsError(f"max_size_bytes must be an int >= 0, got {limit!r}")
        if not isinstance(grace, int | float) or grace < 0:
            raise InvalidOptionsError(f"min_age_seconds must be a number >= 0, got {grace!r}")
        return self._prune(limit, grace, dry_run, frozenset())

    def _prune(self, limit: int, grace: float, dry_run: bool, keep: frozenset[str]) -> PruneReport:
        empty = PruneReport(
            removed=(), freed_bytes=0, total_bytes_before=0, total_bytes_after=0, kept_pinned=(), kept_young=(),
            cleaned=0, skipped=True, dry_run=dry_run,
        )  # fmt: skip
        if self._mode != "readwrite" and not dry_run:
            return empty
        gc_lock: filelock.BaseFileLock | None = None
        if not dry_run:
            try:
                gc_lock = filelock.FileLock(str(self._dir("locks") / "gc.lock"))
                gc_lock.acquire(timeout=0)
            except filelock.Timeout:
                return empty
            except (OSError, NotImplementedError):
                gc_lock = None  # no locking here: pruning is still safe, just possibly duplicated
        try:
            return self._prune_locked(limit, grace, dry_run, keep)
        finally:
            if gc_lock is not None:
                with contextlib.suppress(OSError):
                    gc_lock.release()

    def _prune_locked(self, limit: int, grace: float, dry_run: bool, keep: frozenset[str]) -> PruneReport:
        now = self._clock()
        cleaned = 0 if dry_run else self._gc(now)
        infos = self.entries()
        total = sum(i.size_bytes for i in infos)
        before = total
        removed: list[str] = []
        freed = 0
        kept_pinned: list[str] = []
        kept_young: list[str] = []
        for info in infos:  # least recently used first
            if total <= limit:
                break
            if info.pinned or info.key in keep:  # `keep`: the entry a store is about to hand back
                kept_pinned.append(info.key)
                continue
            if now - info.last_used < grace or now - info.created < grace:
                kept_young.append(info.key)
                continue
            if dry_run or self._evict(info.key):
                removed.append(info.key)
                freed += info.size_bytes
                total -= info.size_bytes
        if removed and not dry_run:
            self._count("evicted", len(removed))
            _log.info("ctxcache pruned %d entries (%d bytes) under %s", len(removed), freed, self._root)
            self._flush_stats()
        return PruneReport(
            removed=tuple(removed), freed_bytes=freed, total_bytes_before=before, total_bytes_after=total,
            kept_pinned=tuple(kept_pinned), kept_young=tuple(kept_young), cleaned=cleaned, skipped=False,
            dry_run=dry_run,
        )  # fmt: skip

    def _evict(self, key_hex: str) -> bool:
        src = self.entry_dir(key_hex)
        dest = self._dir("trash") / f"{key_hex}.{_fs.unique_suffix()}"
        try:
            os.rename(src, dest)
        except OSError as exc:  # gone already, or (Windows) a reader holds a file open: retry next time
            _log.debug("could not evict %s: %s", key_hex[:16], exc)
            return False
        if self._is_pinned(key_hex):
            # A reader pinned it between our check and the rename: put it back (it was not deleted).
            try:
                os.rename(dest, src)
                return False
            except OSError:
                pass  # a new entry was published meanwhile; ours is garbage now
        _fs.fault("evict_renamed")
        _fs.fault("evict_deleting")
        _fs.rmtree_quiet(dest)
        return True

    def _gc(self, now: float) -> int:
        """Remove stale staging dirs, trash, old quarantine, dead pins, old locks; keep ``.nfs*``."""
        stale_after = self._options.stale_after_seconds
        cleaned = 0

        def listing(name: str) -> list[Path]:
            try:
                return [p for p in self._dir(name).iterdir() if not p.name.startswith(".nfs")]
            except OSError:
                return []

        for path in listing("trash"):
            cleaned += _fs.rmtree_quiet(path)
        for path in listing("staging"):
            if self._is_stale_owner(path.name, path, now, stale_after):
                cleaned += _fs.rmtree_quiet(path)
        for path in listing("quarantine"):
            with contextlib.suppress(OSError):
                if now - path.lstat().st_mtime >= stale_after:
                    cleaned += _fs.rmtree_quiet(path)
        for pin_dir in listing("pins"):
            with contextlib.suppress(OSError):
                for pin in pin_dir.iterdir():
                    if self._is_stale_owner(pin.name, pin, now, stale_after):
                        cleaned += _fs.rmtree_quiet(pin)
                with contextlib.suppress(OSError):
                    pin_dir.rmdir()
        for lock in listing("locks"):
            # Deleting a lock file someone holds only weakens single-flight; correctness never relied on it.
            with contextlib.suppress(OSError):
                if lock.name != "gc.lock" and now - lock.lstat().st_mtime >= max(stale_after, 3600.0):
                    lock.unlink()
                    cleaned += 1
        for stats_file in listing("stats"):
            with contextlib.suppress(OSError):
                if now - stats_file.lstat().st_mtime >= 30 * 86400:
                    stats_file.unlink()
        return cleaned

    def remove(self, key: CacheKey | str) -> bool:
        """Delete one entry (rename to trash, then delete). Returns False when it was not there."""
        key_hex = key.hex if isinstance(key, CacheKey) else key
        if not HEX64.match(key_hex) or self._mode != "readwrite":
            return False
        return (
            self._evict(key_hex) if self.entry_dir(key_hex).exists() or self.entry_dir(key_hex).is_symlink() else False
        )

    def clear(self) -> int:
        """Delete every entry, staging dir, quarantine, lock and crash record of this store; returns entries removed.

        Raises:
            NotACacheRootError: the root has no ``ctxcache-root.json`` marker (never wipe a user folder).
        """
        if not (self._root / ROOT_MARKER).is_file():
            raise NotACacheRootError(str(self._root))
        count = 0
        for key_hex, _ in list(self._iter_entry_dirs()):
            count += self._evict(key_hex)
        for name in ("staging", "quarantine", "trash", "pins", "crashes"):
            for path in list(self._dir(name).iterdir()) if self._dir(name).is_dir() else []:
                if not path.name.startswith(".nfs"):
                    _fs.rmtree_quiet(path)
        return count
