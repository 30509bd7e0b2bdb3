"""Fourier transforms on the NPU: torch.fft and torch.stft run wholly on QNN (MatMuls with constant matrices) under
strict=True, and a graph that returns a complex tensor gives eager's complex dtype and values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from integration_helpers import assert_close_fp16, on_qnn_strict

NPU_STRICT = {"device": "npu", "soc_model": 60, "strict": True}


def _on_qnn(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    """``fn`` compiled for the NPU under strict=True (with the first call's accuracy guard) and called once; every
    graph must be wholly on QNN."""
    return on_qnn_strict(fn, *args, options=NPU_STRICT)


def _parts(z: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(z.resolve_conj()) if z.is_complex() else z


class _LogMel(torch.nn.Module):
    """An audio front end: a Hann-windowed STFT, its power spectrum, a mel-like filter bank, then the log."""

    def __init__(self, n_fft: int = 64, hop: int = 16, mels: int = 16) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("bank", torch.rand(mels, n_fft // 2 + 1, generator=torch.Generator().manual_seed(0)))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(audio, self.n_fft, self.hop, window=self.window, return_complex=True)
        power = torch.view_as_real(spec).pow(2).sum(-1)
        return torch.log(self.bank @ power + 1e-3)


def test_log_mel_front_end_runs_wholly_on_qnn() -> None:
    """A log-mel front end (stft with reflect padding and a Hann window, power, filter bank, log) runs on the
    NPU with no CPU-EP node and gives eager's features."""
    audio = torch.randn(2, 800, generator=torch.Generator().manual_seed(1)) * 0.3
    model = _LogMel().eval()
    with torch.no_grad():
        ref = model(audio)
    assert_close_fp16(_on_qnn(model, audio), ref, rel=2e-2, cos=0.9999)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.fft.rfft(x, norm="ortho"),
        lambda x: torch.fft.fft2(x),
        lambda x: torch.fft.ifftn(torch.fft.rfftn(x, dim=(0, 2)), dim=(0, 1), norm="forward"),
        lambda x: torch.fft.irfft(torch.fft.rfft(x) * torch.linspace(1.0, 0.0, x.shape[-1] // 2 + 1), n=x.shape[-1]),
        lambda x: torch.fft.hfft(torch.fft.ihfft(x, dim=1), dim=1, n=x.shape[1]),
    ],
    ids=["rfft-ortho", "fft2", "rfftn-then-ifftn", "low-pass-filter", "ihfft-hfft"],
)
def test_transforms_give_eager_values_on_qnn(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Transforms on the NPU, complex results included, come back with eager's dtype, shape and values (within
    float16 error)."""
    x = torch.randn(4, 6, 24, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = fn(x)
    got = _on_qnn(fn, x)
    assert got.dtype == ref.dtype
    assert_close_fp16(_parts(got), _parts(ref), rel=5e-3, cos=0.99999)


def test_long_transform_keeps_fp16_accuracy() -> None:
    """A length-2048 rfft (the longest written as a MatMul) stays within 1e-3 of its largest magnitude on HTP."""
    x = torch.rand(2, 2048, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = torch.fft.rfft(x)
    assert_close_fp16(_parts(_on_qnn(torch.fft.rfft, x)), _parts(ref), rel=1e-3, cos=0.99999)


def test_complex_output_beyond_float16_is_refused() -> None:
    """A spectrum whose real part eager computes beyond float16's range (the sum of 128 values of 1000) is refused
    for the NPU by the output range check, which reads a complex output's parts, instead of coming back saturated."""
    x = torch.full((2, 128), 1000.0)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="65504"):
        torch.compile(torch.fft.rfft, backend="qnn", options=NPU_STRICT)(x)
