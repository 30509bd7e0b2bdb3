"""Checking entries, the memo of entries this process verified, and quarantine."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qnnx_ctxcache import _fs
from qnnx_ctxcache._listing import _ListingMixin
from qnnx_ctxcache._manifest import MANIFEST_NAME, CheckResult, Signature, check_entry
from qnnx_ctxcache._results import Problem, VerifyReport

_log = logging.getLogger(__name__)

# Entries this process has verified (full SHA-256), keyed by (entry dir, manifest inode, size, mtime_ns,
# ctime_ns), with the signature of every file at that moment. A hit whose files still have those
# signatures needs no hashing; any change (even a rewrite with the old mtime restored) is hashed again.
VERIFIED: dict[tuple[str, int, int, int, int], dict[str, Signature]] = {}
VERIFIED_LOCK = threading.Lock()


def safe_check(
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


class _VerifyMixin(_ListingMixin):
    """The full and cheap checks of published entries, and moving bad ones to quarantine."""

    @staticmethod
    def _memo_token(entry_dir: Path) -> tuple[str, int, int, int, int] | None:
        try:
            st = (entry_dir / MANIFEST_NAME).lstat()
        except OSError:
            return None
        return (str(entry_dir), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @staticmethod
    def _remember_verified(token: tuple[str, int, int, int, int], result: CheckResult) -> None:
        with VERIFIED_LOCK:
            VERIFIED[token] = dict(result.signatures)

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

    # ------------------------------------------------------------------ quarantine
    def _quarantine(self, key_hex: str, reason: str, detail: str = "") -> bool:
        with VERIFIED_LOCK:
            for token in [t for t in VERIFIED if t[0] == str(self.entry_dir(key_hex))]:
                del VERIFIED[token]
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
        return safe_check(path, key_hex, None, full=full)
