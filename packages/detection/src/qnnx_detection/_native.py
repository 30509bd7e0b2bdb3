"""Keeping native output off the user's terminal, and turning native logs into one readable cause."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

import attrs

# One capture at a time across threads: fds 1 and 2 are process-wide, so two overlapping redirections would restore
# each other's saved fds in the wrong order. Reentrant so a nested capture in the same thread simply nests.
_CAPTURE_LOCK = threading.RLock()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@attrs.define
class CapturedOutput:
    """Text written to fds 1 and 2 inside :func:`capture_native_output` (filled in when the block exits)."""

    text: str = ""


def _flush_c_stdio() -> None:
    # The simulator's "LIBNATIVE" line goes through C stdio; when fd 1 is a pipe or file it sits in libc's buffer and
    # would be written after we restore fd 1, i.e. onto the user's stdout. fflush(NULL) flushes every C stream.
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None) if sys.platform != "win32" else ctypes.cdll.msvcrt
        libc.fflush(None)


@contextlib.contextmanager
def capture_native_output() -> Iterator[CapturedOutput]:
    """Redirect fds 1 and 2 to a temporary file for the duration of the block; always restore them.

    Python's ``sys.stdout``/``sys.stderr`` are flushed first so earlier Python output is not captured. Other threads
    writing to fds 1/2 during the block are captured too; the block is meant to be short (session creation).
    """
    captured = CapturedOutput()
    with _CAPTURE_LOCK:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        _flush_c_stdio()
        with tempfile.TemporaryFile() as sink:
            saved: list[tuple[int, int]] = []
            try:
                for fd in (1, 2):
                    try:
                        copy = os.dup(fd)
                    except OSError:  # fd closed (daemon, pythonw): nothing to protect
                        continue
                    saved.append((fd, copy))
                    os.dup2(sink.fileno(), fd)
                yield captured
            finally:
                _flush_c_stdio()
                for fd, copy in saved:
                    os.dup2(copy, fd)
                    os.close(copy)
                sink.seek(0)
                captured.text = _ANSI.sub("", sink.read().decode("utf-8", errors="replace"))


_X86 = frozenset({"x86_64", "amd64", "x64", "i386", "i686", "x86"})


def is_x86(machine: str) -> bool:
    """True for x86/x86_64 hosts, where QNN's HTP is the host simulator and no Adreno GPU exists."""
    return machine.strip().lower() in _X86


_BACKEND_NAME = {"npu": "HTP", "gpu": "GPU"}


def explain_failure(device: str, native_log: str, ort_message: str, *, machine: str = "") -> str:
    """Return a one-line human cause for a failed QNN session, from the native log and ORT's exception text.

    ORT's own exception is often generic ("nodes assigned to the default CPU EP, but fallback ... disabled"); the
    real reason is in the native ERROR lines QNN prints while ORT asks it for capabilities (onnxruntime-qnn 2.7.0).
    """
    backend = _BACKEND_NAME.get(device, device)
    text = f"{native_log}\n{ort_message}"
    if "QNN_BACKEND_ERROR_CANNOT_INITIALIZE" in text:
        why = ""
        if device == "gpu":
            why = ": no Adreno GPU on this machine" if is_x86(machine) else ": no usable Adreno GPU/driver found"
        return f"the QNN {backend} backend could not initialize (QNN_BACKEND_ERROR_CANNOT_INITIALIZE){why}"
    if "QNN_DEVICE_ERROR_INVALID_CONFIG" in text:
        return (
            f"the QNN {backend} backend rejected the device configuration (QNN_DEVICE_ERROR_INVALID_CONFIG); "
            "check soc_model/htp_arch: the bundled QAIRT may not know this SoC"
        )
    if "QNN_COMMON_ERROR_MEM_ALLOC" in text:
        return f"the QNN {backend} backend failed to finalize the graph (QNN_COMMON_ERROR_MEM_ALLOC)"
    missing = re.search(r"([\w.\-]+\.(?:so|dll)[^:]*): cannot open shared object file", text)
    if missing or "Unable to load backend" in text:
        lib = missing.group(1) if missing else "the backend library"
        return f"the QNN {backend} backend library could not be loaded ({lib})"
    if "Could not determine default backend path" in text:
        return f"QNN could not determine the {backend} backend library; pass backend_path"
    qnn_error = re.search(r"\b(QNN_[A-Z0-9_]+_ERROR_[A-Z0-9_]+|QNN_[A-Z]+_ERROR_[A-Z0-9_]+)\b", text)
    if qnn_error:
        return f"the QNN {backend} backend failed ({qnn_error.group(1)})"
    if "fallback to CPU EP has been explicitly disabled" in text:
        return (
            f"the QNN {backend} backend did not take every node of the graph and CPU fallback is disabled "
            "(some operators are unsupported on this backend)"
        )
    for line in native_log.splitlines():
        if "[E:" in line or " ERROR " in line:
            return line.split("] ", 1)[-1].strip()[:300]
    message = ort_message.strip().splitlines()[0] if ort_message.strip() else "unknown error"
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", message)[:300]
