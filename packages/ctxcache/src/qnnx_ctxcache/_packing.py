"""Shipping entries between machines: ``pack`` into one archive, ``unpack`` it into another cache."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey, host_material
from qnnx_ctxcache._listing import Listing
from qnnx_ctxcache._lookup import Lookup
from qnnx_ctxcache._manifest import LAST_USED_NAME, MANIFEST_NAME, CheckResult
from qnnx_ctxcache._part import StorePart
from qnnx_ctxcache._pins import Pins
from qnnx_ctxcache._prune import Pruner
from qnnx_ctxcache._publish import Publisher
from qnnx_ctxcache._results import PackReport, Problem, UnpackReport
from qnnx_ctxcache._verify import check_dir, safe_check
from qnnx_ctxcache.errors import ArchiveError, EntryNotFoundError, StoreNotWritableError

if TYPE_CHECKING:
    from qnnx_ctxcache._archive import ArchiveContents

_log = logging.getLogger(__name__)


@attrs.define(eq=False)
class Packer(StorePart):
    """``pack`` and ``unpack``; an unpacked entry is published like a build."""

    _listing: Listing
    _pins: Pins
    _lookup: Lookup
    _publisher: Publisher
    _pruner: Pruner

    def pack(
        self, archive_path: str | os.PathLike[str], keys: Iterable[CacheKey | str] | None, compression: str
    ) -> PackReport:
        from qnnx_ctxcache import _archive  # deferred: importing the package must stay cheap

        target = Path(archive_path)
        gz = _archive.wants_gzip(target, compression)
        chosen = self._select(keys)
        items: list[_archive.PackItem] = []
        skipped: list[Problem] = []
        with contextlib.ExitStack() as pins:
            for key_hex in chosen:
                pins.enter_context(self._pins.marker(key_hex, ".pin"))
                path = self._layout.entry_dir(key_hex)
                result = check_dir(path, key_hex, full=True)
                try:
                    manifest_bytes = (path / MANIFEST_NAME).read_bytes() if result.ok else b""
                except OSError as exc:
                    result = CheckResult("corrupt:unreadable", str(exc))
                if not result.ok:
                    skipped.append(Problem(key=key_hex, reason=result.reason, detail=result.detail))
                    continue
                assert result.manifest is not None
                items.append(
                    _archive.PackItem(
                        key=key_hex, entry_dir=path, manifest_bytes=manifest_bytes, manifest=result.manifest
                    )
                )
            size, digest = _archive.write_archive(
                target, items, created=self._layout.clock(), gz=gz, durable=self._layout.options.durable
            )
        _log.info("ctxcache packed %d entries into %s (%d bytes)", len(items), target, size)
        return PackReport(
            archive=target,
            entries=tuple(item.key for item in items),
            skipped=tuple(skipped),
            size_bytes=size,
            sha256=digest,
            compression="gz" if gz else "none",
        )

    def _select(self, keys: Iterable[CacheKey | str] | None) -> list[str]:
        """The full keys ``pack`` was asked for, in order and without repeats."""
        if keys is None:
            return [key_hex for key_hex, _ in self._listing.entry_dirs()]
        if isinstance(keys, str | CacheKey):
            keys = [keys]
        chosen: list[str] = []
        for item in keys:
            text = item.hex if isinstance(item, CacheKey) else item
            if not isinstance(text, str):
                raise TypeError(f"keys must hold CacheKey objects or key strings, got {type(item).__name__}")
            matches = self._listing.matching(text)
            if matches is None or len(matches) != 1:
                raise EntryNotFoundError(text, str(self._layout.root), None if matches is None else len(matches))
            if matches[0] not in chosen:
                chosen.append(matches[0])
        return chosen

    def unpack(self, archive_path: str | os.PathLike[str]) -> UnpackReport:
        from qnnx_ctxcache import _archive  # deferred: importing the package must stay cheap

        layout = self._layout
        if layout.mode != "readwrite":
            raise StoreNotWritableError(str(layout.root), layout.mode)
        archive = Path(archive_path)
        staged: dict[str, Path] = {}

        def staging_for(key_hex: str) -> Path:
            if key_hex not in staged:
                staged[key_hex] = self._publisher.new_staging(key_hex)
            return staged[key_hex]

        try:
            contents = _archive.extract_archive(
                archive, staging_for, dest_root=layout.folder("staging"), durable=layout.options.durable
            )
            manifests = [self._check_unpacked(archive, record, staged[record["key"]]) for record in contents.records]
            return self._publish_unpacked(archive, contents, manifests, staged)
        finally:
            for path in staged.values():
                _fs.rmtree_quiet(path)  # published entries were renamed away; this removes only the rest

    def _check_unpacked(self, archive: Path, record: Mapping[str, Any], staging: Path) -> Mapping[str, Any]:
        """Check one extracted entry like a published one, and make it look like one; returns its manifest."""
        from qnnx_ctxcache import _archive

        key_hex = record["key"]
        result = safe_check(staging, key_hex, None, full=True)
        problem = f"{result.reason}: {result.detail}" if not result.ok else ""
        if not problem:
            assert result.manifest is not None
            problem = _archive.entry_mismatch(record, result.manifest)
        if problem:
            raise ArchiveError(str(archive), f"entry {key_hex} is not a valid cache entry ({problem})")
        assert result.manifest is not None
        for item in result.manifest["files"]:
            # Give each file the mtime the build host recorded, as a published entry has: cheap checks then
            # need not hash it again.
            if isinstance(item.get("mtime_ns"), int):
                with contextlib.suppress(OSError, OverflowError, ValueError):
                    os.utime(staging / item["path"], ns=(item["mtime_ns"], item["mtime_ns"]))
        (staging / LAST_USED_NAME).touch()
        if self._layout.options.durable:
            _fs.fsync_dir(staging)
        return result.manifest

    def _publish_unpacked(
        self, archive: Path, contents: ArchiveContents, manifests: list[Mapping[str, Any]], staged: Mapping[str, Path]
    ) -> UnpackReport:
        added: list[str] = []
        present: list[str] = []
        skipped: list[Problem] = []
        other_host: list[str] = []
        here = host_material()
        layout = self._layout
        for manifest in manifests:
            key = CacheKey(manifest["key"], MappingProxyType(manifest["key_material"]))
            staging = staged[key.hex]
            size = _fs.tree_disk_usage(staging)
            if size > layout.options.max_size_bytes:
                limit = layout.options.max_size_bytes
                skipped.append(
                    Problem(key=key.hex, reason="too-large", detail=f"{size} bytes > max_size_bytes={limit}")
                )
                continue
            final = layout.entry_dir(key)
            layout.mkdir(final.parent)
            if self._publisher.publish(key, staging, final):
                self._publisher.after_publish(final, key.hex)
                added.append(key.hex)
            elif self._lookup.find(key, count=False) is not None:
                present.append(key.hex)
            else:
                detail = "an unusable entry sits at its path and could not be moved to quarantine"
                skipped.append(Problem(key=key.hex, reason="occupied", detail=detail))
                continue
            if key.material.get("host") != here:
                other_host.append(key.hex)
        if added:
            self._counters.count("unpacked", len(added))
            self._counters.flush()
        _log.info(
            "ctxcache unpacked %s: %d added, %d already present, %d skipped",
            archive, len(added), len(present), len(skipped),
        )  # fmt: skip
        if added and layout.options.auto_prune:
            self._pruner.auto_prune(keep=frozenset(added))
        return UnpackReport(
            archive=archive,
            added=tuple(added),
            already_present=tuple(present),
            skipped=tuple(skipped),
            other_host=tuple(other_host),
            packed_by=contents.packed_by,
            created=contents.created,
        )
