"""The cache root: where things live under it, how a store opens it, and the state every part of the store shares."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import socket
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey
from qnnx_ctxcache._options import StoreOptions

_log = logging.getLogger(__name__)

#: Overrides the default cache root (an explicit ``root`` argument wins over it).
DIR_ENV_VAR = "QNNX_CTXCACHE_DIR"
#: Forces a mode when ``StoreOptions.mode`` is ``"auto"``: ``readwrite``, ``readonly`` or ``disabled``.
MODE_ENV_VAR = "QNNX_CTXCACHE_MODE"
#: ``1`` acts like ``StoreOptions(recache=True)``.
RECACHE_ENV_VAR = "QNNX_CTXCACHE_RECACHE"

ROOT_MARKER = "ctxcache-root.json"
ROOT_FORMAT = "qnnx-ctxcache-root"
LAYOUT = "v1"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
HEX2 = re.compile(r"^[0-9a-f]{2}$")
_CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by qnnx-ctxcache.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
Mode = Literal["readwrite", "readonly", "disabled"]
HOST_ID = hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]
FOREIGN_MAX_AGE = 24 * 3600.0  # staging/pins of another host (or a reused PID) expire after a day
FUTURE_TOLERANCE = 300.0  # timestamps this far in the future are clock skew, not recent use
_WARNED: set[tuple[str, str]] = set()


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


def errname(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, str(code)) if isinstance(code, int) else type(exc).__name__


class _StoreBase:
    """The state of a :class:`~qnnx_ctxcache.ContextStore` and the primitives all its parts use."""

    _root: Path
    _options: StoreOptions
    _clock: Callable[[], float]
    _base: Path
    _counters: Counter[str]
    _counter_lock: threading.Lock
    _mode: Mode

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
                reason = f"{errname(exc)}: {exc}"
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

    def _check_key(self, key: object) -> None:
        if not isinstance(key, CacheKey):
            raise TypeError(f"key must be a CacheKey from qnnx_ctxcache.make_key(), got {type(key).__name__}")
