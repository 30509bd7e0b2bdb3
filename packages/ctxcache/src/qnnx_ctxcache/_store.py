"""The on-disk store: staging, validation, atomic publish, lookup, quarantine, pins and eviction."""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs
import filelock

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey, canonical_json, host_material
from qnnx_ctxcache._manifest import (
    LAST_USED_NAME,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_SCHEMA_VERSION,
    CheckResult,
    Signature,
    check_entry,
    collect_files,
    inspect_context_model,
    safe_relpath,
)
from qnnx_ctxcache._version import __version__
from qnnx_ctxcache.errors import (
    ArchiveError,
    BuildOutputError,
    EntryNotFoundError,
    InvalidOptionsError,
    NotACacheRootError,
    StoreNotWritableError,
)

if TYPE_CHECKING:
    from qnnx_ctxcache._archive import ArchiveContents

__all__ = [
    "DIR_ENV_VAR",
    "MODE_ENV_VAR",
    "RECACHE_ENV_VAR",
    "BuildResult",
    "ContextStore",
    "Entry",
    "EntryInfo",
    "PackReport",
    "Problem",
    "PruneReport",
    "StoreOptions",
    "StoreStats",
    "UnpackReport",
    "VerifyReport",
    "default_root",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: Overrides the default cache root (an explicit ``root`` argument wins over it).
DIR_ENV_VAR = "QNNX_CTXCACHE_DIR"
#: Forces a mode when ``StoreOptions.mode`` is ``"auto"``: ``readwrite``, ``readonly`` or ``disabled``.
MODE_ENV_VAR = "QNNX_CTXCACHE_MODE"
#: ``1`` acts like ``StoreOptions(recache=True)``.
RECACHE_ENV_VAR = "QNNX_CTXCACHE_RECACHE"

ROOT_MARKER = "ctxcache-root.json"
ROOT_FORMAT = "qnnx-ctxcache-root"
LAYOUT = "v1"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX2 = re.compile(r"^[0-9a-f]{2}$")
_CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by qnnx-ctxcache.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
_MODES = ("auto", "readwrite", "readonly", "disabled")
Mode = Literal["readwrite", "readonly", "disabled"]
_HOST_ID = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]
_FOREIGN_MAX_AGE = 24 * 3600.0  # staging/pins of another host (or a reused PID) expire after a day
_FUTURE_TOLERANCE = 300.0  # timestamps this far in the future are clock skew, not recent use

# Entries this process has verified (full SHA-256), keyed by (entry dir, manifest inode, size, mtime_ns,
# ctime_ns), with the signature of every file at that moment. A hit whose files still have those
# signatures needs no hashing; any change (even a rewrite with the old mtime restored) is hashed again.
_VERIFIED: dict[tuple[str, int, int, int, int], dict[str, Signature]] = {}
_VERIFIED_LOCK = threading.Lock()
_WARNED: set[tuple[str, str]] = set()
_PRIVATE_TMP: list[Path] = []
_OPEN_STORES: weakref.WeakSet[ContextStore] = weakref.WeakSet()


def default_root() -> Path:
    """The cache root used when none is given: ``$QNNX_CTXCACHE_DIR`` or the per-user cache folder."""
    env = os.environ.get(DIR_ENV_VAR)
    if env:
        return Path(env).expanduser()
    import platformdirs  # deferred: only needed when no root is given

    return Path(platformdirs.user_cache_dir("qnnx-ctxcache", appauthor=False))


def is_key_prefix(text: str) -> bool:
    """True for a full key or a key prefix: at least 4 hex digits (either case)."""
    return len(text) >= 4 and re.fullmatch(r"[0-9a-fA-F]+", text) is not None


def _positive(name: str, allow_zero: bool = True) -> Callable[[Any, Any, Any], None]:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (value >= 0)
        if ok and not allow_zero:
            ok = value > 0
        if not ok:
            bound = ">= 0" if allow_zero else "> 0"
            raise InvalidOptionsError(f"StoreOptions.{name} must be a number {bound}, got {value!r}")

    return check


def _mode_check(_inst: Any, _attr: Any, value: Any) -> None:
    if value not in _MODES:
        raise InvalidOptionsError(f"StoreOptions.mode must be one of {_MODES}, got {value!r}")


