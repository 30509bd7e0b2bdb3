"""Graphs from the real exporter that run fully on QNN HTP must be reported supported.

A false "unsupported" breaks the backend's strict mode, so this is checked on real exporter output
(torch.onnx.export dynamo=True, opset 21) and confirmed on the HTP simulator.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import qnnx_opcheck as oc

torch = pytest.importorskip("torch")


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(torch.relu(self.a(x))))


class _CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.p = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.p(torch.relu(self.bn(self.c(x)))), 1))


def _models() -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    return {
        "mlp": (_MLP(), (torch.randn(4, 16),)),
        "cnn": (_CNN(), (torch.randn(2, 3, 16, 16),)),
        "transformer": (
            torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True),
            (torch.randn(2, 5, 32),),
        ),
    }


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """The simulator prints a LIBNATIVE line on fd 1 at the first session of a process."""
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three models exported once per module with the dynamo exporter at opset 21."""
    out = {}
    root = tmp_path_factory.mktemp("exported")
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        for name, (mod, args) in _models().items():
            mod.eval()
            with torch.no_grad():
                prog = torch.onnx.export(mod, args, dynamo=True, verbose=False, opset_version=21)
            path = root / f"{name}.onnx"
            prog.save(str(path))
            out[name] = path
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    return out


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_exported_model_is_supported(exported: dict[str, Path], name: str) -> None:
    """The exporter's MLP, CNN and TransformerEncoderLayer are reported fully supported on HTP."""
    rep = oc.check_model(exported[name], "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    assert rep.supported, rep.summary() + "\n" + "\n".join(f"{v.node_name}: {v.reason}" for v in rep.unsupported)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_exported_model_runs_fully_on_qnn(exported: dict[str, Path], name: str) -> None:
    """Ground truth for the test above: the same file runs on QNN HTP with CPU fallback disabled."""
    ort = pytest.importorskip("onnxruntime")
    oq = pytest.importorskip("onnxruntime_qnn")
    import numpy as np

    ort.set_default_logger_severity(3)
    if not any(d.ep_name == oq.get_ep_name() for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_name == oq.get_ep_name())
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([dev], {"backend_path": oq.get_qnn_htp_path(), "soc_model": "60"})
    with _quiet_stdout():
        sess = ort.InferenceSession(str(exported[name]), sess_options=so)
    feeds = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
    assert all(np.isfinite(o).all() for o in sess.run(None, feeds))


@pytest.fixture(scope="module")
def quantized(exported: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """The exported models quantized to QDQ the way QNN users do (ORT quantizer, QNN config, uint8 weights)."""
    np = pytest.importorskip("numpy")
    q = pytest.importorskip("onnxruntime.quantization")
    qnn = pytest.importorskip("onnxruntime.quantization.execution_providers.qnn")
    import onnx

    class Reader(q.CalibrationDataReader):
        def __init__(self, name: str, shape: list[int]) -> None:
            rng = np.random.default_rng(0)
            self.data = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, object] | None:
            return next(self.data, None)

    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for name, path in exported.items():
        inp = onnx.load(path, load_external_data=False).graph.input[0]
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        for act in ("QUInt8", "QUInt16"):
            cfg = qnn.get_qnn_qdq_config(
                str(path),
                Reader(inp.name, shape),
                activation_type=getattr(q.QuantType, act),
                weight_type=q.QuantType.QUInt8,
            )
            target = root / f"{name}_{act}.onnx"
            q.quantize(str(path), str(target), cfg)
            out[(name, act)] = target
    return out


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("act", ["QUInt8", "QUInt16"])
def test_quantized_model_is_supported_and_runs(quantized: dict[tuple[str, str], Path], name: str, act: str) -> None:
    """QDQ versions (uint8/uint16 activations) are reported supported and do run fully on QNN HTP."""
    path = quantized[(name, act)]
    rep = oc.check_model(path, "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    assert rep.supported, rep.summary()
    assert any(v.dtype and v.dtype.startswith("qdq_") for v in rep.verdicts)
    test_exported_model_runs_fully_on_qnn({name: path}, name)
