"""Looking an entry up: every hit checked (cheaply, or hashing every file), a bad entry a miss, recency recorded."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey
from qnnx_ctxcache._manifest import LAST_USED_NAME, CheckResult
from qnnx_ctxcache._part import StorePart
from qnnx_ctxcache._pins import Pins
from qnnx_ctxcache._results import Entry
from qnnx_ctxcache._verify import Verifier, memo_token, recall, remember, safe_check

_log = logging.getLogger(__name__)


@attrs.define(eq=False)
class Lookup(StorePart):
    """The valid entry for a key, or None; a bad entry is quarantined, counted and missed, never raised."""

    _pins: Pins
    _verifier: Verifier
    #: Keys a caller invalidated that could not be quarantined (read-only root): misses from now on.
    bad_keys: set[str] = attrs.field(factory=set, init=False)

    def find(self, key: CacheKey, *, full: bool = False, count: bool = True) -> Entry | None:
        """The entry for ``key`` if it passes the check (``full``: hash every file); ``count``: count the result."""
        counters = self._counters
        if key.hex in self.bad_keys:
            if count:
                counters.count("miss:invalidated")
            return None
        entry_dir = self._layout.entry_dir(key)
        try:
            st = entry_dir.lstat()
        except FileNotFoundError:
            if count:
                counters.count("miss:absent")
            return None
        except OSError as exc:
            self._layout.warn_once("lookup", f"cannot read cache entry {entry_dir}: {exc}")
            if count:
                counters.count("miss:unreadable")
            return None
        if not stat.S_ISDIR(st.st_mode):
            self._verifier.reject(key.hex, CheckResult("untrusted:not-a-directory", "entry path is not a directory"))
            return None
        if self._layout.mode == "readwrite" and self._pins.crashed_loader(key.hex):
            self._verifier.reject(
                key.hex, CheckResult("crashed-loader", "a process died while loading this entry; rebuilding once")
            )
            return None
        memo = memo_token(entry_dir)
        known = recall(memo)
        need_full = full or (self._layout.options.verify_on_first_use and known is None)
        result = safe_check(entry_dir, key.hex, key.material, full=need_full, known=known)
        if not result.ok:
            self._verifier.reject(key.hex, result)
            return None
        if (need_full or known is not None) and memo is not None:
            remember(memo, result)
        manifest = result.manifest or {}
        self._touch(entry_dir)
        if count:
            counters.count("hit")
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
        if self._layout.mode != "readwrite":
            return  # read-only: nothing under the root is ever written, not even recency
        marker = entry_dir / LAST_USED_NAME
        now = self._layout.clock()
        try:
            last = marker.stat().st_mtime
        except FileNotFoundError:
            last = None
        except OSError:
            return
        if last is not None and 0 <= now - last < self._layout.options.touch_interval_seconds:
            return
        try:
            _fs.fault("before_touch")
            if last is None:
                marker.touch()
            os.utime(marker, (now, now))
        except OSError as exc:  # entry evicted meanwhile, or the disk is read-only now: recency is optional
            _log.debug("could not record use of %s: %s", entry_dir, exc)
