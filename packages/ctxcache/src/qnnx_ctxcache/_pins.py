"""Pins and crash markers (``pins/<key>/<host>.<pid>.<uuid><suffix>``), and whether their owners still live."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from qnnx_ctxcache import _fs
from qnnx_ctxcache._layout import _FOREIGN_MAX_AGE, _HOST_ID, _StoreBase

_log = logging.getLogger(__name__)


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


class _PinsMixin(_StoreBase):
    """Markers that keep an entry from eviction, or tell that a loader died; stale owners of staging and pins."""

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
