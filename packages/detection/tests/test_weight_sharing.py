"""probe_weight_sharing: a weight-shared context loaded in child processes, never in the caller, and cached."""

from __future__ import annotations

import json
import platform
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from detection_helpers import run_python

import qnnx_detection as qd
from qnnx_detection import _weight_sharing
from qnnx_detection.testing import FakeEnvironment, use_environment

simulator = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="asserts the x86_64 HTP simulator's behaviour"
)


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """The command lines of the probe's children, in order (the probe's memo of this process is cleared)."""
    spawned: list[list[str]] = []
    real = _weight_sharing._spawn

    def counting(argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
        spawned.append(argv)
        return real(argv, cwd)

    monkeypatch.setattr(_weight_sharing, "_spawn", counting)
    _weight_sharing._cached.clear()
    yield spawned
    _weight_sharing._cached.clear()


@simulator
def test_the_simulator_cannot_load_a_shared_context_and_the_probe_survives_it(children: list[list[str]]) -> None:
    """The load kills its child with SIGSEGV here; this process carries on with the reason, and the verdict is kept
    for this process and the next ones."""
    report = qd.probe_weight_sharing()
    assert not report.supported
    assert report.reason is not None
    assert "loading a weight-shared context" in report.reason and "killed the process with SIGSEGV" in report.reason
    assert "soc_model 60" in report.reason and "simulator" in report.reason
    assert [argv[3] for argv in children] == ["generate", "load"]
    assert report.soc_model == 60 and not report.reused and report.elapsed_s > 0
    assert json.loads(json.dumps(report.to_dict()))["supported"] is False

    _weight_sharing._cached.clear()  # a later process: only the probe cache remains
    again = qd.probe_weight_sharing()
    assert len(children) == 2
    assert again.reused and (again.supported, again.reason) == (report.supported, report.reason)
    assert qd.probe_weight_sharing() is again  # and the same process asks nothing again

    # A fresh process (the probe cache folder is the test's, inherited) reuses the verdict and starts no child.
    done = run_python(
        "import json, qnnx_detection as qd\n"
        "from qnnx_detection import _weight_sharing as w\n"
        "def refuse(argv, cwd): raise AssertionError('a child was started')\n"
        "w._spawn = refuse\n"
        "print(json.dumps(qd.probe_weight_sharing().to_dict()))"
    )
    assert done.returncode == 0, done.stderr
    reported = json.loads(done.stdout.strip().splitlines()[-1])
    assert reported["reused"] is True and reported["reason"] == report.reason


def test_a_fake_environment_is_not_probed(children: list[list[str]]) -> None:
    with use_environment(FakeEnvironment.snapdragon(soc_model=57)):
        report = qd.probe_weight_sharing()
    assert not report.supported and report.reason is not None and "fake environment" in report.reason
    assert children == []


def test_a_bad_soc_is_a_reason_not_an_exception(children: list[list[str]]) -> None:
    report = qd.probe_weight_sharing(soc_model="not-a-chip")
    assert not report.supported and report.reason is not None and report.reason.startswith("not probed: ")
    assert "not-a-chip" in report.reason
    assert children == []


@pytest.mark.parametrize(
    ("returncode", "stdout", "expected", "recorded"),
    [
        (-11, "", "killed the process with SIGSEGV", True),
        (-6, "", "killed the process with SIGABRT", True),
        (
            0,
            'QNNX_WEIGHT_SHARING {"error": "the QNN HTP backend failed (QNN_COMMON_ERROR_NOT_SUPPORTED)", '
            '"definitive": true}',
            "NOT_SUPPORTED",
            True,
        ),
        (0, 'noise\nQNNX_WEIGHT_SHARING {"error": null, "definitive": true}', None, True),
        (0, 'QNNX_WEIGHT_SHARING {"error": "OSError: disk full", "definitive": false}', "disk full", False),
        (1, "", "exited with status 1", False),
    ],
)
def test_a_child_outcome_becomes_the_reason(
    monkeypatch: pytest.MonkeyPatch, returncode: int, stdout: str, expected: str | None, recorded: bool
) -> None:
    def fake(argv: list[str], cwd: str) -> Any:
        return subprocess.CompletedProcess(argv, returncode, stdout, "last line\n")

    monkeypatch.setattr(_weight_sharing, "_spawn", fake)
    reason, definitive = _weight_sharing._child("load", "/nonexistent", 60, "here")
    assert definitive is recorded
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


def test_a_child_that_hangs_is_reported_and_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    def hang(argv: list[str], cwd: str) -> Any:
        raise subprocess.TimeoutExpired(argv, _weight_sharing.CHILD_TIMEOUT_S)

    monkeypatch.setattr(_weight_sharing, "_spawn", hang)
    reason, definitive = _weight_sharing._child("generate", "/nonexistent", 60, "here")
    assert reason is not None and "did not finish" in reason and not definitive
