"""Listing entries, looking one up by prefix, inspecting it, and the store's stats."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey
from qnnx_ctxcache._layout import FUTURE_TOLERANCE, HEX2, HEX64, is_key_prefix
from qnnx_ctxcache._manifest import LAST_USED_NAME, MANIFEST_NAME, read_manifest
from qnnx_ctxcache._part import StorePart
from qnnx_ctxcache._pins import Pins
from qnnx_ctxcache._results import EntryDetails, EntryInfo, StoreStats


@attrs.define(eq=False)
class Listing(StorePart):
    """What the cache holds: entries, their details and sizes, and the counters of this and other processes."""

    _pins: Pins

    def entry_dirs(self) -> Iterator[tuple[str, Path]]:
        """(key, directory) of every published entry, in key order; names that are not entries are passed over."""
        base = self._layout.folder("entries")
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

    def junk(self) -> list[str]:
        """Names under ``entries/`` that are not entries."""
        junk: list[str] = []
        base = self._layout.folder("entries")
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

    def last_used(self, entry_dir: Path, now: float) -> tuple[float, float]:
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
            if self._layout.mode == "readwrite":
                with contextlib.suppress(OSError):
                    os.utime(entry_dir / LAST_USED_NAME, (now, now))
            last = now
        return min(last, now), min(created, now)

    def entries(self) -> list[EntryInfo]:
        now = self._layout.clock()
        infos = []
        for key_hex, path in self.entry_dirs():
            last, created = self.last_used(path, now)
            infos.append(
                EntryInfo(
                    key=key_hex,
                    path=path,
                    size_bytes=_fs.tree_disk_usage(path),
                    last_used=last,
                    created=created,
                    pinned=self._pins.is_pinned(key_hex),
                )
            )
        infos.sort(key=lambda e: (e.last_used, e.key))
        return infos

    def matching(self, prefix: str) -> list[str] | None:
        """Keys of the entries that start with ``prefix``; None when it is not a hex prefix of >= 4 digits."""
        if not is_key_prefix(prefix):
            return None
        prefix = prefix.lower()
        return [k for k, _ in self.entry_dirs() if k.startswith(prefix)]

    def inspect(self, key: CacheKey | str) -> EntryDetails | None:
        key_hex = key.hex if isinstance(key, CacheKey) else key
        if not HEX64.match(key_hex):
            return None
        entry_dir = self._layout.entry_dir(key_hex)
        manifest, reason = read_manifest(entry_dir)
        if manifest is None:
            if reason == "manifest:missing" and not entry_dir.exists():
                return None
            return EntryDetails(
                key=key_hex, path=entry_dir, size_bytes=None, last_used=None, pinned=False, error=reason
            )
        last, _created = self.last_used(entry_dir, self._layout.clock())
        return EntryDetails(
            key=key_hex,
            path=entry_dir,
            size_bytes=_fs.tree_disk_usage(entry_dir),
            last_used=last,
            pinned=self._pins.is_pinned(key_hex),
            manifest=manifest,
        )

    def stats(self) -> StoreStats:
        layout = self._layout
        infos = self.entries() if layout.mode != "disabled" else []
        totals = self._counters.totals()

        def _count_dir(name: str, suffix_filter: Callable[[Path], bool]) -> int:
            try:
                return sum(1 for p in layout.folder(name).iterdir() if suffix_filter(p))
            except OSError:
                return 0

        return StoreStats(
            root=layout.root,
            mode=layout.mode,
            entries=len(infos),
            total_bytes=sum(i.size_bytes for i in infos),
            max_size_bytes=layout.options.max_size_bytes,
            quarantined=_count_dir("quarantine", lambda p: not p.name.endswith(".json")),
            staging=_count_dir("staging", lambda p: not p.name.startswith(".nfs")),
            counters=MappingProxyType(self._counters.snapshot()),
            totals=MappingProxyType(totals),
        )
