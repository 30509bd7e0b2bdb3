"""Filesystem helpers: fault injection points, fsync, atomic small-file writes, safe deletion, quiet release."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "FAULT_ENV_VAR",
    "fault",
    "fsync_dir",
    "fsync_file",
    "releasing",
    "rmtree_quiet",
    "tree_disk_usage",
    "unique_suffix",
    "write_json_atomic",
]

_log = logging.getLogger(__name__)

#: Test seam. ``QNNX_CTXCACHE_FAULT=<point>:<action>`` makes the store misbehave at a named step:
#: ``kill`` (SIGKILL this process), ``abort``, ``raise:<errno>`` (OSError with that errno) or
#: ``sleep:<seconds>``. Points: staging_created, compile_done, files_hashed, before_fsync,
#: manifest_written, before_publish, after_publish, before_touch, evict_renamed, evict_deleting.
#: Several rules may be given separated by commas. Unset in normal use: costs one dict lookup.
FAULT_ENV_VAR = "QNNX_CTXCACHE_FAULT"


def fault(point: str) -> None:
    """Run the fault action configured for ``point`` in ``$QNNX_CTXCACHE_FAULT``, if any."""
    spec = os.environ.get(FAULT_ENV_VAR)
    if not spec:
        return
    for rule in spec.split(","):
        name, _, action = rule.strip().partition(":")
        if name != point:
            continue
        _log.debug("fault injection at %s: %s", point, action)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "abort":
            os.abort()
        elif action.startswith("raise:"):
            code = int(action.split(":", 1)[1])
            raise OSError(code, f"{os.strerror(code)} (injected at {point})")
        elif action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))


def unique_suffix() -> str:
    """A name suffix unique across processes, hosts and containers (PIDs collide in containers)."""
    return uuid.uuid4().hex


def fsync_file(path: Path) -> None:
    """Flush one file's data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (so a rename survives power loss). No-op where unsupported."""
    if os.name == "nt":  # Windows cannot open a directory for fsync; NTFS journals renames itself
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, *, durable: bool) -> None:
    """Write JSON to ``path`` through a unique temp file in the same folder and one rename."""
    tmp = path.with_name(f".{path.name}.{unique_suffix()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True, ensure_ascii=False)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def rmtree_quiet(path: Path) -> bool:
    """Delete a tree without following symlinks; return True when it is gone."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path)  # rmtree never follows symlinks inside the tree
    except FileNotFoundError:
        return True
    except OSError as exc:
        _log.debug("could not delete %s: %s", path, exc)
        return False
    return True


@contextlib.contextmanager
def releasing(*steps: Callable[[], object]) -> Iterator[None]:
    """Run each of ``steps`` when the block ends, however it ends, passing over an OSError of each: the best-effort
    release of a lock or removal of a marker."""
    try:
        yield
    finally:
        for step in steps:
            with contextlib.suppress(OSError):
                step()


def tree_disk_usage(path: Path) -> int:
    """Bytes a tree occupies on disk (allocated blocks, not logical length); symlinks not followed."""
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            st = current.lstat()
        except OSError:
            continue
        blocks = getattr(st, "st_blocks", None)
        total += blocks * 512 if blocks is not None else st.st_size
        if os.path.isdir(current) and not current.is_symlink():
            try:
                stack.extend(current.iterdir())
            except OSError:
                continue
    return total


CHUNK = 1 << 20
"""Bytes read at a time when hashing or copying files."""


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's content, read in chunks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
