"""fingerprint(): cheap, stable and sensitive to everything that changes the export."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from export_capture import capture, only
from export_models_small import CONTRACT_MODELS
from hypothesis import given
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export import _torch_onnx


def _fp(model: nn.Module, x: torch.Tensor, options: qe.ExportOptions | None = None) -> str:
    cap = only(capture(model, x)[0])
    return qe.fingerprint(cap.gm, cap.example_inputs, cap.analysis, options=options)


def test_hex_and_repeatable() -> None:
    """The fingerprint is 64 hex chars and equal for two traces of the same model and inputs."""
    model, x = CONTRACT_MODELS["cnn"]()
    a, b = _fp(model, x), _fp(model, x)
    assert a == b and len(a) == 64 and int(a, 16) >= 0


def test_runs_no_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """Computing a fingerprint never calls the ONNX exporter."""

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("fingerprint must not export")

    monkeypatch.setattr(_torch_onnx, "_export_program", boom)
    model, x = CONTRACT_MODELS["mlp"]()
    assert _fp(model, x)


@given(index=st.integers(0, 10_000), delta=st.sampled_from([1e-3, -1.0, 1e-7]))
def test_any_weight_change_changes_it(index: int, delta: float) -> None:
    """Changing any single weight element changes the fingerprint."""
    model, x = CONTRACT_MODELS["mlp"]()
    before = _fp(model, x)
    params = [p for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    i = index % flat.numel()
    with torch.no_grad():
        for p in params:
            if i < p.numel():
                p.view(-1)[i] += delta
                break
            i -= p.numel()
    assert _fp(model, x) != before


def test_buffer_change_changes_it() -> None:
    """A BatchNorm running statistic (a buffer, not a parameter) is covered too."""
    model, x = CONTRACT_MODELS["cnn"]()
    before = _fp(model, x)
    with torch.no_grad():
        model.bn.running_var[0] += 0.25
    assert _fp(model, x) != before


def test_input_spec_and_options_change_it() -> None:
    """Another input shape or dtype, or other export options, give another fingerprint."""
    model, x = CONTRACT_MODELS["mlp"]()
    base = _fp(model, x)
    assert _fp(model, torch.randn(3, 8)) != base
    assert _fp(model.double(), x.double()) != base
    model.float()
    assert _fp(model, x, qe.ExportOptions(opset=21)) != base
    assert _fp(model, x, qe.ExportOptions(passes=())) != base
    assert _fp(model, x) == base


def test_graph_change_changes_it() -> None:
    """A different op with the same weights changes the fingerprint."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)

    def f_relu(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(x))

    def f_tanh(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(lin(x))

    x = torch.randn(2, 4)
    a = only(capture(f_relu, x)[0])
    b = only(capture(f_tanh, x)[0])
    assert qe.fingerprint(a.gm, a.example_inputs) != qe.fingerprint(b.gm, b.example_inputs)


def test_weight_digest_follows_the_tensors_it_is_given() -> None:
    """One analysis, two sets of weights (float32, then the float16 copies an fp16 export reads, then an in-place
    update): each gets the digest a fresh analysis gives it, not the first one's memoized digest."""
    from qnnx_export._fingerprint import weight_digest

    model, x = CONTRACT_MODELS["mlp"]()
    cap = only(capture(model, x)[0])
    args = list(cap.example_inputs)
    half = [a.half() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    first = weight_digest(args, cap.analysis)
    second = weight_digest(half, cap.analysis)
    assert first != second
    assert second == weight_digest(half, only(capture(model, x)[0]).analysis)
    weight = next(args[i] for i in cap.analysis.param_indices)
    with torch.no_grad():
        weight.add_(1.0)
    assert weight_digest(args, cap.analysis) not in (first, second)
