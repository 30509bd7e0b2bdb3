"""Scratch files of a compile or a loaded file (private): named after the process that owns them, and removed by a
later process once that one is gone.

A staged model, a graph's compiled contexts and a saved file's unpacked contexts live in the temporary folder while
their owner runs, and the owner removes them when they are garbage or at exit. A process that dies instead (a native
crash in ONNX Runtime or QNN, the out-of-memory killer, SIGKILL) runs no clean-up, and its files stay: about the
weights of each graph it had compiled (hundreds of MiB to GiB for an LLM). So each name carries its owner,
``qnnx-<kind>-<host>.<pid>-<random>``, and the first scratch folder a process makes sweeps the folders and files of
this host's dead owners. Torch-free (the torch-free loader uses it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

# The host's part of a name: the same scratch folder may be seen by another machine or container (a shared /tmp),
# whose process ids mean nothing here.
HOST = hashlib.sha256(socket.gethostname().encode("utf-8", "surrogatepass")).hexdigest()[:8]
_NAME = re.compile(r"^qnnx-[a-z]+(?:-[a-z]+)*-(?P<host>[0-9a-f]{8})\.(?P<pid>\d+)-")
# A dead owner's files are swept only once they are this old (seconds): a margin for clocks and process start-up.
MIN_AGE = 60.0

_swept = False
_lock = threading.Lock()


def _prefix(kind: str) -> str:
    return f"qnnx-{kind}-{HOST}.{os.getpid()}-"


def make_dir(kind: str) -> Path:
    """A new scratch folder ``qnnx-<kind>-<host>.<pid>-...`` in the temporary folder (the first call of a process
    sweeps the dead owners' first). The caller removes it."""
    sweep_once()
    return Path(tempfile.mkdtemp(prefix=_prefix(kind)))


def make_file(kind: str, suffix: str) -> tuple[int, str]:
    """A new scratch file (``tempfile.mkstemp``'s descriptor and path), named like :func:`make_dir`'s folders."""
    sweep_once()
    return tempfile.mkstemp(prefix=_prefix(kind), suffix=suffix)


def sweep_once() -> None:
    """Remove the scratch files of this host's dead processes, once per process (best effort: never raises)."""
    global _swept
    with _lock:
        if _swept:
            return
        _swept = True
    try:
        removed = sweep(Path(tempfile.gettempdir()))
    except Exception as exc:  # clean-up must never cost the caller its compile
        logger.debug("qnn backend: could not sweep old scratch files (%s)", exc)
        return
    if removed:
        logger.info("qnn backend: removed %d scratch file(s) left by processes that died", removed)


def sweep(folder: Path, now: float | None = None) -> int:
    """Remove the ``qnnx-*`` scratch entries of ``folder`` whose owner (named in the entry) ran on this host, is no
    longer running and is at least :data:`MIN_AGE` seconds old; entries of other hosts, of other users, of live
    processes or without an owner in their name are kept. Returns how many were removed."""
    now = time.time() if now is None else now
    me = os.getpid()
    uid = os.getuid() if hasattr(os, "getuid") else None
    removed = 0
    with os.scandir(folder) as entries:
        candidates = [e for e in entries if e.name.startswith("qnnx-")]
    for entry in candidates:
        match = _NAME.match(entry.name)
        if match is None or match["host"] != HOST or int(match["pid"]) == me:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (uid is not None and info.st_uid != uid) or now - info.st_mtime < MIN_AGE or _alive(int(match["pid"])):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError as exc:
            logger.debug("qnn backend: could not remove %s (%s)", entry.path, exc)
    return removed


def _alive(pid: int) -> bool:
    """Whether a process with this id runs here; an error of the probe counts as alive (never remove a live
    process's files)."""
    import psutil

    try:
        return bool(psutil.pid_exists(pid))
    except Exception:
        return True
