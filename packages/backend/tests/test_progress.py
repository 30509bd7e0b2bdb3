"""Compile progress: a start line for every compile, stage and elapsed time for long ones."""

from __future__ import annotations

import logging
import threading

import pytest

from qnnx_backend import _progress


def test_stage_follows_the_recorded_timings() -> None:
    """The stage shown is the one after the last finished stage."""
    assert _progress.stage({}) == "analyzing the graph"
    assert _progress.stage({"analyze": 0.1}) == "exporting to ONNX"
    assert _progress.stage({"analyze": 0.1, "export": 1.0, "opcheck_npu": 0.1}) == "building the QNN session"
    parts = {"analyze": 0.1, "export": 1.0, "opcheck_npu": 0.1, "building_part": 2, "parts": 5}
    assert _progress.stage(parts) == "building the QNN session, part 2 of 5"


def test_long_compile_reports_stage_and_time(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Without a terminal, a compile that outlasts the first report logs its stage at INFO; the thread ends."""
    monkeypatch.setattr(_progress, "FIRST_REPORT_SECONDS", 0.01)
    monkeypatch.setattr(_progress, "EVERY_SECONDS", 0.01)
    reported = threading.Event()
    timings: dict[str, float] = {"analyze": 0.0}
    caplog.set_level(logging.INFO, logger="qnnx_backend")

    class Spy(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "exporting to ONNX" in record.getMessage():
                reported.set()

    spy = Spy()
    logging.getLogger("qnnx_backend").addHandler(spy)
    try:
        with _progress.compile_progress(7, timings, ((1, 3),)):
            assert reported.wait(5), "no progress line while the compile ran"
    finally:
        logging.getLogger("qnnx_backend").removeHandler(spy)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("qnn backend: graph 7: compiling")
    assert not [t for t in threading.enumerate() if t.name == "qnnx-progress-7"]
