"""Length buckets: a dynamic sequence length is served by a few static QNN graphs, and only where padding is neutral."""

from __future__ import annotations

import pytest
import torch
from integration_helpers import assert_close_fp16

import qnnx_backend
from qnnx_backend.errors import UnsupportedGraphError

LENGTHS = (5, 9, 13, 17, 22, 29, 33, 41, 50, 61, 70, 77)


def _encoder(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "bert":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
        )
        return BertModel(cfg).eval()
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=100, dim=32, n_layers=1, n_heads=4, hidden_dim=64)
    return DistilBertModel(cfg).eval()


def _check_lengths(model: torch.nn.Module, compiled: object, lengths: tuple[int, ...]) -> None:
    """Call ``compiled`` at each length (a batch of 2, the second half-masked) and compare with eager."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n in lengths:
            ids = torch.randint(1, 100, (2, n), generator=generator)
            mask = torch.ones(2, n, dtype=torch.long)
            mask[1, n // 2 :] = 0
            got = compiled(input_ids=ids, attention_mask=mask).last_hidden_state  # type: ignore[operator]
            assert_close_fp16(got, model(input_ids=ids, attention_mask=mask).last_hidden_state, rel=5e-2)


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_twelve_lengths_compile_at_most_five_graphs(kind: str) -> None:
    """12 prompt lengths from 5 to 77 (with attention masks) need at most 5 static QNN graphs, all right."""
    model = _encoder(kind)
    _check_lengths(model, torch.compile(model, backend="qnn", options={"soc_model": 60}), LENGTHS)
    reports = qnnx_backend.compile_reports()
    assert all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert len(reports) <= 5, [r.summary() for r in reports]
    assert any(r.bucket is not None for r in reports)


def test_dynamic_true_serves_lengths_from_buckets_on_the_npu() -> None:
    """torch.compile(dynamic=True) on BERT: Dynamo passes the modules' eps, dropout p and attention scaling as 0-d
    tensors read by .item(); each is made a constant of its value, and every length runs on QNN, right (before, the
    first call raised DataDependentOutputException)."""
    model = _encoder("bert")
    options = {"soc_model": 60, "strict": True}
    _check_lengths(model, torch.compile(model, backend="qnn", options=options, dynamic=True), LENGTHS[:6])
    reports = qnnx_backend.compile_reports()
    assert reports and all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert any(r.bucket is not None for r in reports)


class _MeanPool(torch.nn.Module):
    """Averages over the sequence without a mask: zeros appended to the sequence change the mean."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).mean(1)


def test_mean_over_the_sequence_is_not_padded() -> None:
    """A model that is not pad-neutral is detected and compiles exact sizes (and stays right)."""
    model = _MeanPool().eval()
    compiled = torch.compile(model, backend="qnn", options={"soc_model": 60})
    with torch.no_grad():
        for n in (5, 9, 13):
            x = torch.randn(2, n, 8)
            assert_close_fp16(compiled(x), model(x))
    reports = qnnx_backend.compile_reports()
    assert len(reports) == 3 and all(r.bucket is None for r in reports)


def test_not_neutral_under_strict_raises() -> None:
    """Under strict, padding that is not neutral raises and names the fix (buckets=None)."""
    model = _MeanPool().eval()
    options = {"soc_model": 60, "strict": True, "device": "npu"}
    compiled = torch.compile(model, backend="qnn", options=options)
    with torch.no_grad():
        compiled(torch.randn(2, 5, 8))
        with pytest.raises(UnsupportedGraphError, match="buckets=None"):
            compiled(torch.randn(2, 9, 8))


def test_buckets_none_compiles_exact_sizes() -> None:
    """buckets=None keeps one static graph per size."""
    model = torch.nn.Linear(8, 8).eval()
    compiled = torch.compile(model, backend="qnn", options={"soc_model": 60, "buckets": None})
    with torch.no_grad():
        for n in (3, 5, 7):
            x = torch.randn(n, 8)
            assert_close_fp16(compiled(x), model(x))
    assert [r.bucket for r in qnnx_backend.compile_reports()] == [None, None, None]
