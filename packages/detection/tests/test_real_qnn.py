"""The real QNN EP on this machine: HTP simulator usable, GPU backend unable to initialize."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

import numpy as np
import pytest
from detection_helpers import run_python

import qnnx_detection as qd
from qnnx_detection._tiny_model import tiny_add_model
from qnnx_detection.errors import (
    InvalidDeviceError,
    InvalidOptionsError,
    QnnxDetectionError,
    SessionCreationError,
)

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="asserts the x86_64 simulator's behaviour"
)

SOC = 60


def _fd_identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def test_probe_reports_the_simulator_and_a_gpu_that_cannot_initialize() -> None:
    """On x86_64 the NPU is the HTP simulator at soc 60 by default; the GPU backend could not initialize."""
    report = qd.probe(refresh=True)
    npu, gpu = report.backend("npu"), report.backend("gpu")
    assert npu.available, npu.reason
    assert npu.is_simulator
    assert npu.hardware_type == "CPU"
    assert (npu.soc_model, npu.soc_name, npu.htp_arch, npu.soc_source) == (60, "SC8380XP", 73, "default")
    assert npu.library_path == qd.backend_library("npu")
    assert not gpu.available
    assert not gpu.is_simulator
    assert "GPU backend could not initialize" in (gpu.reason or "")
    assert report.usable_devices == ("npu",)
    assert report.platform.machine == platform.machine()
    assert report.platform.system == platform.system()
    assert qd.is_available() and qd.is_available("npu") and not qd.is_available("gpu") and qd.is_available("cpu")
    assert report.elapsed_s > 0


def test_probe_is_cached_until_refreshed() -> None:
    """probe() returns the same object until refresh=True builds a new one."""
    first = qd.probe()
    assert qd.probe() is first
    fresh = qd.probe(refresh=True)
    assert fresh is not first
    assert fresh.usable_devices == first.usable_devices


def test_versions_match_installed_distributions() -> None:
    """Reported versions equal importlib.metadata's, and QAIRT comes from build_and_package_info."""
    import onnxruntime_qnn

    versions = qd.probe().versions
    assert versions.onnxruntime == importlib.metadata.version("onnxruntime")
    assert versions.onnxruntime_qnn == importlib.metadata.version("onnxruntime-qnn")
    assert versions.qairt == onnxruntime_qnn.build_and_package_info.qnn_version
    assert versions.python == platform.python_version()


def test_refresh_rereads_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """probe(refresh=True) re-reads QNNX_DISABLE: disabled, nothing is available and the reason names it."""
    monkeypatch.setenv("QNNX_DISABLE", "1")
    try:
        report = qd.probe(refresh=True)
        assert report.usable_devices == ()
        assert "QNNX_DISABLE" in (report.backend("npu").reason or "")
        assert not qd.is_available()
    finally:
        monkeypatch.delenv("QNNX_DISABLE")
        assert qd.probe(refresh=True).usable_devices == ("npu",)


def test_backend_library_paths() -> None:
    """npu/htp map to libQnnHtp and gpu to libQnnGpu, as shipped by onnxruntime-qnn; other names raise."""
    import onnxruntime_qnn

    assert qd.backend_library("npu") == onnxruntime_qnn.get_qnn_htp_path()
    assert qd.backend_library("HTP") == onnxruntime_qnn.get_qnn_htp_path()
    assert qd.backend_library("gpu") == onnxruntime_qnn.get_qnn_gpu_path()
    with pytest.raises(InvalidDeviceError, match="'npu', 'gpu'"):
        qd.backend_library("cpu")


def test_provider_options() -> None:
    """provider_options holds backend_path and soc_model as strings plus extra options."""
    opts = qd.provider_options("npu", soc_model=57, extra={"htp_performance_mode": "burst"})
    assert opts == {"backend_path": qd.backend_library("npu"), "soc_model": "57", "htp_performance_mode": "burst"}
    assert qd.provider_options("gpu", soc_model=60, extra={"soc_model": "60"})["soc_model"] == "60"


