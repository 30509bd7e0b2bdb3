"""Pins and crash markers (``pins/<key>/<host>.<pid>.<uuid><suffix>``), and whether their owners still live."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._layout import FOREIGN_MAX_AGE, HOST_ID, Layout

_log = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
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


def external_hex(name: str) -> str:
    """The marker folder of a context outside the store: never the 64-hex-digit name of an entry."""
    return "x" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


@attrs.define(eq=False)
class Pins:
    """Markers that keep an entry from eviction, or tell that a loader died."""

    _layout: Layout

    @contextlib.contextmanager
    def marker(self, key_hex: str, suffix: str) -> Iterator[None]:
        """A ``pins/<key>/<host>.<pid>.<uuid><suffix>`` file for the duration of the block (best effort)."""
        marker: Path | None = None
        if self._layout.mode == "readwrite":
            pin_dir = self._layout.folder("pins") / key_hex
            try:
                self._layout.mkdir(pin_dir)
                marker = pin_dir / f"{HOST_ID}.{os.getpid()}.{_fs.unique_suffix()}{suffix}"
                marker.write_text(json.dumps({"host": HOST_ID, "pid": os.getpid()}), encoding="utf-8")
            except OSError as exc:
                _log.debug("could not create %s marker for %s: %s", suffix, key_hex[:16], exc)
                marker = None
        with _fs.releasing(*((marker.unlink, marker.parent.rmdir) if marker is not None else ())):
            yield

    def load_crashed(self, name: str) -> bool:
        """Whether a process on this host died loading the outside context ``name`` (remembered in ``crashes/``)."""
        hex_ = external_hex(name)
        record = self._layout.folder("crashes") / hex_
        if record.is_file():
            return True
        if not self.crashed_loader(hex_):
            return False
        if self._layout.mode == "readwrite":
            try:
                self._layout.mkdir(record.parent)
                payload = {"name": name, "host": HOST_ID, "seen": self._layout.clock()}
                _fs.write_json_atomic(record, payload, durable=False)
            except OSError as exc:
                _log.debug("could not record the crashed load of %s: %s", name, exc)
        _log.warning("a process died while loading %s; it is marked as crashing", name)
        return True

    def crashed_loader(self, key_hex: str) -> bool:
        """True when a process on this host died while loading this entry (its marker outlived it)."""
        try:
            markers = [p for p in (self._layout.folder("pins") / key_hex).iterdir() if p.name.endswith(".loading")]
        except OSError:
            return False
        for marker in markers:
            host, _, rest = marker.name.partition(".")
            pid = rest.partition(".")[0]
            if host == HOST_ID and pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    marker.unlink()
                return True
        return False

    def is_pinned(self, key_hex: str) -> bool:
        pin_dir = self._layout.folder("pins") / key_hex
        try:
            pins = list(pin_dir.iterdir())
        except OSError:
            return False
        now = self._layout.clock()
        stale_after = self._layout.options.stale_after_seconds
        return any(not is_stale_owner(pin.name, pin, now, stale_after) for pin in pins)


def is_stale_owner(name: str, path: Path, now: float, stale_after: float) -> bool:
    """Staging dirs and pins carry ``<host>.<pid>`` in their names: dead owners are stale at once."""
    parts = name.split(".")
    is_pin = name.endswith((".pin", ".loading"))
    host, pid = (parts[0], parts[1]) if is_pin else (parts[1], parts[2]) if len(parts) > 3 else ("", "")
    try:
        age = now - path.lstat().st_mtime
    except OSError:
        return False
    if host == HOST_ID and pid.isdigit():
        if not pid_alive(int(pid)):
            # A dead owner will never publish or unpin. Pins go at once; staging waits stale_after
            # in case the PID belongs to another PID namespace with the same host name.
            return is_pin or age >= stale_after
        # A live owner (or a reused PID) keeps its files for at least a day: long compiles exist.
        return age >= max(stale_after, FOREIGN_MAX_AGE)
    return age >= max(stale_after, FOREIGN_MAX_AGE if is_pin else stale_after)
