"""The frozen results of a :class:`~qnnx_ctxcache.ContextStore`: entries, reports and stats."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey


def _frozen_metadata(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen(kw_only=True)
class BuildResult:
    """What a build callback returns.

    Attributes:
        model_file: the context model it wrote, relative to the staging directory.
        metadata: JSON-able data stored in the manifest and handed back on every hit
            (e.g. input/output names the caller needs without parsing the model).
    """

    model_file: str = "model_ctx.onnx"
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_metadata)


@attrs.frozen(kw_only=True)
class Entry:
    """A usable compiled context.

    Attributes:
        key: the key it was stored or looked up under.
        path: the entry directory (inside the cache, or a private temp dir when not persisted).
        model_path: the context model to hand to ``onnxruntime.InferenceSession``.
        metadata: the ``BuildResult.metadata`` stored with it.
        hit: True when served from the cache without calling the build.
        persisted: False when the store could not keep it (read-only/disabled/full root, too large,
            no EPContext node); the files then live in a private temp dir until :meth:`release` or exit.
        reason: why it is not persisted (empty when it is), e.g. ``readonly`` or ``store-failed:ENOSPC``.
    """

    key: CacheKey
    path: Path
    model_path: Path
    metadata: Mapping[str, Any] = attrs.field(converter=_frozen_metadata)
    hit: bool
    persisted: bool
    reason: str = ""

    def release(self) -> None:
        """Delete the private files of an entry that was not persisted; no-op for cached entries."""
        if not self.persisted:
            _fs.rmtree_quiet(self.path)


@attrs.frozen(kw_only=True)
class EntryInfo:
    """One published entry as listed by :meth:`ContextStore.entries`."""

    key: str
    path: Path
    size_bytes: int
    last_used: float
    created: float
    pinned: bool


@attrs.frozen(kw_only=True)
class EntryDetails:
    """One entry as shown by :meth:`ContextStore.inspect`: its manifest plus disk size, last use and pin state.

    Attributes:
        key: the entry's key (as asked for).
        path: the entry directory.
        size_bytes: disk bytes of the entry (None when ``error`` is set).
        last_used: last use, seconds since the epoch (None when ``error`` is set).
        pinned: whether a reader pins it.
        manifest: the manifest as stored (empty when ``error`` is set).
        error: why the manifest could not be read, e.g. ``manifest:invalid-json`` (empty for a readable entry).
    """

    key: str
    path: Path
    size_bytes: int | None
    last_used: float | None
    pinned: bool
    manifest: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_metadata)
    error: str = ""

    @property
    def key_material(self) -> Mapping[str, Any] | None:
        """The key material recorded in the manifest (None when absent or not an object)."""
        material = self.manifest.get("key_material")
        return material if isinstance(material, Mapping) else None

    @property
    def model_file(self) -> str | None:
        """The context model, relative to ``path``, as the manifest names it."""
        name = self.manifest.get("model_file")
        return name if isinstance(name, str) else None

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The ``BuildResult.metadata`` stored with the entry."""
        data = self.manifest.get("metadata")
        return data if isinstance(data, Mapping) else {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict ``inspect`` returned before 0.3: the manifest's fields plus ``path``, ``size_bytes``,
        ``last_used`` and ``pinned``; ``{"key", "error"}`` for a damaged entry."""
        if self.error:
            return {"key": self.key, "error": self.error}
        return {
            **self.manifest,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "last_used": self.last_used,
            "pinned": self.pinned,
        }


@attrs.frozen(kw_only=True)
class Problem:
    """One bad or skipped entry: found by :meth:`ContextStore.verify`, left out by ``pack`` or ``unpack``.

    Attributes:
        key: the entry's key (hex).
        reason: what is wrong, as a code: from ``verify`` and ``pack`` its kind and what failed, e.g.
            ``corrupt:checksum``, ``manifest:key`` or ``untrusted:path``; from ``unpack`` ``too-large`` or ``occupied``.
        detail: the specifics, for a person, e.g. ``'model_ctx.onnx' is missing``.
    """

    key: str
    reason: str
    detail: str


@attrs.frozen(kw_only=True)
class VerifyReport:
    """Result of :meth:`ContextStore.verify`.

    Attributes:
        checked: number of entries checked.
        full: whether every file was hashed.
        problems: every bad entry (all of them, not the first).
        quarantined: keys moved to quarantine (only with ``fix=True``).
        junk: names under ``entries/`` that are not entries (reported, never deleted).
    """

    checked: int
    full: bool
    problems: tuple[Problem, ...]
    quarantined: tuple[str, ...]
    junk: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@attrs.frozen(kw_only=True)
class PruneReport:
    """Result of :meth:`ContextStore.prune`.

    Attributes:
        removed: keys evicted (or that would be, with ``dry_run``).
        freed_bytes: disk bytes those entries occupied.
        total_bytes_before: size of all entries before pruning.
        total_bytes_after: size after pruning (estimated with ``dry_run``).
        kept_pinned: keys over the limit kept because a reader pinned them.
        kept_young: keys over the limit kept because of the grace period.
        cleaned: stale staging dirs, trash, quarantine, pins and lock files removed.
        skipped: True when another process was already pruning (nothing was done).
        dry_run: whether anything was deleted.
    """

    removed: tuple[str, ...]
    freed_bytes: int
    total_bytes_before: int
    total_bytes_after: int
    kept_pinned: tuple[str, ...]
    kept_young: tuple[str, ...]
    cleaned: int
    skipped: bool
    dry_run: bool


@attrs.frozen(kw_only=True)
class PackReport:
    """Result of :meth:`ContextStore.pack`.

    Attributes:
        archive: the archive written.
        entries: keys packed, in archive order.
        skipped: chosen entries left out because they failed the full check (a bad entry is never packed).
        size_bytes: size of the archive file.
        sha256: SHA-256 of the archive file; ship it beside the archive to check the copy.
        compression: ``gz`` or ``none``.
    """

    archive: Path
    entries: tuple[str, ...]
    skipped: tuple[Problem, ...]
    size_bytes: int
    sha256: str
    compression: Literal["gz", "none"]


@attrs.frozen(kw_only=True)
class UnpackReport:
    """Result of :meth:`ContextStore.unpack`.

    Attributes:
        archive: the archive read.
        added: keys published into this cache.
        already_present: keys this cache already had (a valid entry is never replaced).
        skipped: entries not installed, with the reason: ``too-large`` (over ``max_size_bytes``) or
            ``occupied`` (an unusable entry sits at its path and could not be moved to quarantine).
        other_host: keys added or present whose key material names another host OS or CPU than this machine:
            ``make_key`` here never produces those keys, so lookups here never return those entries.
        packed_by: the qnnx-ctxcache version that wrote the archive.
        created: when it was packed (seconds since the epoch).
    """

    archive: Path
    added: tuple[str, ...]
    already_present: tuple[str, ...]
    skipped: tuple[Problem, ...]
    other_host: tuple[str, ...]
    packed_by: str
    created: float


@attrs.frozen(kw_only=True)
class StoreStats:
    """Sizes on disk plus this process's counters.

    Attributes:
        root: the cache root.
        mode: ``readwrite``, ``readonly`` or ``disabled``.
        entries: number of published entries.
        total_bytes: disk bytes of all entries.
        max_size_bytes: the configured cap.
        quarantined: entries waiting in quarantine.
        staging: staging dirs present (builds in progress or crashed).
        counters: this store object's counters (hits, misses by reason, stores, skipped stores...).
        totals: counters summed over every process that recorded stats under this root.
    """

    root: Path
    mode: str
    entries: int
    total_bytes: int
    max_size_bytes: int
    quarantined: int
    staging: int
    counters: Mapping[str, int]
    totals: Mapping[str, int]