def test_provider_options_reports_every_problem() -> None:
    """Overriding backend_path, a contradicting soc_model and a bad value are all reported in one error."""
    with pytest.raises(InvalidOptionsError) as info:
        qd.provider_options("npu", soc_model=60, extra={"backend_path": "/x.so", "soc_model": "69", "vtcm_mb": 1.5})  # type: ignore[dict-item]
    assert isinstance(info.value, ValueError)
    assert len(info.value.problems) == 3
    assert "backend_path" in str(info.value)
    with pytest.raises(InvalidOptionsError, match="soc_model=-1"):
        qd.provider_options("npu", soc_model=-1)


def test_register_ep_is_idempotent() -> None:
    """register_ep returns the EP name every time and the EP's devices are listed by ORT."""
    import onnxruntime as ort

    assert qd.register_ep() == qd.EP_NAME == "QNNExecutionProvider"
    assert qd.register_ep() == qd.EP_NAME
    assert any(d.ep_name == qd.EP_NAME for d in ort.get_ep_devices())
    device = qd.find_ep_device("npu")
    assert device is not None and device.ep_name == qd.EP_NAME


def test_create_session_runs_a_tiny_graph_on_htp(tmp_path: object) -> None:
    """A session from bytes and one from a path both run x + y on HTP with fp16-level error."""
    x = np.linspace(-2, 2, 4, dtype=np.float32).reshape(1, 4)
    y = np.full((1, 4), 0.25, dtype=np.float32)
    session = qd.create_session(tiny_add_model(), "npu", soc_model=SOC)
    assert session.get_providers()[0] == qd.EP_NAME
    (got,) = session.run(None, {"x": x, "y": y})
    np.testing.assert_allclose(got, x + y, rtol=2e-3, atol=2e-3 * float(np.abs(x + y).max()))

    path = os.path.join(str(tmp_path), "add.onnx")
    with open(path, "wb") as f:
        f.write(tiny_add_model())
    import pathlib

    session = qd.create_session(
        pathlib.Path(path), "htp", soc_model=SOC, session_config={"session.intra_op.allow_spinning": "0"}
    )
    (got,) = session.run(None, {"x": x, "y": y})
    np.testing.assert_allclose(got, x + y, rtol=2e-3, atol=2e-3 * float(np.abs(x + y).max()))


def test_failed_gpu_session_names_device_and_cause(capfd: pytest.CaptureFixture[str]) -> None:
    """A GPU session fails with SessionCreationError(gpu, cause), chained to ORT's error, and prints nothing."""
    capfd.readouterr()
    before = (_fd_identity(1), _fd_identity(2))
    with pytest.raises(SessionCreationError) as info:
        qd.create_session(tiny_add_model(), "gpu", soc_model=SOC)
    err = info.value
    assert isinstance(err, RuntimeError) and isinstance(err, QnnxDetectionError)
    assert err.device == "gpu"
    assert err.cause.startswith("the QNN GPU backend could not initialize (QNN_BACKEND_ERROR_CANNOT_INITIALIZE)")
    assert "QNN_BACKEND_ERROR_CANNOT_INITIALIZE" in err.native_log
    assert err.__cause__ is not None
    assert "gpu" in str(err)
    assert (_fd_identity(1), _fd_identity(2)) == before
    seen = capfd.readouterr()
    assert seen.out == ""
    assert seen.err == ""
    print("still connected")
    sys.stdout.flush()
    assert "still connected" in capfd.readouterr().out


def test_nothing_reaches_stdout_or_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    """Probing and creating sessions (good and failing) print nothing on the process's stdout/stderr."""
    capfd.readouterr()
    qd.probe(refresh=True)
    qd.create_session(tiny_add_model(), "npu", soc_model=SOC)
    with pytest.raises(SessionCreationError):
        qd.create_session(tiny_add_model(), "gpu", soc_model=SOC)
    seen = capfd.readouterr()
    assert (seen.out, seen.err) == ("", "")


