"""The probe cache: each backend's initialization verdict, kept on disk for the next processes (private).

Preparing the tiny graph on each QNN backend is most of a full probe (about 0.3 s of the 0.45 s on the x86_64
simulator bench). Its outcome depends only on things the probe can name, so a later process reuses it while all of
them are unchanged:

- the record format and this package's version (the code that decides);
- the Python build and environment (``sys.version``, ``sys.prefix``);
- the host (``platform.node()``: a home folder may be shared between machines), its OS, release and build, its CPU
  architecture, and the **boot**: a verdict is never reused after a restart, which is when an NPU or GPU kernel
  driver normally changes;
- onnxruntime, onnxruntime-qnn and QAIRT versions, and the **identity of every native library** the verdict came
  from (path, size and modification time of onnxruntime's extension and of each file in onnxruntime-qnn's library
  folder): a reinstall, a swapped library or another build of the same version is a new key;
- the variables that steer the native loader (``LD_LIBRARY_PATH``, ``ADSP_LIBRARY_PATH``; ``PATH`` on Windows);
- the backend, the ``OrtEpDevice`` serving it (hardware type, vendor, ids) and the ``soc_model``.

On top of that a verdict expires: one that says "usable" after :data:`MAX_AGE_USABLE_S`, one that says why not after
:data:`MAX_AGE_UNUSABLE_S` (a device that was busy or whose driver was just installed is asked again soon). A host
without a boot identity keeps no verdicts. Anything wrong with the folder or a record (unreadable, damaged, from
the future, another key) is a miss, never an error: the probe then prepares the tiny graph as usual.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

logger = logging.getLogger(__name__)

#: Layout of a record (and of the key material); bump it when either changes meaning.
RECORD_FORMAT = 1
#: Seconds a "usable" verdict is reused.
MAX_AGE_USABLE_S = 24 * 3600.0
#: Seconds a "not usable" verdict is reused.
MAX_AGE_UNUSABLE_S = 3600.0
# A record written this far in the future (clock set back) is not trusted.
_CLOCK_SLACK_S = 60.0
# Library suffixes of the files in onnxruntime-qnn's folder whose identity is part of the key.
_NATIVE_SUFFIXES = (".so", ".dll", ".dylib", ".cat")


@attrs.frozen
class Verdict:
    """A reused initialization verdict: ``reason`` is None when the backend prepared the tiny graph."""

    reason: str | None
    age_s: float


def file_identity(path: str) -> str:
    """``path|size|mtime_ns`` of a file, or ``path|missing`` when it cannot be read (a different key either way)."""
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}|missing"
    return f"{path}|{st.st_size}|{st.st_mtime_ns}"


def folder_identity(folder: str) -> list[str]:
    """:func:`file_identity` of each native library in ``folder`` (sorted), or ``[folder|missing]``."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.lower().endswith(_NATIVE_SUFFIXES) or ".so." in n)
    except OSError:
        return [f"{folder}|missing"]
    return [file_identity(os.path.join(folder, n)) for n in names]


def linux_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str | None:
    """The kernel's identity of the current boot (a new random UUID at each start), or None."""
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except (OSError, ValueError):
        return None
    return text or None


def windows_boot_id() -> str | None:
    """The boot time, to the minute, from ``GetTickCount64`` (milliseconds since the start), or None."""
    try:
        import ctypes

        kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined,unused-ignore]
        kernel32.GetTickCount64.restype = ctypes.c_uint64
        uptime_s = kernel32.GetTickCount64() / 1000.0
    except (AttributeError, OSError):
        return None
    # Rounded so that processes of one boot agree; a boot near a minute boundary may read two values: a miss.
    return f"boot-at-{int((time.time() - uptime_s) // 60)}"


def host_boot_id(system: str) -> str | None:
    """The identity of the current boot on Linux and Windows (where QNN runs); None elsewhere."""
    if system == "Linux":
        return linux_boot_id()
    if system == "Windows":
        return windows_boot_id()
    return None


