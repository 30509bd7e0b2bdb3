"""The device chain NPU -> GPU -> eager, driven through qnnx-detection's public fake environments."""

from __future__ import annotations

import attrs
import pytest
import torch

import qnnx_backend
from qnnx_backend.errors import QnnDeviceError
from qnnx_detection.testing import FakeEnvironment, use_environment


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    yield
    torch._dynamo.reset()


def _compile_and_run(options=None):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options=options)(x)
        expected = model(x)
    return got, expected, qnnx_backend.compile_reports()[-1]


def test_no_qnn_at_all_runs_pytorch_and_says_why():
    """Without onnxruntime-qnn, auto runs the PyTorch graph (exactly eager) and each device's reason is recorded."""
    with use_environment(FakeEnvironment.without_qnn()):
        got, expected, report = _compile_and_run()
    assert torch.equal(got, expected)
    assert report.device == "eager"
    assert [a.device for a in report.attempts] == ["npu", "gpu"]
    assert all("onnxruntime-qnn" in a.reason for a in report.attempts)


def test_no_qnn_with_explicit_npu_under_strict_raises_the_probe_reason():
    """device='npu' with strict=True and no QNN raises QnnDeviceError with the install hint."""
    with use_environment(FakeEnvironment.without_qnn()), pytest.raises(QnnDeviceError, match="onnxruntime-qnn"):
        _compile_and_run({"device": "npu", "strict": True})


def test_auto_with_strict_and_nothing_usable_raises_listing_every_device():
    """device='auto' with strict=True raises when no device of the chain takes the graph, listing each reason."""
    with use_environment(FakeEnvironment.without_qnn()), pytest.raises(QnnDeviceError) as info:
        _compile_and_run({"strict": True})
    assert "npu:" in str(info.value) and "gpu:" in str(info.value)


def test_a_gpu_that_the_probe_calls_usable_is_really_tried():
    """When only the GPU looks usable, auto really builds a GPU session; here it fails, so eager runs."""
    env = attrs.evolve(FakeEnvironment.snapdragon(), libraries=frozenset({"gpu"}))
    with use_environment(env):
        got, expected, report = _compile_and_run()
    assert torch.equal(got, expected)
    assert [a.device for a in report.attempts] == ["npu", "gpu"]
    assert report.attempts[0].reason.startswith("skipped")
    gpu = report.attempts[1]
    assert not gpu.ok and not gpu.reason.startswith("skipped") and "initiali" in gpu.reason.lower()


@pytest.mark.parametrize("environ", [{"QNNX_DEVICE": "cpu"}, {"QNNX_DISABLE": "1"}])
def test_environment_overrides_send_auto_to_pytorch(environ):
    """QNNX_DEVICE=cpu and QNNX_DISABLE=1 make device='auto' run the PyTorch graph."""
    with use_environment(FakeEnvironment.host_simulator(environ=environ)):
        got, expected, report = _compile_and_run()
    assert torch.equal(got, expected)
    assert report.device == "eager"


def test_is_available_reads_the_probe():
    """is_available() follows the probe: True on a Snapdragon fake, False without QNN; bad names are refused."""
    with use_environment(FakeEnvironment.snapdragon(gpu=False)):
        assert qnnx_backend.is_available() and qnnx_backend.is_available("npu")
        assert not qnnx_backend.is_available("gpu")
    with use_environment(FakeEnvironment.without_qnn()):
        assert not qnnx_backend.is_available()
    with pytest.raises(ValueError, match="accepted"):
        qnnx_backend.is_available("tpu")


def test_a_graph_that_puts_nothing_on_the_gpu_is_not_reported_on_an_absent_gpu():
    """A constant beyond float16 (the NPU refuses it; with nothing else to compute it is not split off) folds to
    nothing on QNN: the GPU, absent here, is not claimed."""

    def fn(x):
        return torch.full((3,), 1e6) + x.new_zeros(())

    with torch.no_grad():
        got = torch.compile(fn, backend="qnn", options={"soc_model": 60})(torch.ones(2))
    report = qnnx_backend.compile_reports()[-1]
    assert torch.equal(got, torch.full((3,), 1e6))
    assert report.device == "eager" and [a.device for a in report.attempts] == ["npu", "gpu"]
    assert "float16" in report.attempts[0].reason and "Adreno" in report.attempts[1].reason
