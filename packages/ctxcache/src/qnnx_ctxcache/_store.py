"""The on-disk store: :class:`ContextStore` and the lookup, build and load path it runs.

A store is composed of one part per concern, each in its own module: ``_layout`` (the root, its folders and the
mode), ``_stats`` (counters), ``_pins`` (pins and crash markers), ``_listing`` (entries, inspect, stats),
``_verify`` (checks, the memo, quarantine), ``_lookup`` (the checked lookup), ``_prune`` (eviction, removal, gc),
``_publish`` (staging, build output checks, atomic publish) and ``_packing`` (pack/unpack). ``ContextStore`` holds
them, gives them what each needs of the others, and keeps the public methods.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey
from qnnx_ctxcache._layout import RECACHE_ENV_VAR, Layout, Mode, default_root
from qnnx_ctxcache._options import StoreOptions
from qnnx_ctxcache._pins import Pins, external_hex
from qnnx_ctxcache._stats import Counters
from qnnx_ctxcache.errors import InvalidOptionsError

if TYPE_CHECKING:  # the parts a crash record does not need are imported when first used (see ContextStore)
    import filelock

    from qnnx_ctxcache._listing import Listing
    from qnnx_ctxcache._lookup import Lookup
    from qnnx_ctxcache._packing import Packer
    from qnnx_ctxcache._prune import Pruner
    from qnnx_ctxcache._publish import Publisher
    from qnnx_ctxcache._results import (
        BuildResult,
        Entry,
        EntryDetails,
        EntryInfo,
        PackReport,
        PruneReport,
        StoreStats,
        UnpackReport,
        VerifyReport,
    )
    from qnnx_ctxcache._verify import Verifier

_log = logging.getLogger(__name__)
T = TypeVar("T")

_OPEN_STORES: weakref.WeakSet[ContextStore] = weakref.WeakSet()


def _cleanup_private_tmp() -> None:
    for store in list(_OPEN_STORES):
        store._counters.flush()
    publish = sys.modules.get("qnnx_ctxcache._publish")  # no private folder before a store published anything
    for path in getattr(publish, "PRIVATE_TMP", ()):
        _fs.rmtree_quiet(path)


atexit.register(_cleanup_private_tmp)


def _check_key(key: object) -> None:
    if not isinstance(key, CacheKey):
        raise TypeError(f"key must be a CacheKey from qnnx_ctxcache.make_key(), got {type(key).__name__}")


class ContextStore:
    """A content-addressed store of compiled EP contexts under one root directory.

    Correctness never depends on a lock: every build goes into a private staging directory, is checked,
    described by a manifest with sizes and SHA-256s, and published by one directory rename; the first
    writer wins and published entries are never modified. Locks only avoid duplicate compiles.

    Args:
        root: cache root; default ``$QNNX_CTXCACHE_DIR`` or the per-user cache folder.
        options: behaviour; see :class:`StoreOptions`.
        clock: wall-clock source (seconds since the epoch); a test seam for clock-skew tests.

    Example:
        >>> store = ContextStore(tmp_path)                                     # doctest: +SKIP
        >>> entry = store.get_or_create(key, build)                            # doctest: +SKIP
        >>> session = onnxruntime.InferenceSession(entry.model_path, so)       # doctest: +SKIP
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        options: StoreOptions = StoreOptions(),  # noqa: B008 - frozen, so one shared default is safe
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(options, StoreOptions):
            raise InvalidOptionsError(
                f"options must be a StoreOptions instance, got {type(options).__name__}; "
                "fix: ContextStore(root, options=StoreOptions(...))"
            )
        self._recache = options.recache or os.environ.get(RECACHE_ENV_VAR, "") == "1"
        self._recached: set[str] = set()
        layout = Layout(Path(root).expanduser() if root is not None else default_root(), options, clock)
        self._layout = layout
        self._counters = Counters(layout)
        self._pins = Pins(layout)
        self._parts_lock = threading.RLock()  # a part made while another is made (the lookup needs the verifier)
        _OPEN_STORES.add(self)

    # The other parts are made (and their modules imported) when first used: a process that only reads and writes
    # crash records (guard_load, load_crashed) imports none of them.

    def _part(self, name: str, make: Callable[[], T]) -> T:
        part = self.__dict__.get(name)
        if part is None:
            with self._parts_lock:  # one instance per store, also when threads ask at once
                part = self.__dict__.get(name)
                if part is None:
                    part = self.__dict__[name] = make()
        return part

    @property
    def _listing(self) -> Listing:
        from qnnx_ctxcache._listing import Listing

        return self._part("listing", lambda: Listing(self._layout, self._counters, self._pins))

    @property
    def _verifier(self) -> Verifier:
        from qnnx_ctxcache._verify import Verifier

        return self._part("verifier", lambda: Verifier(self._layout, self._counters, self._listing))

    @property
    def _lookup(self) -> Lookup:
        from qnnx_ctxcache._lookup import Lookup

        return self._part("lookup", lambda: Lookup(self._layout, self._counters, self._pins, self._verifier))

    @property
    def _pruner(self) -> Pruner:
        from qnnx_ctxcache._prune import Pruner

        return self._part("pruner", lambda: Pruner(self._layout, self._counters, self._listing, self._pins))

    @property
    def _publisher(self) -> Publisher:
        from qnnx_ctxcache._publish import Publisher

        return self._part("publisher", lambda: Publisher(self._layout, self._counters, self._lookup, self._pruner))

    @property
    def _packer(self) -> Packer:
        from qnnx_ctxcache._packing import Packer

        return self._part(
            "packer",
            lambda: Packer(
                self._layout, self._counters, self._listing, self._pins, self._lookup, self._publisher, self._pruner
            ),
        )

    @property
    def root(self) -> Path:
        """The cache root directory."""
        return self._layout.root

    @property
    def options(self) -> StoreOptions:
        """The options this store was opened with."""
        return self._layout.options

    @property
    def mode(self) -> Mode:
        """``readwrite``, ``readonly`` or ``disabled`` (decided when the store was opened)."""
        return self._layout.mode

    def entry_dir(self, key: CacheKey | str) -> Path:
        """Where the entry for ``key`` lives (whether or not it exists)."""
        return self._layout.entry_dir(key)

    def entries(self) -> list[EntryInfo]:
        """All published entries (not checked), least recently used first."""
        return self._listing.entries()

    def resolve(self, prefix: str) -> str | None:
        """The full key of the only entry whose key starts with ``prefix`` (at least 4 hex chars)."""
        matches = self._listing.matching(prefix)
        return matches[0] if matches is not None and len(matches) == 1 else None

    def inspect(self, key: CacheKey | str) -> EntryDetails | None:
        """The manifest of an entry plus its disk size, last use and pin state, or None if absent.

        A damaged entry (its manifest missing or unreadable) comes back with ``error`` set, never raised.
        """
        return self._listing.inspect(key)

    def stats(self) -> StoreStats:
        """Disk usage of the store plus counters (this object's and all recorded processes')."""
        return self._listing.stats()

    @contextlib.contextmanager
    def guard_load(self, name: str) -> Iterator[None]:
        """Mark that this process is loading ``name`` for the duration of the block.

        ``name`` stands for a compiled context that is not an entry of this store (one shipped with an application,
        or saved with a model); pick a name that changes with its content, such as its SHA-256. If the process dies
        inside the block (a native crash in the execution provider), :meth:`load_crashed` answers True for ``name``
        in every later process on this host, so the caller can stop feeding ONNX Runtime a context that kills it.
        Best effort: nothing is marked in a read-only or disabled store.
        """
        with self._pins.marker(external_hex(name), ".loading"):
            yield

    def load_crashed(self, name: str) -> bool:
        """Whether a process on this host died inside :meth:`guard_load` for ``name``.

        Remembered (under ``crashes/``) until :meth:`clear`: a context that crashed a process once is not tried
        again by a later one.
        """
        return self._pins.load_crashed(name)

    def verify(self, *, full: bool = False, fix: bool = False) -> VerifyReport:
        """Check every entry (cheap check, or SHA-256 of every file with ``full``); never raises.

        Args:
            full: hash every file (detects overwritten bytes that keep the size).
            fix: move bad entries to quarantine.
        """
        return self._verifier.verify(full, fix)

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
        return self._pruner.prune(max_size_bytes, min_age_seconds, dry_run)

    def remove(self, key: CacheKey | str) -> bool:
        """Delete one entry (rename to trash, then delete). Returns False when it was not there."""
        return self._pruner.remove(key)

    def clear(self) -> int:
        """Delete every entry, staging dir, quarantine, lock and crash record of this store; returns entries removed.

        Raises:
            NotACacheRootError: the root has no ``ctxcache-root.json`` marker (never wipe a user folder).
        """
        return self._pruner.clear()

    def pack(
        self,
        archive_path: str | os.PathLike[str],
        keys: Iterable[CacheKey | str] | None = None,
        *,
        compression: str = "auto",
    ) -> PackReport:
        """Write entries into one archive, to install them on other machines with :meth:`unpack`.

        Each chosen entry is pinned (a concurrent prune cannot remove it) and fully checked (SHA-256 of every
        file) while it is read; a bad entry is left out and reported in ``skipped``, never packed. Reading
        changes nothing in the cache, not even last-use times. The archive is written to a temp file beside
        ``archive_path`` and renamed onto it: no half-written archive ever carries the final name.

        Args:
            archive_path: the tar file to write (replaced if it exists).
            keys: entries to pack, as ``CacheKey`` objects, full keys or unique prefixes (>= 4 hex digits);
                None packs every entry.
            compression: ``auto`` (gzip when the name ends in ``.gz`` or ``.tgz``), ``gz`` or ``none``.

        Raises:
            EntryNotFoundError: a key or prefix names no single entry (nothing is written).
            InvalidOptionsError: ``compression`` is not one of the accepted values.
            OSError: the archive cannot be written (nothing is left under its name).
        """
        return self._packer.pack(archive_path, keys, compression)

    def unpack(self, archive_path: str | os.PathLike[str]) -> UnpackReport:
        """Install the entries of an archive written by :meth:`pack`, checking everything before publishing.

        Before anything is published: the archive manifest must be well formed, of a known format version and
        intact; every member must be a regular file with a plain relative name that the manifest lists, appearing
        once, with the listed size and SHA-256 (tar path traversal is impossible: nothing else is written); and
        every entry must pass the same check as a lookup, with every file hashed and its key recomputed from its
        key material. Then each entry is published like a build (staging directory, one rename, first writer
        wins); an entry the cache already has is kept and reported in ``already_present``. Entries compiled for
        another target or runtime version are installed as they are: a lookup here uses this machine's key and
        never returns them.

        Raises:
            ArchiveError: the archive is unreadable, truncated, damaged, tampered with or unsafe; nothing was
                added to the cache.
            StoreNotWritableError: the store is not read-write.
            OSError: writing into the cache failed (e.g. ENOSPC); nothing half-written is visible.
        """
        return self._packer.unpack(archive_path)

    # ------------------------------------------------------------------ lookup
    def get(self, key: CacheKey, *, full_verify: bool = False) -> Entry | None:
        """Return the valid entry for ``key``, or None on a miss.

        Every hit passes the cheap check; ``full_verify`` (and the first use in this process of an entry
        written elsewhere, when ``verify_on_first_use``) also hashes every file. A bad entry is moved to
        quarantine, counted and reported as a miss, never raised.
        """
        _check_key(key)
        if self.mode == "disabled":
            self._counters.count("miss:disabled")
            return None
        return self._lookup.find(key, full=full_verify)

    def invalidate(self, key: CacheKey, reason: str) -> None:
        """Quarantine the entry for ``key`` because the caller could not use it.

        Call this when ORT fails to create a session from a hit (e.g. ``INVALID_GRAPH``); the next
        :meth:`get_or_create` rebuilds. A missing entry is not an error.
        """
        _check_key(key)
        _log.warning("ctxcache entry %s invalidated by caller: %s", key.hex[:16], reason)
        self._counters.count("invalidated")
        if not self._verifier.quarantine(key.hex, "invalidated", reason) and self.entry_dir(key).exists():
            self._lookup.bad_keys.add(key.hex)

    # ------------------------------------------------------------------ build and load
    def get_or_create(self, key: CacheKey, build: Callable[[Path], BuildResult]) -> Entry:
        """Return the entry for ``key``, calling ``build`` to compile it on a miss.

        ``build(staging_dir)`` must write the context model and every file it references into
        ``staging_dir`` (a fresh, empty, existing directory) and return a :class:`BuildResult`. The
        store validates the output, records sizes and SHA-256s in a manifest and publishes the entry
        with one rename. When the root is unusable the build runs in a private temp dir and the entry
        comes back with ``persisted=False``: the compile never fails because of the cache.

        Raises:
            BuildOutputError: the build's model or a file it references is missing, empty or outside
                the staging directory (nothing is stored).
            Exception: anything ``build`` raises propagates unchanged; its staging dir is removed.
        """
        _check_key(key)
        if self.mode == "disabled":
            self._counters.count("miss:disabled")
            return self._publisher.build_private(key, build, "disabled")
        if self._recache and key.hex not in self._recached and self.mode == "readwrite":
            self._recached.add(key.hex)
            if self.entry_dir(key).exists():
                self._verifier.quarantine(key.hex, "recache", "recache requested")
        entry = self._lookup.find(key)
        if entry is not None:
            return entry
        if self.mode == "readonly":
            return self._publisher.build_private(key, build, "readonly")
        with self._key_lock(key):
            entry = self._lookup.find(key, count=False)  # another process may have published while we waited
            if entry is not None:
                self._counters.count("hit:after-wait")
                return entry
            return self._publisher.build_and_publish(key, build)

    def load_or_rebuild(
        self, key: CacheKey, build: Callable[[Path], BuildResult], load: Callable[[Entry], T]
    ) -> tuple[Entry, T]:
        """``get_or_create`` then ``load(entry)``; a hit that fails to load is quarantined and rebuilt once.

        If the rebuilt entry also fails to load, or a fresh build fails to load, the entry is
        invalidated and the loader's exception propagates: it is a real error, not a cache problem.
        While ``load`` runs, a ``.loading`` marker pins the entry; if the process dies inside ``load``
        (a native crash in the EP), the next lookup on this host sees the orphaned marker, quarantines
        the entry (reason ``crashed-loader``) and rebuilds, so a poisoned entry cannot crash every run.
        """
        for rebuilt in (False, True):
            entry = self.get_or_create(key, build)
            try:
                return entry, self._load_marked(entry, load)
            except Exception as exc:
                if entry.persisted:
                    after = " after rebuild" if rebuilt else ""
                    self.invalidate(key, f"load failed{after}: {type(exc).__name__}: {exc}")
                if rebuilt or not entry.hit:
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _load_marked(self, entry: Entry, load: Callable[[Entry], T]) -> T:
        # The marker pins the entry while ORT reads it and, if the loader takes the whole process down
        # (a native crash, ORT #23431), tells the next process that this entry killed its last reader.
        if not entry.persisted:
            return load(entry)
        with self._pins.marker(entry.key.hex, ".loading"):
            return load(entry)

    @contextlib.contextmanager
    def pin(self, key: CacheKey) -> Iterator[Entry | None]:
        """Keep the entry for ``key`` from being evicted while the block runs; yields the entry or None.

        QNN reads the context binary during session creation, so pinning until
        ``InferenceSession(...)`` returns is enough there; EPs that map the file need the pin for the
        session's lifetime.
        """
        _check_key(key)
        with self._pins.marker(key.hex, ".pin"):
            yield self.get(key)

    @contextlib.contextmanager
    def _key_lock(self, key: CacheKey) -> Iterator[None]:
        options = self.options
        if not options.single_flight:
            yield
            return
        import filelock  # here, not at import: only a build takes the lock

        path = self._layout.folder("locks") / f"{key.hex}.lock"
        lock: filelock.BaseFileLock | None
        try:
            lock = filelock.FileLock(str(path), mode=0o600 if options.private else 0o664)
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                _log.info("waiting up to %.0fs for another process compiling %s", options.lock_timeout, key.hex[:16])
                lock.acquire(timeout=options.lock_timeout)
        except filelock.Timeout:
            self._layout.warn_once("lock-timeout", f"lock wait for {key.hex[:16]} timed out; compiling anyway")
            self._counters.count("lock:timeout")
            lock = None
        except (OSError, NotImplementedError) as exc:  # ENOLCK, EACCES on locks/, no flock on this FS
            self._layout.warn_once("lock", f"cannot lock {path} ({exc}); compiling without single-flight")
            self._counters.count("lock:unavailable")
            lock = None
        with _fs.releasing(*((lock.release,) if lock is not None else ())):
            yield