def test_fresh_process_prints_nothing() -> None:
    """In a fresh process (where the simulator prints its LIBNATIVE line) probe + session leave stdout empty."""
    code = (
        "import qnnx_detection as qd\n"
        "from qnnx_detection._tiny_model import tiny_add_model\n"
        "r = qd.probe()\n"
        "qd.create_session(tiny_add_model(), 'npu', soc_model=60)\n"
        "assert r.usable_devices == ('npu',), r\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == ""


def test_create_session_rejects_misuse_before_touching_qnn() -> None:
    """cpu as a device, non-model objects and a fallback key in session_config are errors naming the fix."""
    with pytest.raises(InvalidDeviceError):
        qd.create_session(tiny_add_model(), "cpu", soc_model=SOC)
    with pytest.raises(InvalidOptionsError, match="model must be"):
        qd.create_session(123, "npu", soc_model=SOC)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionsError, match="allow_cpu_fallback"):
        qd.create_session(
            tiny_add_model(), "npu", soc_model=SOC, session_config={"session.disable_cpu_ep_fallback": "0"}
        )


def test_create_session_accepts_graph_optimization_level() -> None:
    """graph_optimization_level is passed to SessionOptions (the session still runs on QNN)."""
    import onnxruntime as ort

    session = qd.create_session(
        tiny_add_model(), "npu", soc_model=SOC, graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    assert session.get_providers()[0] == qd.EP_NAME


def test_invalid_soc_model_fails_with_a_clear_cause() -> None:
    """A SoC number QAIRT does not know fails session creation with QNN_DEVICE_ERROR_INVALID_CONFIG as the cause."""
    with pytest.raises(SessionCreationError) as info:
        qd.create_session(tiny_add_model(), "npu", soc_model=9999)
    assert "QNN_DEVICE_ERROR_INVALID_CONFIG" in info.value.cause


def test_cpu_fallback_session_where_qnn_takes_nothing_is_refused() -> None:
    """With allow_cpu_fallback=True a GPU session that would run entirely on the CPU raises, naming QNN's reason."""
    with pytest.raises(SessionCreationError) as info:
        qd.create_session(tiny_add_model(), "gpu", soc_model=SOC, allow_cpu_fallback=True)
    assert "QNN_BACKEND_ERROR_CANNOT_INITIALIZE" in info.value.cause


def test_cpu_fallback_records_placement() -> None:
    """With allow_cpu_fallback=True node_placement shows the Add on QNN; strict sessions record nothing."""
    session = qd.create_session(tiny_add_model(), "npu", soc_model=SOC, allow_cpu_fallback=True)
    assert qd.node_placement(session) == {qd.EP_NAME: ("add",)}
    assert qd.node_placement(qd.create_session(tiny_add_model(), "npu", soc_model=SOC)) is None


def test_partial_placement_and_unsupported_only_graphs() -> None:
    """Erf alone (rejected by HTP) is refused even with fallback; Erf -> Relu splits between CPU and QNN."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    def model(nodes: list[object]) -> bytes:
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])],
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 9
        onnx.checker.check_model(m)
        return m.SerializeToString()

    erf_only = model([helper.make_node("Erf", ["x"], ["z"], name="erf")])
    with pytest.raises(SessionCreationError, match="took none"):
        qd.create_session(erf_only, "npu", soc_model=SOC, allow_cpu_fallback=True)
    with pytest.raises(SessionCreationError, match="did not take every node"):
        qd.create_session(erf_only, "npu", soc_model=SOC)
    mixed = model(
        [helper.make_node("Erf", ["x"], ["t"], name="erf"), helper.make_node("Relu", ["t"], ["z"], name="relu")]
    )
    session = qd.create_session(mixed, "npu", soc_model=SOC, allow_cpu_fallback=True)
    assert qd.node_placement(session) == {qd.EP_NAME: ("relu",), "CPUExecutionProvider": ("erf",)}
    x = np.array([[-1.0, 0.0, 0.5, 2.0]], dtype=np.float32)
    (got,) = session.run(None, {"x": x})
    import math

    want = np.maximum(np.vectorize(math.erf)(x), 0).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
