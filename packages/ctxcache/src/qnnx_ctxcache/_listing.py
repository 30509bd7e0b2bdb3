"""Listing entries, looking one up by prefix, inspecting it, and the store's stats and counters."""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey
from qnnx_ctxcache._layout import FUTURE_TOLERANCE, HEX2, HEX64, HOST_ID, is_key_prefix
from qnnx_ctxcache._manifest import LAST_USED_NAME, MANIFEST_NAME, read_manifest
from qnnx_ctxcache._pins import _PinsMixin
from qnnx_ctxcache._results import EntryDetails, EntryInfo, StoreStats


class _ListingMixin(_PinsMixin):
    """What the cache holds: entries, their details and sizes, and the counters of this and other processes."""

    def _iter_entry_dirs(self) -> Iterator[tuple[str, Path]]:
        base = self._dir("entries")
        try:
            shards = sorted(base.iterdir())
        except OSError:
            return
        for shard in shards:
            if not HEX2.match(shard.name) or shard.is_symlink() or not shard.is_dir():
                continue
            try:
                children = sorted(shard.iterdir())
            except OSError:
                continue
            for child in children:
                if HEX64.match(child.name) and child.name[:2] == shard.name:
                    yield child.name, child

    def _junk(self) -> list[str]:
        junk: list[str] = []
        base = self._dir("entries")
        try:
            shards = sorted(base.iterdir())
        except OSError:
            return junk
        for shard in shards:
            if not HEX2.match(shard.name) or shard.is_symlink() or not shard.is_dir():
                junk.append(shard.name)
                continue
            with contextlib.suppress(OSError):
                for child in sorted(shard.iterdir()):
                    if not (HEX64.match(child.name) and child.name[:2] == shard.name):
                        junk.append(f"{shard.name}/{child.name}")
        return junk

    def _last_used(self, entry_dir: Path, now: float) -> tuple[float, float]:
        """(last use, creation) of an entry; future times (clock skew) are reset to now."""
        try:
            created = (entry_dir / MANIFEST_NAME).lstat().st_mtime
        except OSError:
            created = 0.0
        try:
            last = (entry_dir / LAST_USED_NAME).lstat().st_mtime
        except OSError:
            last = created
        last = max(last, created)
        if last > now + FUTURE_TOLERANCE:
            # Clock skew: treat as used now and rewrite the stamp so the entry ages normally from here
            # instead of looking fresh until the far-future time arrives.
            if self._mode == "readwrite":
                with contextlib.suppress(OSError):
                    os.utime(entry_dir / LAST_USED_NAME, (now, now))
            last = now
        return min(last, now), min(created, now)

    def entries(self) -> list[EntryInfo]:
        """All published entries (not checked), least recently used first."""
        now = self._clock()
        infos = []
        for key_hex, path in self._iter_entry_dirs():
            last, created = self._last_used(path, now)
            infos.append(
                EntryInfo(
                    key=key_hex,
                    path=path,
                    size_bytes=_fs.tree_disk_usage(path),
                    last_used=last,
                    created=created,
                    pinned=self._is_pinned(key_hex),
                )
            )
        infos.sort(key=lambda e: (e.last_used, e.key))
        return infos

    def resolve(self, prefix: str) -> str | None:
        """The full key of the only entry whose key starts with ``prefix`` (at least 4 hex chars)."""
        matches = self._matching(prefix)
        return matches[0] if matches is not None and len(matches) == 1 else None

    def _matching(self, prefix: str) -> list[str] | None:
        """Keys of the entries that start with ``prefix``; None when it is not a hex prefix of >= 4 digits."""
        if not is_key_prefix(prefix):
            return None
        prefix = prefix.lower()
        return [k for k, _ in self._iter_entry_dirs() if k.startswith(prefix)]

    def inspect(self, key: CacheKey | str) -> EntryDetails | None:
        """The manifest of an entry plus its disk size, last use and pin state, or None if absent.

        A damaged entry (its manifest missing or unreadable) comes back with ``error`` set, never raised.
        """
        key_hex = key.hex if isinstance(key, CacheKey) else key
        if not HEX64.match(key_hex):
            return None
        entry_dir = self.entry_dir(key_hex)
        manifest, reason = read_manifest(entry_dir)
        if manifest is None:
            if reason == "manifest:missing" and not entry_dir.exists():
                return None
            return EntryDetails(
                key=key_hex, path=entry_dir, size_bytes=None, last_used=None, pinned=False, error=reason
            )
        last, _created = self._last_used(entry_dir, self._clock())
        return EntryDetails(
            key=key_hex,
            path=entry_dir,
            size_bytes=_fs.tree_disk_usage(entry_dir),
            last_used=last,
            pinned=self._is_pinned(key_hex),
            manifest=manifest,
        )

    def stats(self) -> StoreStats:
        """Disk usage of the store plus counters (this object's and all recorded processes')."""
        infos = self.entries() if self._mode != "disabled" else []
        totals: Counter[str] = Counter()
        with contextlib.suppress(OSError):
            for path in self._dir("stats").glob("*.json"):
                with contextlib.suppress(OSError, ValueError, TypeError):
                    data = json.loads(path.read_text(encoding="utf-8"))
                    totals.update({str(k): int(v) for k, v in data.get("counters", {}).items()})

        def _count_dir(name: str, suffix_filter: Callable[[Path], bool]) -> int:
            try:
                return sum(1 for p in self._dir(name).iterdir() if suffix_filter(p))
            except OSError:
                return 0

        with self._counter_lock:
            counters = dict(self._counters)
        return StoreStats(
            root=self._root,
            mode=self._mode,
            entries=len(infos),
            total_bytes=sum(i.size_bytes for i in infos),
            max_size_bytes=self._options.max_size_bytes,
            quarantined=_count_dir("quarantine", lambda p: not p.name.endswith(".json")),
            staging=_count_dir("staging", lambda p: not p.name.startswith(".nfs")),
            counters=MappingProxyType(counters),
            totals=MappingProxyType(dict(totals)),
        )

    def _flush_stats(self) -> None:
        """Record this process's counters under ``v1/stats`` (best effort; never read for decisions)."""
        if self._mode != "readwrite":
            return
        with self._counter_lock:
            counters = dict(self._counters)
        path = self._dir("stats") / f"{HOST_ID}-{os.getpid()}-{id(self):x}.json"
        with contextlib.suppress(OSError):
            _fs.write_json_atomic(path, {"counters": counters, "time": self._clock()}, durable=False)
