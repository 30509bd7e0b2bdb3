"""Eviction to a size cap (least recently used first), removal, and garbage collection of leftovers."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import attrs
import filelock

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey
from qnnx_ctxcache._layout import HEX64, ROOT_MARKER
from qnnx_ctxcache._listing import Listing
from qnnx_ctxcache._part import StorePart
from qnnx_ctxcache._pins import Pins, is_stale_owner
from qnnx_ctxcache._results import PruneReport
from qnnx_ctxcache.errors import InvalidOptionsError, NotACacheRootError

_log = logging.getLogger(__name__)


@attrs.define(eq=False)
class Pruner(StorePart):
    """Keeping the cache under its size cap, deleting entries, and cleaning up what crashed processes left."""

    _listing: Listing
    _pins: Pins

    def auto_prune(self, keep: frozenset[str]) -> None:
        """Prune to ``StoreOptions.max_size_bytes`` when the cache is over it, sparing ``keep``; never raises."""
        options = self._layout.options
        try:
            total = sum(_fs.tree_disk_usage(p) for _, p in self._listing.entry_dirs())
            if total > options.max_size_bytes:
                self._prune(options.max_size_bytes, options.min_age_seconds, False, keep)
        except Exception as exc:  # eviction is best effort and must never fail a compile
            _log.warning("automatic prune of %s failed: %s", self._layout.root, exc)

    def prune(self, max_size_bytes: int | None, min_age_seconds: float | None, dry_run: bool) -> PruneReport:
        """``ContextStore.prune``: the limit and grace period default to the store's options and are checked."""
        options = self._layout.options
        limit = options.max_size_bytes if max_size_bytes is None else max_size_bytes
        grace = options.min_age_seconds if min_age_seconds is None else min_age_seconds
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
        if self._layout.mode != "readwrite" and not dry_run:
            return empty
        gc_lock: filelock.BaseFileLock | None = None
        if not dry_run:
            try:
                gc_lock = filelock.FileLock(str(self._layout.folder("locks") / "gc.lock"))
                gc_lock.acquire(timeout=0)
            except filelock.Timeout:
                return empty
            except (OSError, NotImplementedError):
                gc_lock = None  # no locking here: pruning is still safe, just possibly duplicated
        with _fs.releasing(*((gc_lock.release,) if gc_lock is not None else ())):
            return self._prune_locked(limit, grace, dry_run, keep)

    def _prune_locked(self, limit: int, grace: float, dry_run: bool, keep: frozenset[str]) -> PruneReport:
        now = self._layout.clock()
        cleaned = 0 if dry_run else self._gc(now)
        infos = self._listing.entries()
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
            if dry_run or self.evict(info.key):
                removed.append(info.key)
                freed += info.size_bytes
                total -= info.size_bytes
        if removed and not dry_run:
            self._counters.count("evicted", len(removed))
            _log.info("ctxcache pruned %d entries (%d bytes) under %s", len(removed), freed, self._layout.root)
            self._counters.flush()
        return PruneReport(
            removed=tuple(removed), freed_bytes=freed, total_bytes_before=before, total_bytes_after=total,
            kept_pinned=tuple(kept_pinned), kept_young=tuple(kept_young), cleaned=cleaned, skipped=False,
            dry_run=dry_run,
        )  # fmt: skip

    def evict(self, key_hex: str) -> bool:
        """Rename an entry into ``trash/`` and delete it; False when it could not go (or a reader pinned it)."""
        src = self._layout.entry_dir(key_hex)
        dest = self._layout.folder("trash") / f"{key_hex}.{_fs.unique_suffix()}"
        try:
            os.rename(src, dest)
        except OSError as exc:  # gone already, or (Windows) a reader holds a file open: retry next time
            _log.debug("could not evict %s: %s", key_hex[:16], exc)
            return False
        if self._pins.is_pinned(key_hex):
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
        stale_after = self._layout.options.stale_after_seconds
        cleaned = 0

        def listing(name: str) -> list[Path]:
            try:
                return [p for p in self._layout.folder(name).iterdir() if not p.name.startswith(".nfs")]
            except OSError:
                return []

        for path in listing("trash"):
            cleaned += _fs.rmtree_quiet(path)
        for path in listing("staging"):
            if is_stale_owner(path.name, path, now, stale_after):
                cleaned += _fs.rmtree_quiet(path)
        for path in listing("quarantine"):
            with contextlib.suppress(OSError):
                if now - path.lstat().st_mtime >= stale_after:
                    cleaned += _fs.rmtree_quiet(path)
        for pin_dir in listing("pins"):
            with contextlib.suppress(OSError):
                for pin in pin_dir.iterdir():
                    if is_stale_owner(pin.name, pin, now, stale_after):
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
        key_hex = key.hex if isinstance(key, CacheKey) else key
        if not HEX64.match(key_hex) or self._layout.mode != "readwrite":
            return False
        entry_dir = self._layout.entry_dir(key_hex)
        return self.evict(key_hex) if entry_dir.exists() or entry_dir.is_symlink() else False

    def clear(self) -> int:
        layout = self._layout
        if not (layout.root / ROOT_MARKER).is_file():
            raise NotACacheRootError(str(layout.root))
        count = 0
        for key_hex, _ in list(self._listing.entry_dirs()):
            count += self.evict(key_hex)
        for name in ("staging", "quarantine", "trash", "pins", "crashes"):
            for path in list(layout.folder(name).iterdir()) if layout.folder(name).is_dir() else []:
                if not path.name.startswith(".nfs"):
                    _fs.rmtree_quiet(path)
        return count
