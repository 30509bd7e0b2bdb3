"""Native output capture, failure explanations, and the hand-encoded probe model."""

from __future__ import annotations

import os

import pytest

from qnnx_detection._native import capture_native_output, explain_failure
from qnnx_detection._tiny_model import tiny_add_model

GPU_LOG = (
    "\x1b[1;31m2026-11-29 23:20:20.26 [E:onnxruntime:, qnn_execution_provider.cc:2290 GetCapabilityImpl] QNN "
    "SetupBackend failed Failed to initialize backend (backend). Error: QNN_BACKEND_ERROR_CANNOT_INITIALIZE: "
    "Backend failed to initialize\x1b[m\n"
)
FALLBACK = (
    "[ONNXRuntimeError] : 1 : FAIL : This session contains graph nodes that are assigned to the default CPU EP, "
    "but fallback to CPU EP has been explicitly disabled by the user."
)


def _fd_identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def test_capture_collects_fd_writes_and_restores(capfd: pytest.CaptureFixture[str]) -> None:
    """Bytes written to fds 1 and 2 inside the block are captured (ANSI removed) and do not reach the terminal."""
    before = (_fd_identity(1), _fd_identity(2))
    with capture_native_output() as out:
        os.write(1, b"native stdout\n")
        os.write(2, b"\x1b[1;31mnative stderr\x1b[m\n")
    assert (_fd_identity(1), _fd_identity(2)) == before
    assert "native stdout" in out.text
    assert "native stderr" in out.text
    assert "\x1b[" not in out.text
    os.write(1, b"after\n")
    seen = capfd.readouterr()
    assert "native" not in seen.out + seen.err
    assert "after" in seen.out


def test_capture_restores_fds_when_the_block_raises(capfd: pytest.CaptureFixture[str]) -> None:
    """An exception inside the block still restores fds 1 and 2 and keeps the captured text."""
    before = (_fd_identity(1), _fd_identity(2))
    captured = []

    def fail_while_capturing() -> None:
        with capture_native_output() as out:
            captured.append(out)
            os.write(2, b"dying words\n")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_while_capturing()
    assert (_fd_identity(1), _fd_identity(2)) == before
    assert "dying words" in captured[0].text
    os.write(2, b"visible again\n")
    assert "visible again" in capfd.readouterr().err


def test_explain_gpu_cannot_initialize() -> None:
    """The generic ORT fallback error plus QNN's native line become 'GPU backend could not initialize'."""
    cause = explain_failure("gpu", GPU_LOG, FALLBACK, machine="x86_64")
    assert cause == (
        "the QNN GPU backend could not initialize (QNN_BACKEND_ERROR_CANNOT_INITIALIZE): no Adreno GPU on this machine"
    )
    assert "no Adreno GPU on this machine" not in explain_failure("gpu", GPU_LOG, FALLBACK, machine="ARM64")


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            "Failed to finalize QNN graph. Error code: QNN_DEVICE_ERROR_INVALID_CONFIG",
            "QNN_DEVICE_ERROR_INVALID_CONFIG",
        ),
        ("graph finalize failed QNN_COMMON_ERROR_MEM_ALLOC 1002", "QNN_COMMON_ERROR_MEM_ALLOC"),
        ("Unable to load backend, error: libQnnCpu.so: cannot open shared object file", "libQnnCpu.so"),
        ("", "did not take every node"),
    ],
)
def test_explain_other_failures(log: str, expected: str) -> None:
    """Known native failure patterns map to one line naming the QNN error."""
    assert expected in explain_failure("npu", log, FALLBACK)


def test_explain_falls_back_to_ort_message() -> None:
    """Without a known pattern the ORT message is used, minus its '[ONNXRuntimeError] : n : X :' prefix."""
    assert explain_failure("npu", "", "[ONNXRuntimeError] : 3 : NO_SUCHFILE : Load model from x failed") == (
        "Load model from x failed"
    )


def test_tiny_model_is_valid_onnx() -> None:
    """The hand-encoded probe model is a valid ONNX Add graph (checked by the onnx package when installed)."""
    onnx = pytest.importorskip("onnx")
    model = onnx.load_from_string(tiny_add_model())
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Add"]
    assert [i.name for i in model.graph.input] == ["x", "y"]


def test_nested_capture_nests() -> None:
    """A capture inside a capture (same thread) collects the inner text and restores the outer redirection."""
    before = (_fd_identity(1), _fd_identity(2))
    with capture_native_output() as outer:
        os.write(1, b"outer-before\n")
        with capture_native_output() as inner:
            os.write(1, b"inner\n")
        os.write(1, b"outer-after\n")
    assert (_fd_identity(1), _fd_identity(2)) == before
    assert "inner" in inner.text and "outer" not in inner.text
    assert "outer-before" in outer.text and "outer-after" in outer.text and "inner" not in outer.text
