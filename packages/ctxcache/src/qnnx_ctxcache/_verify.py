"""Checking entries, the memo of entries this process verified, and quarantine."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._listing import Listing
from qnnx_ctxcache._manifest import MANIFEST_NAME, CheckResult, Signature, check_entry
from qnnx_ctxcache._part import StorePart
from qnnx_ctxcache._results import Problem, VerifyReport

_log = logging.getLogger(__name__)
P = ParamSpec("P")
MemoToken = tuple[str, int, int, int, int]

# Entries this process has verified (full SHA-256), keyed by (entry dir, manifest inode, size, mtime_ns,
# ctime_ns), with the signature of every file at that moment. A hit whose files still have those
# signatures needs no hashing; any change (even a rewrite with the old mtime restored) is hashed again.
VERIFIED: dict[MemoToken, dict[str, Signature]] = {}
VERIFIED_LOCK = threading.Lock()


def _never_raising(check: Callable[P, CheckResult]) -> Callable[P, CheckResult]:
    def safe(*args: P.args, **kwargs: P.kwargs) -> CheckResult:
        try:
            return check(*args, **kwargs)
        except OSError as exc:
            return CheckResult("corrupt:unreadable", str(exc))
        except Exception as exc:  # e.g. a manifest with values of unexpected types
            return CheckResult("manifest:invalid", f"{type(exc).__name__}: {exc}")

    return safe


#: check_entry that turns any failure into a reason: a damaged entry must never crash a lookup.
safe_check = _never_raising(check_entry)


def check_dir(path: Path, key_hex: str, *, full: bool) -> CheckResult:
    """Check an entry directory without the caller's key: its stored key material must hash to ``key_hex``."""
    if path.is_symlink() or not path.is_dir():
        return CheckResult("untrusted:not-a-directory", "entry path is not a directory")
    return safe_check(path, key_hex, None, full=full)


def memo_token(entry_dir: Path) -> MemoToken | None:
    """What the memo knows an entry by (its manifest's identity and times); None when it cannot be read."""
    try:
        st = (entry_dir / MANIFEST_NAME).lstat()
    except OSError:
        return None
    return (str(entry_dir), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remember(token: MemoToken, result: CheckResult) -> None:
    """Record that this process checked the entry of ``token`` and saw the files' signatures of ``result``."""
    with VERIFIED_LOCK:
        VERIFIED[token] = dict(result.signatures)


def recall(token: MemoToken | None) -> dict[str, Signature] | None:
    """The signatures this process saw when it last verified the entry of ``token``; None when it did not."""
    with VERIFIED_LOCK:
        return VERIFIED.get(token) if token is not None else None


@attrs.define(eq=False)
class Verifier(StorePart):
    """The full and cheap checks of published entries, and moving bad ones to quarantine."""

    _listing: Listing

    def reject(self, key_hex: str, result: CheckResult) -> None:
        """Log, count and quarantine an entry a lookup found bad (the lookup then misses)."""
        _log.warning(
            "ctxcache entry %s is bad (%s%s); treating as a miss and rebuilding",
            key_hex[:16],
            result.reason,
            f": {result.detail}" if result.detail else "",
        )
        self._counters.count(f"miss:{result.reason.split(':')[0]}")
        self._counters.count(f"bad:{result.reason}")
        self.quarantine(key_hex, result.reason, result.detail)

    def quarantine(self, key_hex: str, reason: str, detail: str = "") -> bool:
        """Move an entry to ``quarantine/`` with a record of why; False when it was not moved there."""
        layout = self._layout
        with VERIFIED_LOCK:
            for token in [t for t in VERIFIED if t[0] == str(layout.entry_dir(key_hex))]:
                del VERIFIED[token]
        if layout.mode != "readwrite":
            return False
        src = layout.entry_dir(key_hex)
        dest = layout.folder("quarantine") / f"{key_hex}.{_fs.unique_suffix()}"
        try:
            os.rename(src, dest)
        except FileNotFoundError:
            return False  # another process quarantined or evicted it first
        except OSError as exc:
            _log.warning("could not quarantine %s (%s); deleting it instead", src, exc)
            return _fs.rmtree_quiet(src)
        self._counters.count("quarantined")
        with contextlib.suppress(OSError):
            _fs.write_json_atomic(
                dest.with_name(dest.name + ".json"),
                {"key": key_hex, "reason": reason, "detail": detail, "time": layout.clock(), "pid": os.getpid()},
                durable=False,
            )
        self._counters.flush()
        return True

    def verify(self, full: bool, fix: bool) -> VerifyReport:
        problems: list[Problem] = []
        quarantined: list[str] = []
        checked = 0
        for key_hex, path in self._listing.entry_dirs():
            checked += 1
            result = check_dir(path, key_hex, full=full)
            if result.ok:
                if full:
                    token = memo_token(path)
                    if token is not None:
                        remember(token, result)
                continue
            problems.append(Problem(key=key_hex, reason=result.reason, detail=result.detail))
            if fix and self.quarantine(key_hex, result.reason, result.detail):
                quarantined.append(key_hex)
        return VerifyReport(
            checked=checked,
            full=full,
            problems=tuple(problems),
            quarantined=tuple(quarantined),
            junk=tuple(self._listing.junk()),
        )
