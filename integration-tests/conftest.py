"""Shared set-up of the end-to-end tests: Hypothesis profiles, a clean Dynamo per test, model helpers."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", max_examples=5, deadline=None, derandomize=True, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch and sees only its own compile reports."""
    import qnnx_backend

    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


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
