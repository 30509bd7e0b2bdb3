"""The cache root: where things live under it, and how a store opens it (the mode it then runs in)."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import socket
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
    """The errno name of an OS error (``ENOSPC``), or the exception's type name."""
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, str(code)) if isinstance(code, int) else type(exc).__name__


class Layout:
    """Where the parts of one store live under its root, the options and clock it was opened with, and its mode.

    Opening decides the mode once: ``readwrite`` when the layout can be created and written to, ``readonly`` when
    only its entries can be read, ``disabled`` otherwise; each fallback is warned about once per root and process.
    """

    def __init__(self, root: Path, options: StoreOptions, clock: Callable[[], float]) -> None:
        self.root = root
        self.options = options
        self.clock = clock
        self.base = root / LAYOUT
        self.mode: Mode = self._open()

    def folder(self, name: str) -> Path:
        """``<root>/v1/<name>``: ``entries``, ``staging``, ``locks``, ``quarantine``, ``trash``, ``pins``..."""
        return self.base / name

    def entry_dir(self, key: CacheKey | str) -> Path:
        hex_ = key.hex if isinstance(key, CacheKey) else str(key)
        return self.base / "entries" / hex_[:2] / hex_

    def mkdir(self, path: Path) -> None:
        """Create ``path`` and its parents (private to this user with ``StoreOptions.private``)."""
        path.mkdir(parents=True, exist_ok=True, mode=0o700 if self.options.private else 0o777)

    def warn_once(self, kind: str, message: str) -> None:
        """Log a warning the first time ``kind`` happens under this root in this process (later: debug)."""
        token = (str(self.root), kind)
        if token in _WARNED:
            _log.debug("%s", message)
            return
        _WARNED.add(token)
        _log.warning("%s", message)

    def _open(self) -> Mode:
        requested = self.options.mode
        if requested == "auto":
            env = os.environ.get(MODE_ENV_VAR, "").strip().lower()
            if env in ("readwrite", "readonly", "disabled"):
                requested = env
            elif env:
                self.warn_once(
                    "mode-env", f"ignoring ${MODE_ENV_VAR}={env!r}: expected readwrite, readonly or disabled"
                )
        if requested == "disabled":
            return "disabled"
        if requested != "readonly":
            try:
                self._init_layout()
                probe = self.base / f".probe-{_fs.unique_suffix()}"
                probe.write_bytes(b"")
                probe.unlink()
                return "readwrite"
            except OSError as exc:
                reason = f"{errname(exc)}: {exc}"
            if requested == "readwrite":
                self.warn_once("mode", f"cache root {self.root} is not writable ({reason}); running read-only")
        else:
            reason = "read-only mode requested"
        if (self.base / "entries").is_dir() and os.access(self.base / "entries", os.R_OK | os.X_OK):
            if requested != "readonly":
                self.warn_once("mode", f"cache root {self.root} is not writable ({reason}); serving hits only")
            return "readonly"
        self.warn_once("mode", f"cache root {self.root} is unusable ({reason}); compiling without a cache")
        return "disabled"

    def _init_layout(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "cache root is not a directory", str(self.root))
        self.mkdir(self.root)
        marker = self.root / ROOT_MARKER
        if not marker.is_file():
            _fs.write_json_atomic(marker, {"format": ROOT_FORMAT, "layout": LAYOUT}, durable=False)
        tag = self.root / "CACHEDIR.TAG"
        if not tag.is_file():
            tmp = tag.with_name(f".CACHEDIR.TAG.{_fs.unique_suffix()}")
            tmp.write_text(_CACHEDIR_TAG, encoding="ascii")
            os.replace(tmp, tag)
        for name in ("entries", "staging", "locks", "quarantine", "trash", "pins", "stats"):
            self.mkdir(self.folder(name))