@attrs.frozen(kw_only=True)
class StoreOptions:
    """How a :class:`ContextStore` behaves. All fields are keyword-only.

    Attributes:
        max_size_bytes: size cap of all entries, counted in allocated disk blocks. Eviction (automatic
            after a store, or ``prune``) removes least recently used entries until the total fits.
            An entry larger than the cap is never stored (the build result is returned uncached).
        lock_timeout: seconds to wait for another process compiling the same key; then compile anyway.
        verify_on_first_use: hash every file (SHA-256) the first time this process uses an entry it did
            not write. The cheap check (sizes, paths, mtimes) runs on every hit regardless.
        min_age_seconds: grace period: entries used or created this recently are never evicted.
        stale_after_seconds: staging dirs, trash and quarantine older than this are removed by gc.
        touch_interval_seconds: a hit refreshes the entry's last-use time at most this often.
        durable: fsync files and directories before and after publishing.
        auto_prune: run eviction after a store that pushed the total over ``max_size_bytes``.
        mode: ``auto`` (probe the root; ``$QNNX_CTXCACHE_MODE`` may force a mode), ``readwrite``,
            ``readonly`` (serve hits, build misses uncached, write nothing) or ``disabled``.
        min_free_bytes: when the root's filesystem has less free space, build uncached in a temp dir.
        require_ep_context: a build whose model has no EPContext node (the EP compiled nothing) is
            returned uncached instead of stored.
        private: create directories with mode 0o700 (a per-user cache); ``False`` leaves it to the umask.
        single_flight: take a per-key file lock so concurrent misses compile once. Turning it off
            only costs duplicate compiles; correctness never depends on the lock.
        recache: the first ``get_or_create`` of each key by this store quarantines the existing entry and
            compiles again (``$QNNX_CTXCACHE_RECACHE=1`` does the same), e.g. after a suspected bad binary.
    """

    max_size_bytes: int = attrs.field(default=10 * 2**30, validator=_positive("max_size_bytes"))
    lock_timeout: float = attrs.field(default=600.0, validator=_positive("lock_timeout"))
    verify_on_first_use: bool = True
    min_age_seconds: float = attrs.field(default=600.0, validator=_positive("min_age_seconds"))
    stale_after_seconds: float = attrs.field(default=3600.0, validator=_positive("stale_after_seconds"))
    touch_interval_seconds: float = attrs.field(default=60.0, validator=_positive("touch_interval_seconds"))
    durable: bool = True
    auto_prune: bool = True
    mode: str = attrs.field(default="auto", validator=_mode_check)
    min_free_bytes: int = attrs.field(default=0, validator=_positive("min_free_bytes"))
    require_ep_context: bool = True
    private: bool = True
    single_flight: bool = True
    recache: bool = False


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
class Problem:
    """One bad or skipped entry: found by :meth:`ContextStore.verify`, left out by ``pack`` or ``unpack``."""

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
    compression: str


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


def _cleanup_private_tmp() -> None:
    for store in list(_OPEN_STORES):
        store._flush_stats()
    for path in _PRIVATE_TMP:
        _fs.rmtree_quiet(path)


