"""The on-disk store: staging, validation, atomic publish, lookup and loading.

:class:`ContextStore` is assembled from one part per concern: ``_layout`` (the root and shared state), ``_pins``,
``_listing`` (entries, inspect, stats), ``_verify`` (checks, memo, quarantine), ``_prune`` (eviction, removal, gc)
and ``_packing`` (pack/unpack). This module holds the lookup, build and publish path.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import filelock

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey, canonical_json
from qnnx_ctxcache._layout import (
    DIR_ENV_VAR,
    HOST_ID,
    LAYOUT,
    MODE_ENV_VAR,
    RECACHE_ENV_VAR,
    ROOT_MARKER,
    default_root,
    errname,
    is_key_prefix,
)
from qnnx_ctxcache._manifest import (
    LAST_USED_NAME,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_SCHEMA_VERSION,
    CheckResult,
    collect_files,
    inspect_context_model,
    safe_relpath,
)
from qnnx_ctxcache._options import StoreOptions
from qnnx_ctxcache._packing import _PackingMixin
from qnnx_ctxcache._results import (
    BuildResult,
    Entry,
    EntryDetails,
    EntryInfo,
    PackReport,
    Problem,
    PruneReport,
    StoreStats,
    UnpackReport,
    VerifyReport,
)
from qnnx_ctxcache._verify import VERIFIED, VERIFIED_LOCK, safe_check
from qnnx_ctxcache._version import __version__
from qnnx_ctxcache.errors import BuildOutputError, InvalidOptionsError

__all__ = [
    "DIR_ENV_VAR",
    "MODE_ENV_VAR",
    "RECACHE_ENV_VAR",
    "ROOT_MARKER",
    "BuildResult",
    "ContextStore",
    "Entry",
    "EntryDetails",
    "EntryInfo",
    "PackReport",
    "Problem",
    "PruneReport",
    "StoreOptions",
    "StoreStats",
    "UnpackReport",
    "VerifyReport",
    "default_root",
    "is_key_prefix",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")

_PRIVATE_TMP: list[Path] = []
_OPEN_STORES: weakref.WeakSet[ContextStore] = weakref.WeakSet()


def _cleanup_private_tmp() -> None:
    for store in list(_OPEN_STORES):
        store._flush_stats()
    for path in _PRIVATE_TMP:
        _fs.rmtree_quiet(path)


atexit.register(_cleanup_private_tmp)


class ContextStore(_PackingMixin):
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
        self._root = Path(root).expanduser() if root is not None else default_root()
        self._options = options
        self._clock = clock
        self._base = self._root / LAYOUT
        self._counters: Counter[str] = Counter()
        self._counter_lock = threading.Lock()
        # Keys a caller invalidated that could not be quarantined (read-only root): misses from now on.
        self._bad_keys: set[str] = set()
        self._recache = options.recache or os.environ.get(RECACHE_ENV_VAR, "") == "1"
        self._recached: set[str] = set()
        self._mode = self._open()
        _OPEN_STORES.add(self)

    # ------------------------------------------------------------------ lookup
    def get(self, key: CacheKey, *, full_verify: bool = False) -> Entry | None:
        """Return the valid entry for ``key``, or None on a miss.

        Every hit passes the cheap check; ``full_verify`` (and the first use in this process of an entry
        written elsewhere, when ``verify_on_first_use``) also hashes every file. A bad entry is moved to
        quarantine, counted and reported as a miss, never raised.
        """
        self._check_key(key)
        if self._mode == "disabled":
            self._count("miss:disabled")
            return None
        return self._lookup(key, full=full_verify)

    def _lookup(self, key: CacheKey, *, full: bool = False, count: bool = True) -> Entry | None:
        if key.hex in self._bad_keys:
            if count:
                self._count("miss:invalidated")
            return None
        entry_dir = self.entry_dir(key)
        try:
            st = entry_dir.lstat()
        except FileNotFoundError:
            if count:
                self._count("miss:absent")
            return None
        except OSError as exc:
            self._warn_once("lookup", f"cannot read cache entry {entry_dir}: {exc}")
            if count:
                self._count("miss:unreadable")
            return None
        if not stat.S_ISDIR(st.st_mode):
            self._reject(key.hex, CheckResult("untrusted:not-a-directory", "entry path is not a directory"))
            return None
        if self._mode == "readwrite" and self._crashed_loader(key.hex):
            self._reject(
                key.hex, CheckResult("crashed-loader", "a process died while loading this entry; rebuilding once")
            )
            return None
        memo = self._memo_token(entry_dir)
        with VERIFIED_LOCK:
            known = VERIFIED.get(memo) if memo is not None else None
        need_full = full or (self._options.verify_on_first_use and known is None)
        result = safe_check(entry_dir, key.hex, key.material, full=need_full, known=known)
        if not result.ok:
            self._reject(key.hex, result)
            return None
        if (need_full or known is not None) and memo is not None:
            self._remember_verified(memo, result)
        manifest = result.manifest or {}
        self._touch(entry_dir)
        if count:
            self._count("hit")
        _log.debug("ctxcache hit %s", key.hex[:16])
        return Entry(
            key=key,
            path=entry_dir,
            model_path=entry_dir / str(manifest["model_file"]),
            metadata=manifest.get("metadata") if isinstance(manifest.get("metadata"), dict) else {},
            hit=True,
            persisted=True,
        )

    def _touch(self, entry_dir: Path) -> None:
        if self._mode != "readwrite":
            return  # read-only: nothing under the root is ever written, not even recency
        marker = entry_dir / LAST_USED_NAME
        now = self._clock()
        try:
            last = marker.stat().st_mtime
        except FileNotFoundError:
            last = None
        except OSError:
            return
        if last is not None and 0 <= now - last < self._options.touch_interval_seconds:
            return
        try:
            _fs.fault("before_touch")
            if last is None:
                marker.touch()
            os.utime(marker, (now, now))
        except OSError as exc:  # entry evicted meanwhile, or the disk is read-only now: recency is optional
            _log.debug("could not record use of %s: %s", entry_dir, exc)

    def invalidate(self, key: CacheKey, reason: str) -> None:
        """Quarantine the entry for ``key`` because the caller could not use it.

        Call this when ORT fails to create a session from a hit (e.g. ``INVALID_GRAPH``); the next
        :meth:`get_or_create` rebuilds. A missing entry is not an error.
        """
        self._check_key(key)
        _log.warning("ctxcache entry %s invalidated by caller: %s", key.hex[:16], reason)
        self._count("invalidated")
        if not self._quarantine(key.hex, "invalidated", reason) and self.entry_dir(key).exists():
            self._bad_keys.add(key.hex)

    # ------------------------------------------------------------------ build and publish
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
        self._check_key(key)
        if self._mode == "disabled":
            self._count("miss:disabled")
            return self._build_private(key, build, "disabled")
        if self._recache and key.hex not in self._recached and self._mode == "readwrite":
            self._recached.add(key.hex)
            if self.entry_dir(key).exists():
                self._quarantine(key.hex, "recache", "recache requested")
        entry = self._lookup(key)
        if entry is not None:
            return entry
        if self._mode == "readonly":
            return self._build_private(key, build, "readonly")
        with self._key_lock(key):
            entry = self._lookup(key, count=False)  # another process may have published while we waited
            if entry is not None:
                self._count("hit:after-wait")
                return entry
            return self._build_and_publish(key, build)

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
        entry = self.get_or_create(key, build)
        try:
            return entry, self._load_marked(entry, load)
        except Exception as exc:
            if entry.persisted:
                self.invalidate(key, f"load failed: {type(exc).__name__}: {exc}")
            if not entry.hit:
                raise
        entry = self.get_or_create(key, build)
        try:
            return entry, self._load_marked(entry, load)
        except Exception as exc:
            if entry.persisted:
                self.invalidate(key, f"load failed after rebuild: {type(exc).__name__}: {exc}")
            raise

    def _load_marked(self, entry: Entry, load: Callable[[Entry], T]) -> T:
        # The marker pins the entry while ORT reads it and, if the loader takes the whole process down
        # (a native crash, ORT #23431), tells the next process that this entry killed its last reader.
        if not entry.persisted:
            return load(entry)
        with self._marker(entry.key.hex, ".loading"):
            return load(entry)

    @contextlib.contextmanager
    def pin(self, key: CacheKey) -> Iterator[Entry | None]:
        """Keep the entry for ``key`` from being evicted while the block runs; yields the entry or None.

        QNN reads the context binary during session creation, so pinning until
        ``InferenceSession(...)`` returns is enough there; EPs that map the file need the pin for the
        session's lifetime.
        """
        self._check_key(key)
        with self._marker(key.hex, ".pin"):
            yield self.get(key)

    @contextlib.contextmanager
    def _key_lock(self, key: CacheKey) -> Iterator[None]:
        if not self._options.single_flight:
            yield
            return
        path = self._dir("locks") / f"{key.hex}.lock"
        lock: filelock.BaseFileLock | None
        try:
            lock = filelock.FileLock(str(path), mode=0o600 if self._options.private else 0o664)
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                _log.info(
                    "waiting up to %.0fs for another process compiling %s", self._options.lock_timeout, key.hex[:16]
                )
                lock.acquire(timeout=self._options.lock_timeout)
        except filelock.Timeout:
            self._warn_once("lock-timeout", f"lock wait for {key.hex[:16]} timed out; compiling anyway")
            self._count("lock:timeout")
            lock = None
        except (OSError, NotImplementedError) as exc:  # ENOLCK, EACCES on locks/, no flock on this FS
            self._warn_once("lock", f"cannot lock {path} ({exc}); compiling without single-flight")
            self._count("lock:unavailable")
            lock = None
        try:
            yield
        finally:
            if lock is not None:
                with contextlib.suppress(OSError):
                    lock.release()

    def _build_private(self, key: CacheKey, build: Callable[[Path], BuildResult], reason: str) -> Entry:
        """Build into a private temp dir outside the cache; the entry is not persisted."""
        self._count(f"uncached:{reason.split(':')[0]}")
        tmp = Path(tempfile.mkdtemp(prefix="qnnx-ctxcache-"))
        _PRIVATE_TMP.append(tmp)
        try:
            result = build(tmp)
            model_file, metadata, _contexts = self._validate(tmp, result)
        except BaseException:
            _fs.rmtree_quiet(tmp)
            raise
        return Entry(
            key=key, path=tmp, model_path=tmp / model_file, metadata=metadata, hit=False, persisted=False, reason=reason
        )

    def _validate(self, directory: Path, result: object) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        if not isinstance(result, BuildResult):
            raise TypeError(f"build must return a qnnx_ctxcache.BuildResult, got {type(result).__name__}")
        problems: list[str] = []
        model_file = safe_relpath(result.model_file)
        metadata = dict(result.metadata)
        try:
            json.dumps(metadata, allow_nan=False)
        except (TypeError, ValueError) as exc:
            problems.append(f"BuildResult.metadata is not JSON-able: {exc}")
        contexts: list[dict[str, Any]] = []
        if model_file is None:
            problems.append(f"BuildResult.model_file {result.model_file!r} is not a relative path inside the build dir")
        elif (directory / model_file).is_symlink() or not (directory / model_file).is_file():
            problems.append(f"model file {model_file!r} was not written")
        else:
            contexts, more = inspect_context_model(directory, model_file)
            problems.extend(more)
        if problems:
            raise BuildOutputError(problems)
        assert model_file is not None
        return model_file, metadata, contexts

    def _new_staging(self, key_hex: str) -> Path:
        staging = self._dir("staging") / f"{key_hex}.{HOST_ID}.{os.getpid()}.{_fs.unique_suffix()}"
        staging.mkdir(mode=0o700 if self._options.private else 0o777)
        return staging

    def _build_and_publish(self, key: CacheKey, build: Callable[[Path], BuildResult]) -> Entry:
        if self._options.min_free_bytes:
            try:
                free = shutil.disk_usage(self._base).free
            except OSError:
                free = 0
            if free < self._options.min_free_bytes:
                self._warn_once("low-disk", f"only {free} bytes free under {self._root}; compiling uncached")
                return self._build_private(key, build, "low-disk")
        staging: Path | None = None
        try:
            staging = self._new_staging(key.hex)
            _fs.fault("staging_created")
        except OSError as exc:
            if staging is not None:
                _fs.rmtree_quiet(staging)
            self._warn_once("staging", f"cannot create a staging dir under {self._root} ({exc}); compiling uncached")
            self._count(f"store_skipped:{errname(exc)}")
            return self._build_private(key, build, f"store-failed:{errname(exc)}")
        self._count("build")
        started = time.monotonic()
        try:
            result = build(staging)
        except BaseException:
            self._count("build_failed")
            _fs.rmtree_quiet(staging)
            raise
        seconds = time.monotonic() - started
        try:
            return self._commit(key, staging, result, seconds)
        except OSError as exc:
            self._warn_once(
                f"store:{errname(exc)}", f"could not store a context under {self._root} ({exc}); using it uncached"
            )
            self._count(f"store_skipped:{errname(exc)}")
            return self._rescue(key, staging, result, f"store-failed:{errname(exc)}")
        except BaseException:
            _fs.rmtree_quiet(staging)
            raise

    def _rescue(self, key: CacheKey, staging: Path, result: BuildResult, reason: str) -> Entry:
        """Move a finished build out of staging into a private temp dir so the caller can still use it."""
        with contextlib.suppress(OSError):
            (staging / MANIFEST_NAME).unlink(missing_ok=True)
            (staging / LAST_USED_NAME).unlink(missing_ok=True)
        target = staging
        try:
            tmp = Path(tempfile.mkdtemp(prefix="qnnx-ctxcache-"))
            _PRIVATE_TMP.append(tmp)
            target = Path(shutil.move(str(staging), str(tmp / "entry")))
        except OSError as exc:  # e.g. /tmp is full too: leave it in staging (gc spares live owners)
            _log.debug("could not move %s out of staging: %s", staging, exc)
            _PRIVATE_TMP.append(staging)
        return Entry(
            key=key,
            path=target,
            model_path=target / result.model_file,
            metadata=result.metadata,
            hit=False,
            persisted=False,
            reason=reason,
        )

    def _commit(self, key: CacheKey, staging: Path, result: BuildResult, seconds: float) -> Entry:
        _fs.fault("compile_done")
        model_file, metadata, contexts = self._validate(staging, result)
        if not contexts and self._options.require_ep_context:
            _log.warning(
                "build for %s produced no EPContext node (the EP compiled nothing); not caching it", key.hex[:16]
            )
            self._count("store_skipped:no-ep-context")
            return self._rescue(key, staging, result, "no-ep-context")
        files, problems = collect_files(staging)
        if problems:
            raise BuildOutputError(problems)
        _fs.fault("files_hashed")
        if self._options.durable:
            _fs.fault("before_fsync")
            for item in files:
                _fs.fsync_file(staging / item["path"])
        (staging / LAST_USED_NAME).touch()
        manifest = {
            "format": MANIFEST_FORMAT,
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "key": key.hex,
            "key_material": json.loads(canonical_json(key.material)),
            "hash_algorithm": "sha256",
            "model_file": model_file,
            "files": files,
            "ep_contexts": contexts,
            "metadata": metadata,
            "created": self._clock(),
            "compile_seconds": round(seconds, 6),
            "writer": {"ctxcache": __version__, "host": HOST_ID, "pid": os.getpid()},
        }
        _fs.write_json_atomic(staging / MANIFEST_NAME, manifest, durable=self._options.durable)
        _fs.fault("manifest_written")
        if self._options.durable:
            _fs.fsync_dir(staging)
        size = _fs.tree_disk_usage(staging)
        if size > self._options.max_size_bytes:
            _log.warning(
                "context for %s takes %d bytes, more than max_size_bytes=%d; not caching it",
                key.hex[:16],
                size,
                self._options.max_size_bytes,
            )
            self._count("store_skipped:too-large")
            return self._rescue(key, staging, result, "too-large")
        _fs.fault("before_publish")
        final = self.entry_dir(key)
        self._mkdir(final.parent)
        published = self._publish(key, staging, final)
        if not published:
            # Lost the race: another writer's entry is authoritative (first writer wins).
            existing = self._lookup(key, count=False)
            if existing is not None:
                _fs.rmtree_quiet(staging)
                self._count("store_lost_race")
                return attrs.evolve(existing, hit=False)
            # Something unusable sits at the entry path and could not be moved away: keep our build
            # uncached (the OSError handler rescues it out of staging).
            raise OSError(errno.EEXIST, "entry path is occupied by an invalid entry", str(final))
        self._after_publish(final, key.hex)
        self._count("store")
        self._count("bytes_stored", size)
        _log.info("ctxcache stored %s (%d bytes, compiled in %.2fs)", key.hex[:16], size, seconds)
        self._flush_stats()
        if self._options.auto_prune:
            self._auto_prune(keep=frozenset({key.hex}))
        return Entry(
            key=key,
            path=final,
            model_path=final / model_file,
            metadata=metadata,
            hit=False,
            persisted=True,
        )

    def _after_publish(self, final: Path, key_hex: str) -> None:
        # The entry is published: nothing here may turn this into a failure or an uncached result.
        try:
            if self._options.durable:
                _fs.fsync_dir(final.parent)
            _fs.fault("after_publish")
        except OSError as exc:
            _log.warning("published %s but could not fsync its parent (%s)", key_hex[:16], exc)
        # We hashed these bytes ourselves a moment ago: remember the files' signatures so this process
        # does not hash them again on the next hit (the check itself only stats the files here).
        token = self._memo_token(final)
        if token is not None:
            seen = safe_check(final, key_hex, None, full=False)
            if seen.ok:
                self._remember_verified(token, seen)

    def _publish(self, key: CacheKey, staging: Path, final: Path) -> bool:
        """Rename staging onto ``final``; False when another valid entry is already there."""
        for attempt in range(2):
            try:
                self._rename(staging, final)
                return True
            except OSError as exc:
                exists = exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR) or isinstance(
                    exc, FileExistsError | NotADirectoryError
                )
                if not exists:
                    raise
            if self._lookup(key, count=False) is not None or attempt:
                return False
            # The squatter was invalid and is quarantined now: try once more.
        return False

    @staticmethod
    def _rename(src: Path, dst: Path) -> None:
        if os.name != "nt":
            os.rename(src, dst)  # POSIX: never replaces a non-empty directory
            return
        deadline = time.monotonic() + 1.0
        while True:  # Windows: a reader holding a file open makes rename fail transiently (WinError 5)
            try:
                os.rename(src, dst)
                return
            except PermissionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
