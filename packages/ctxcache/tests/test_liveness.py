"""Process liveness works on every platform: crashed loaders and stale locks are recognised on Windows too."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from qnnx_ctxcache import _pins


def test_a_finished_process_is_dead_and_this_one_alive() -> None:
    """A pid whose process has exited is not alive; the current process is."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert _pins.pid_alive(os.getpid())
    assert not _pins.pid_alive(proc.pid) or psutil.pid_exists(proc.pid)  # a reused pid may exist again


def test_windows_is_asked_through_psutil_not_os_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    """With os.name == 'nt' the answer comes from psutil (os.kill(pid, 0) would send CTRL_C_EVENT there)."""
    monkeypatch.setattr(os, "name", "nt")
    monkeypatch.setattr(os, "kill", lambda *a: pytest.fail("os.kill must not be used"))
    monkeypatch.setattr(psutil, "pid_exists", lambda pid: pid == 4242)
    assert _pins.pid_alive(4242)
    assert not _pins.pid_alive(4243)


def test_a_failing_probe_counts_as_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the OS refuses to say, the process counts as alive: a live loader is never taken for crashed."""

    def refuse(pid: int) -> bool:
        raise PermissionError("denied")

    monkeypatch.setattr(psutil, "pid_exists", refuse)
    assert _pins.pid_alive(1234)
