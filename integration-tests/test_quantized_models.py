"""Real architectures quantized through calibrate(): tiny Hugging Face ResNet, ConvNeXt, ViT and BERT run as QDQ
graphs on the QNN HTP simulator near float eager PyTorch on held-out inputs; a model quantization would harm falls
back to float by itself, with its figure in the report."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import cosine
from integration_models import tiny_hf

import qnnx_backend
from qnnx_backend.errors import QnnFallbackWarning
from qnnx_testkit.strategies import seeds

SAMPLES = 16
HELD_OUT = range(100, 106)
# Held-out cosine against float eager: what a16w8 and a8w8 keep on these models (measured: a16w8 >= 0.9997,
# a8w8 >= 0.998).
MIN_COSINE = {"a16w8": 0.999, "a8w8": 0.99}


def _calibrated(model: torch.nn.Module, make, quantize: object) -> torch.nn.Module:
    compiled = torch.compile(model, backend="qnn", options={"soc_model": 60, "quantize": quantize})
    with torch.no_grad(), qnnx_backend.calibrate(compiled):
        for seed in range(SAMPLES):
            compiled(make(seed))
    return compiled


@pytest.mark.parametrize(
    ("kind", "scheme"),
    [
        ("resnet", "a16w8"),
        ("convnext", "a16w8"),
        ("vit", "a16w8"),
        ("bert", "a16w8"),
        ("resnet", "a8w8"),
        ("bert", "a8w8"),
    ],
)
def test_architecture_runs_quantized_on_qnn_near_float(kind: str, scheme: str) -> None:
    model, make = tiny_hf(kind)
    compiled = _calibrated(model, make, scheme)
    with torch.no_grad():
        worst = min(cosine(compiled(make(seed)), model(make(seed))) for seed in HELD_OUT)
    (report,) = qnnx_backend.compile_reports()
    assert report.on_qnn and report.quantization is not None and report.quantization.used, report.summary()
    assert worst >= MIN_COSINE[scheme], f"{kind} {scheme}: held-out cosine {worst:.5f}; {report.summary()}"


def test_a_model_quantization_would_harm_runs_float_and_says_so() -> None:
    """A tiny MobileNetV2 (depthwise convolutions) with one weight scale per tensor loses too much with a16w8 (about
    18 dB on its own calibration inputs): below the default min_sqnr it runs in float on QNN, with a warning naming
    the SQNR, and stays right. With the default per-channel weights the same model passes the floor (about 21.5 dB)."""
    model, make = tiny_hf("mobilenet_v2")
    with pytest.warns(QnnFallbackWarning, match=r"SQNR .* below min_sqnr"):
        compiled = _calibrated(model, make, {"per_channel": False})
    with torch.no_grad():
        assert cosine(compiled(make(100)), model(make(100))) >= 0.999
    (report,) = qnnx_backend.compile_reports()
    assert report.quantization is not None and not report.quantization.used
    assert report.quantization.sqnr_db is not None and report.quantization.sqnr_db < 20
    per_tensor = report.quantization.sqnr_db
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    _calibrated(model, make, "a16w8")
    (report,) = qnnx_backend.compile_reports()
    assert report.quantization is not None and report.quantization.used, report.summary()
    assert report.quantization.sqnr_db is not None and report.quantization.sqnr_db > per_tensor + 2, report.summary()


@given(
    channels=st.sampled_from([4, 8, 16]),
    depth=st.integers(1, 3),
    conv=st.booleans(),
    seed=seeds(),
)
def test_random_small_graphs_quantized_a16w8_keep_30_db(channels: int, depth: int, conv: bool, seed: int) -> None:
    """Property: a random small conv or MLP stack quantized a16w8 keeps at least 30 dB SQNR against float eager on
    its calibration inputs, and runs wholly on QNN."""
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Conv2d(channels, channels, 3, padding=1) if conv else torch.nn.Linear(channels, channels)]
        layers += [torch.nn.ReLU() if conv else torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).eval()
    shape = (1, channels, 8, 8) if conv else (4, channels)

    def make(s: int) -> torch.Tensor:
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed + s))

    with warnings.catch_warnings():
        warnings.simplefilter("error", QnnFallbackWarning)
        _calibrated(model, make, "a16w8")
    (report,) = qnnx_backend.compile_reports()
    assert report.on_qnn and set(report.placement) == {"QNNExecutionProvider"}, report.summary()
    assert report.quantization is not None and report.quantization.used
    assert report.quantization.sqnr_db is not None and report.quantization.sqnr_db >= 30, report.summary()