def loader_environment(environ: Mapping[str, str], system: str) -> dict[str, str | None]:
    """The environment variables that decide which native libraries the QNN backends load."""
    names = ["LD_LIBRARY_PATH", "ADSP_LIBRARY_PATH"] + (["PATH"] if system == "Windows" else [])
    return {name: environ.get(name) for name in names}


def key_material(
    *,
    detection_version: str,
    platform_info: Mapping[str, Any],
    versions: Mapping[str, Any],
    boot: str,
    libraries: Sequence[str],
    loader_env: Mapping[str, str | None],
    device: str,
    ep_device: Mapping[str, Any],
    soc_model: int,
) -> dict[str, Any]:
    """Everything a backend's initialization verdict depends on, as JSON-able data (see the module docstring)."""
    return {
        "record": RECORD_FORMAT,
        "qnnx_detection": detection_version,
        "python": [sys.version, sys.prefix, sys.implementation.name],
        "host": [platform.node(), platform.version()],
        "platform": dict(platform_info),
        "boot": boot,
        "versions": dict(versions),
        "libraries": list(libraries),
        "loader_env": dict(loader_env),
        "device": device,
        "ep_device": dict(ep_device),
        "soc_model": soc_model,
    }


def verdict_key(material: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of ``material`` (independent of key order)."""
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


class VerdictStore:
    """One JSON record per key in ``root``; reading and writing never raise.

    Records are written to a unique temporary name and renamed into place, so a reader sees a whole record or none;
    concurrent writers of one key write the same content.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_age_usable_s: float = MAX_AGE_USABLE_S,
        max_age_unusable_s: float = MAX_AGE_UNUSABLE_S,
    ) -> None:
        self.root = Path(root)
        self._max_age = {True: max_age_usable_s, False: max_age_unusable_s}

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, material: Mapping[str, Any], *, now: float | None = None) -> Verdict | None:
        """The verdict recorded for ``material``, or None (no record, damaged, another key, expired)."""
        key = verdict_key(material)
        path = self._path(key)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.debug("probe cache: record %s is unreadable (%s); probing again", path, exc)
            return None
        now = time.time() if now is None else now
        if not self._valid(record, key, material):
            logger.debug("probe cache: record %s is malformed or for other material; probing again", path)
            return None
        reason = record["reason"]
        age = now - float(record["created"])
        if age < -_CLOCK_SLACK_S or age > self._max_age[reason is None]:
            logger.debug("probe cache: record %s is %.0f s old; probing again", path, age)
            return None
        return Verdict(reason=reason, age_s=max(age, 0.0))

    @staticmethod
    def _valid(record: object, key: str, material: Mapping[str, Any]) -> bool:
        if not isinstance(record, dict) or record.get("record") != RECORD_FORMAT or record.get("key") != key:
            return False
        created = record.get("created")
        if isinstance(created, bool) or not isinstance(created, int | float):
            return False
        reason = record.get("reason")
        if reason is not None and not (isinstance(reason, str) and reason):
            return False
        # The full material, not only its hash: a record copied under another name is not reused.
        return bool(record.get("material") == json.loads(json.dumps(dict(material))))

    def put(self, material: Mapping[str, Any], reason: str | None, *, now: float | None = None) -> bool:
        """Record the verdict for ``material``; False when the folder cannot be written (logged at DEBUG)."""
        key = verdict_key(material)
        created = time.time() if now is None else now
        record = {"record": RECORD_FORMAT, "key": key, "created": created, "reason": reason, "material": material}
        tmp = self.root / f".{key}.{uuid.uuid4().hex}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record, sort_keys=True, indent=1), encoding="utf-8")
            os.replace(tmp, self._path(key))
        except OSError as exc:
            logger.debug("probe cache: cannot write %s (%s); the verdict is not kept", self.root, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        self._remove_expired()
        return True

    def _remove_expired(self) -> None:
        """Delete records older than the longest reuse age (a version change leaves its records behind)."""
        oldest = time.time() - max(self._max_age.values())
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                with contextlib.suppress(OSError):
                    if entry.name.endswith((".json", ".tmp")) and entry.stat().st_mtime < oldest:
                        os.unlink(entry.path)