atexit.register(_cleanup_private_tmp)


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (crashed-loader detection, stale-lock cleanup).

    psutil asks the OS the portable way: on Windows ``os.kill(pid, 0)`` would send CTRL_C_EVENT instead of probing,
    so without it every pid counted as alive there and a crashed loader was never detected. An error of the probe
    counts as alive: a live process must never be taken for dead.
    """
    import psutil

    try:
        return bool(psutil.pid_exists(pid))
    except Exception:  # an unexpected OS refusal: assume the safe answer
        return True


def _safe_check(
    entry_dir: Path,
    key_hex: str,
    material: Mapping[str, Any] | None,
    *,
    full: bool,
    known: Mapping[str, Signature] | None = None,
) -> CheckResult:
    """check_entry that turns any failure into a reason: a damaged entry must never crash a lookup."""
    try:
        return check_entry(entry_dir, key_hex, material, full=full, known=known)
    except OSError as exc:
        return CheckResult("corrupt:unreadable", str(exc))
    except Exception as exc:  # e.g. a manifest with values of unexpected types
        return CheckResult("manifest:invalid", f"{type(exc).__name__}: {exc}")


def _errname(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, str(code)) if isinstance(code, int) else type(exc).__name__


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
        options: StoreOptions = StoreOptions(),
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
        self._mode: Mode = self._open()
        _OPEN_STORES.add(self)

    # ------------------------------------------------------------------ properties
    @property
    def root(self) -> Path:
        """The cache root directory."""
        return self._root

    @property
    def options(self) -> StoreOptions:
        """The options this store was opened with."""
        return self._options

    @property
    def mode(self) -> Mode:
        """``readwrite``, ``readonly`` or ``disabled`` (decided when the store was opened)."""
        return self._mode

    def _dir(self, name: str) -> Path:
        return self._base / name

    def entry_dir(self, key: CacheKey | str) -> Path:
        """Where the entry for ``key`` lives (whether or not it exists)."""
        hex_ = key.hex if isinstance(key, CacheKey) else str(key)
        return self._base / "entries" / hex_[:2] / hex_

    # ------------------------------------------------------------------ opening
    def _mkdir(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True, mode=0o700 if self._options.private else 0o777)

    def _open(self) -> Mode:
        requested = self._options.mode
        if requested == "auto":
            env = os.environ.get(MODE_ENV_VAR, "").strip().lower()
            if env in ("readwrite", "readonly", "disabled"):
                requested = env
            elif env:
                self._warn_once(
                    "mode-env", f"ignoring ${MODE_ENV_VAR}={env!r}: expected readwrite, readonly or disabled"
                )
        if requested == "disabled":
            return "disabled"
        if requested != "readonly":
            try:
                self._init_layout()
                probe = self._base / f".probe-{_fs.unique_suffix()}"
                probe.write_bytes(b"")
                probe.unlink()
                return "readwrite"
            except OSError as exc:
                reason = f"{_errname(exc)}: {exc}"
            if requested == "readwrite":
                self._warn_once("mode", f"cache root {self._root} is not writable ({reason}); running read-only")
        else:
            reason = "read-only mode requested"
        if (self._base / "entries").is_dir() and os.access(self._base / "entries", os.R_OK | os.X_OK):
            if requested != "readonly":
                self._warn_once("mode", f"cache root {self._root} is not writable ({reason}); serving hits only")
            return "readonly"
        self._warn_once("mode", f"cache root {self._root} is unusable ({reason}); compiling without a cache")
        return "disabled"

    def _init_layout(self) -> None:
        if self._root.exists() and not self._root.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "cache root is not a directory", str(self._root))
        self._mkdir(self._root)
        marker = self._root / ROOT_MARKER
        if not marker.is_file():
            _fs.write_json_atomic(marker, {"format": ROOT_FORMAT, "layout": LAYOUT}, durable=False)
        tag = self._root / "CACHEDIR.TAG"
        if not tag.is_file():
            tmp = tag.with_name(f".CACHEDIR.TAG.{_fs.unique_suffix()}")
            tmp.write_text(_CACHEDIR_TAG, encoding="ascii")
            os.replace(tmp, tag)
        for name in ("entries", "staging", "locks", "quarantine", "trash", "pins", "stats"):
            self._mkdir(self._dir(name))

    def _warn_once(self, kind: str, message: str) -> None:
        token = (str(self._root), kind)
        if token in _WARNED:
            _log.debug("%s", message)
            return
        _WARNED.add(token)
        _log.warning("%s", message)

    def _count(self, name: str, amount: int = 1) -> None:
        with self._counter_lock:
            self._counters[name] += amount

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

    def _check_key(self, key: object) -> None:
        if not isinstance(key, CacheKey):
            raise TypeError(f"key must be a CacheKey from qnnx_ctxcache.make_key(), got {type(key).__name__}")

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
        with _VERIFIED_LOCK:
            known = _VERIFIED.get(memo) if memo is not None else None
        need_full = full or (self._options.verify_on_first_use and known is None)
        result = _safe_check(entry_dir, key.hex, key.material, full=need_full, known=known)
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

    @staticmethod
    def _memo_token(entry_dir: Path) -> tuple[str, int, int, int, int] | None:
        try:
            st = (entry_dir / MANIFEST_NAME).lstat()
        except OSError:
            return None
        return (str(entry_dir), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @staticmethod
    def _remember_verified(token: tuple[str, int, int, int, int], result: CheckResult) -> None:
        with _VERIFIED_LOCK:
            _VERIFIED[token] = dict(result.signatures)

    def _reject(self, key_hex: str, result: CheckResult) -> None:
        _log.warning(
            "ctxcache entry %s is bad (%s%s); treating as a miss and rebuilding",
            key_hex[:16],
            result.reason,
            f": {result.detail}" if result.detail else "",
        )
        self._count(f"miss:{result.reason.split(':')[0]}")
        self._count(f"bad:{result.reason}")
        self._quarantine(key_hex, result.reason, result.detail)
        return None

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

    # ------------------------------------------------------------------ quarantine
    def _quarantine(self, key_hex: str, reason: str, detail: str = "") -> bool:
        with _VERIFIED_LOCK:
            for token in [t for t in _VERIFIED if t[0] == str(self.entry_dir(key_hex))]:
                del _VERIFIED[token]
        if self._mode != "readwrite":
            return False
        src = self.entry_dir(key_hex)
        dest = self._dir("quarantine") / f"{key_hex}.{_fs.unique_suffix()}"
        try:
            os.rename(src, dest)
        except FileNotFoundError:
            return False  # another process quarantined or evicted it first
        except OSError as exc:
            _log.warning("could not quarantine %s (%s); deleting it instead", src, exc)
            return _fs.rmtree_quiet(src)
        self._count("quarantined")
        with contextlib.suppress(OSError):
            _fs.write_json_atomic(
                dest.with_name(dest.name + ".json"),
                {"key": key_hex, "reason": reason, "detail": detail, "time": self._clock(), "pid": os.getpid()},
                durable=False,
            )
        self._flush_stats()
        return True

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
        staging = self._dir("staging") / f"{key_hex}.{_HOST_ID}.{os.getpid()}.{_fs.unique_suffix()}"
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
            self._count(f"store_skipped:{_errname(exc)}")
            return self._build_private(key, build, f"store-failed:{_errname(exc)}")
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
                f"store:{_errname(exc)}", f"could not store a context under {self._root} ({exc}); using it uncached"
            )
            self._count(f"store_skipped:{_errname(exc)}")
            return self._rescue(key, staging, result, f"store-failed:{_errname(exc)}")
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
            "writer": {"ctxcache": __version__, "host": _HOST_ID, "pid": os.getpid()},
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
            seen = _safe_check(final, key_hex, None, full=False)
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

    # ------------------------------------------------------------------ pins
    @contextlib.contextmanager
    def _marker(self, key_hex: str, suffix: str) -> Iterator[None]:
        """A ``pins/<key>/<host>.<pid>.<uuid><suffix>`` file for the duration of the block (best effort)."""
        marker: Path | None = None
        if self._mode == "readwrite":
            pin_dir = self._dir("pins") / key_hex
            try:
                self._mkdir(pin_dir)
                marker = pin_dir / f"{_HOST_ID}.{os.getpid()}.{_fs.unique_suffix()}{suffix}"
                marker.write_text(json.dumps({"host": _HOST_ID, "pid": os.getpid()}), encoding="utf-8")
            except OSError as exc:
                _log.debug("could not create %s marker for %s: %s", suffix, key_hex[:16], exc)
                marker = None
        try:
            yield
        finally:
            if marker is not None:
                with contextlib.suppress(OSError):
                    marker.unlink()
                with contextlib.suppress(OSError):
                    marker.parent.rmdir()

    def _crashed_loader(self, key_hex: str) -> bool:
        """True when a process on this host died while loading this entry (its marker outlived it)."""
        try:
            markers = [p for p in (self._dir("pins") / key_hex).iterdir() if p.name.endswith(".loading")]
        except OSError:
            return False
        for marker in markers:
            host, _, rest = marker.name.partition(".")
            pid = rest.partition(".")[0]
            if host == _HOST_ID and pid.isdigit() and not _pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    marker.unlink()
                return True
        return False

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

    def _is_pinned(self, key_hex: str) -> bool:
        pin_dir = self._dir("pins") / key_hex
        try:
            pins = list(pin_dir.iterdir())
        except OSError:
            return False
        now = self._clock()
        return any(not self._is_stale_owner(pin.name, pin, now, self._options.stale_after_seconds) for pin in pins)

    @staticmethod
    def _is_stale_owner(name: str, path: Path, now: float, stale_after: float) -> bool:
        """Staging dirs and pins carry ``<host>.<pid>`` in their names: dead owners are stale at once."""
        parts = name.split(".")
        is_pin = name.endswith((".pin", ".loading"))
        host, pid = (parts[0], parts[1]) if is_pin else (parts[1], parts[2]) if len(parts) > 3 else ("", "")
        try:
            age = now - path.lstat().st_mtime
        except OSError:
            return False
        if host == _HOST_ID and pid.isdigit():
            if not _pid_alive(int(pid)):
                # A dead owner will never publish or unpin. Pins go at once; staging waits stale_after
                # in case the PID belongs to another PID namespace with the same host name.
                return is_pin or age >= stale_after
            # A live owner (or a reused PID) keeps its files for at least a day: long compiles exist.
            return age >= max(stale_after, _FOREIGN_MAX_AGE)
        return age >= max(stale_after, _FOREIGN_MAX_AGE if is_pin else stale_after)

    # ------------------------------------------------------------------ listing, stats
    def _iter_entry_dirs(self) -> Iterator[tuple[str, Path]]:
        base = self._dir("entries")
        try:
            shards = sorted(base.iterdir())
        except OSError:
            return
        for shard in shards:
            if not _HEX2.match(shard.name) or shard.is_symlink() or not shard.is_dir():
                continue
            try:
                children = sorted(shard.iterdir())
            except OSError:
                continue
            for child in children:
                if _HEX64.match(child.name) and child.name[:2] == shard.name:
                    yield child.name, child

    def _junk(self) -> list[str]:
        junk: list[str] = []
        base = self._dir("entries")
        try:
            shards = sorted(base.iterdir())
        except OSError:
            return junk
        for shard in shards:
            if not _HEX2.match(shard.name) or shard.is_symlink() or not shard.is_dir():
                junk.append(shard.name)
                continue
            with contextlib.suppress(OSError):
                for child in sorted(shard.iterdir()):
                    if not (_HEX64.match(child.name) and child.name[:2] == shard.name):
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
        if last > now + _FUTURE_TOLERANCE:
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

    def inspect(self, key: CacheKey | str) -> dict[str, Any] | None:
        """The manifest of an entry plus its disk size, last use and pin state, or None if absent."""
        key_hex = key.hex if isinstance(key, CacheKey) else key
        if not _HEX64.match(key_hex):
            return None
        entry_dir = self.entry_dir(key_hex)
        from qnnx_ctxcache._manifest import read_manifest

        manifest, reason = read_manifest(entry_dir)
        if manifest is None:
            return (
                None if reason == "manifest:missing" and not entry_dir.exists() else {"key": key_hex, "error": reason}
            )
        last, _created = self._last_used(entry_dir, self._clock())
        return {
            **manifest,
            "path": str(entry_dir),
            "size_bytes": _fs.tree_disk_usage(entry_dir),
            "last_used": last,
            "pinned": self._is_pinned(key_hex),
        }

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
        path = self._dir("stats") / f"{_HOST_ID}-{os.getpid()}-{id(self):x}.json"
        with contextlib.suppress(OSError):
            _fs.write_json_atomic(path, {"counters": counters, "time": self._clock()}, durable=False)

    # ------------------------------------------------------------------ verify
    def verify(self, *, full: bool = False, fix: bool = False) -> VerifyReport:
        """Check every entry (cheap check, or SHA-256 of every file with ``full``); never raises.

        Args:
            full: hash every file (detects overwritten bytes that keep the size).
            fix: move bad entries to quarantine.
        """
        problems: list[Problem] = []
        quarantined: list[str] = []
        checked = 0
        for key_hex, path in self._iter_entry_dirs():
            checked += 1
            result = self._check_dir(path, key_hex, full=full)
            if result.ok:
                if full:
                    token = self._memo_token(path)
                    if token is not None:
                        self._remember_verified(token, result)
                continue
            problems.append(Problem(key=key_hex, reason=result.reason, detail=result.detail))
            if fix and self._quarantine(key_hex, result.reason, result.detail):
                quarantined.append(key_hex)
        return VerifyReport(
            checked=checked,
            full=full,
            problems=tuple(problems),
            quarantined=tuple(quarantined),
            junk=tuple(self._junk()),
        )

    @staticmethod
    def _check_dir(path: Path, key_hex: str, *, full: bool) -> CheckResult:
        """Check an entry directory without the caller's key: its stored key material must hash to ``key_hex``."""
        if path.is_symlink() or not path.is_dir():
            return CheckResult("untrusted:not-a-directory", "entry path is not a directory")
        return _safe_check(path, key_hex, None, full=full)

    # ------------------------------------------------------------------ eviction
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

    # ------------------------------------------------------------------ pack / unpack
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
        from qnnx_ctxcache import _archive  # deferred: importing the package must stay cheap

        target = Path(archive_path)
        gz = _archive.wants_gzip(target, compression)
        chosen = self._select(keys)
        items: list[_archive.PackItem] = []
        skipped: list[Problem] = []
        with contextlib.ExitStack() as pins:
            for key_hex in chosen:
                pins.enter_context(self._marker(key_hex, ".pin"))
                path = self.entry_dir(key_hex)
                result = self._check_dir(path, key_hex, full=True)
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
                target, items, created=self._clock(), gz=gz, durable=self._options.durable
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
            return [key_hex for key_hex, _ in self._iter_entry_dirs()]
        if isinstance(keys, str | CacheKey):
            keys = [keys]
        chosen: list[str] = []
        for item in keys:
            text = item.hex if isinstance(item, CacheKey) else item
            if not isinstance(text, str):
                raise TypeError(f"keys must hold CacheKey objects or key strings, got {type(item).__name__}")
            matches = self._matching(text)
            if matches is None or len(matches) != 1:
                raise EntryNotFoundError(text, str(self._root), None if matches is None else len(matches))
            if matches[0] not in chosen:
                chosen.append(matches[0])
        return chosen

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
        from qnnx_ctxcache import _archive  # deferred: importing the package must stay cheap

        if self._mode != "readwrite":
            raise StoreNotWritableError(str(self._root), self._mode)
        archive = Path(archive_path)
        staged: dict[str, Path] = {}

        def staging_for(key_hex: str) -> Path:
            if key_hex not in staged:
                staged[key_hex] = self._new_staging(key_hex)
            return staged[key_hex]

        try:
            contents = _archive.extract_archive(
                archive, staging_for, dest_root=self._dir("staging"), durable=self._options.durable
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
        result = _safe_check(staging, key_hex, None, full=True)
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
        if self._options.durable:
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
        for manifest in manifests:
            key = CacheKey(manifest["key"], MappingProxyType(manifest["key_material"]))
            staging = staged[key.hex]
            size = _fs.tree_disk_usage(staging)
            if size > self._options.max_size_bytes:
                limit = self._options.max_size_bytes
                skipped.append(
                    Problem(key=key.hex, reason="too-large", detail=f"{size} bytes > max_size_bytes={limit}")
                )
                continue
            final = self.entry_dir(key)
            self._mkdir(final.parent)
            if self._publish(key, staging, final):
                self._after_publish(final, key.hex)
                added.append(key.hex)
            elif self._lookup(key, count=False) is not None:
                present.append(key.hex)
            else:
                detail = "an unusable entry sits at its path and could not be moved to quarantine"
                skipped.append(Problem(key=key.hex, reason="occupied", detail=detail))
                continue
            if key.material.get("host") != here:
                other_host.append(key.hex)
        if added:
            self._count("unpacked", len(added))
            self._flush_stats()
        _log.info(
            "ctxcache unpacked %s: %d added, %d already present, %d skipped",
            archive, len(added), len(present), len(skipped),
        )  # fmt: skip
        if added and self._options.auto_prune:
            self._auto_prune(keep=frozenset(added))
        return UnpackReport(
            archive=archive,
            added=tuple(added),
            already_present=tuple(present),
            skipped=tuple(skipped),
            other_host=tuple(other_host),
            packed_by=contents.packed_by,
            created=contents.created,
        )

    # ------------------------------------------------------------------ removal
    def remove(self, key: CacheKey | str) -> bool:
        """Delete one entry (rename to trash, then delete). Returns False when it was not there."""
        key_hex = key.hex if isinstance(key, CacheKey) else key
        if not _HEX64.match(key_hex) or self._mode != "readwrite":
            return False
        return (
            self._evict(key_hex) if self.entry_dir(key_hex).exists() or self.entry_dir(key_hex).is_symlink() else False
        )

    def clear(self) -> int:
        """Delete every entry, staging dir, quarantine and lock of this store; returns entries removed.

        Raises:
            NotACacheRootError: the root has no ``ctxcache-root.json`` marker (never wipe a user folder).
        """
        if not (self._root / ROOT_MARKER).is_file():
            raise NotACacheRootError(str(self._root))
        count = 0
        for key_hex, _ in list(self._iter_entry_dirs()):
            count += self._evict(key_hex)
        for name in ("staging", "quarantine", "trash", "pins"):
            for path in list(self._dir(name).iterdir()) if self._dir(name).is_dir() else []:
                if not path.name.startswith(".nfs"):
                    _fs.rmtree_quiet(path)
        return count
