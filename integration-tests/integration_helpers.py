"""Comparison helpers of the end-to-end tests: QNN HTP (fp16) results against eager PyTorch."""

from __future__ import annotations

import torch


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|: the fp16-level tolerance is relative to the output's scale."""
    ref64 = ref.detach().double()
    return ((got.detach().double() - ref64).abs().max() / ref64.abs().max()).item()


def cosine(got: torch.Tensor, ref: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(
        got.detach().double().flatten(), ref.detach().double().flatten(), dim=0
    ).item()


def assert_close_fp16(got: torch.Tensor, ref: torch.Tensor, rel: float = 2e-2, cos: float = 0.999) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert ref.abs().max() > 1e-2, "reference output is degenerate: the comparison would mean nothing"
    assert rel_error(got, ref) <= rel, f"max|err|/max|ref| = {rel_error(got, ref):.3g} > {rel}"
    assert cosine(got, ref) >= cos, f"cosine {cosine(got, ref):.6f} < {cos}"
