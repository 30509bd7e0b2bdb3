"""Mixture-of-experts layers with transformers' default grouped_mm experts: the static-shape rewrites of qnnx_export's
_moe compute what PyTorch computes, and the whole routing exports and runs on QNN."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterator

import pytest
import torch
from export_capture import capture, only
from export_qnn_helpers import cpu_session, qnn_session, rel_err, run_exported
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export._moe import counts_cumsum, dense_grouped_mm, repeated_rows, rewrite_moe_node
from qnnx_export.errors import ExportError, InvalidOptionsError

transformers_moe = pytest.importorskip("transformers.integrations.moe")  # registers transformers::grouped_mm_fallback

TOP_K = 2


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """The backend exports under the grad mode of the call; these tests model inference (no_grad)."""
    with torch.no_grad():
        yield


def _grouped_loop(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """transformers' grouped_mm fallback: each group's rows by its expert, rows past the last end zero."""
    out = torch.zeros(x.shape[0], w.shape[2])
    start = 0
    for e, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end] @ w[e]
        start = end
    return out


@given(
    counts=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    tail=st.integers(0, 3),
    k=st.integers(1, 5),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_dense_grouped_mm_equals_the_grouped_loop(counts: list[int], tail: int, k: int, n: int, seed: int) -> None:
    """Every row takes its own group's expert product, and rows past the last group end are zero, as in the loop."""
    g = torch.Generator().manual_seed(seed)
    rows = sum(counts) + tail
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(len(counts), k, n, generator=g)
    offs = torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32)
    torch.testing.assert_close(dense_grouped_mm(x, w, offs), _grouped_loop(x, w, offs))


def test_dense_grouped_mm_ignores_other_experts_overflow() -> None:
    """An expert whose product is infinite on rows it does not own leaves those rows finite (selected, not masked
    by a multiplication, which would make inf * 0 = NaN)."""
    x = torch.ones(3, 2)
    w = torch.stack([torch.ones(2, 2), torch.full((2, 2), float("inf"))])
    out = dense_grouped_mm(x, w, torch.tensor([3, 3], dtype=torch.int32))
    assert torch.equal(out, torch.full((3, 2), 2.0))


@given(
    low=st.integers(-5, 5),
    bins=st.integers(2, 8),
    ids=st.lists(st.integers(-8, 16) | st.sampled_from([2**32 + 1, -(2**32) + 2]), min_size=1, max_size=20),
    dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_counts_cumsum_equals_cumsum_of_histc(low: int, bins: int, ids: list[int], dtype: torch.dtype) -> None:
    """Counting integer ids per bin gives torch.histc's counts, out-of-range ids dropped (int64 ids past int32
    included), cumulated in ``dtype`` (two bins or more: with one, min == max and histc takes its range from the
    data, which the rewrite leaves alone)."""
    values = torch.tensor(ids)
    ref = torch.cumsum(torch.histc(values.float(), bins=bins, min=low, max=low + bins - 1), 0, dtype=dtype)
    got = counts_cumsum(values, low, bins, dtype)
    assert got.dtype == dtype and torch.equal(got, ref)


@given(
    rows=st.integers(1, 6),
    k=st.integers(1, 4),
    data=st.data(),
)
def test_repeated_rows_equals_floor_division_index(rows: int, k: int, data: st.DataObject) -> None:
    """x.repeat_interleave(k)[i] is x[i // k] for every index PyTorch accepts, negative ones included."""
    index = torch.tensor(data.draw(st.lists(st.integers(-k * rows, k * rows - 1), min_size=1, max_size=10)))
    x = torch.randn(rows, 3)
    assert torch.equal(repeated_rows(x, index, k), x[index // k])


def _routing(experts: int, bins_high: int | None = None) -> Callable[..., torch.Tensor]:
    """transformers' grouped_mm experts forward reduced to one projection: sort by expert, group ends from histc and
    cumsum, the grouped product, and the inverse permutation back to the tokens."""
    high = experts - 1 if bins_high is None else bins_high

    def routed(hidden: torch.Tensor, top_k_index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        expert_ids = top_k_index.reshape(-1)
        ids_g, perm = torch.sort(expert_ids)
        x_g = hidden[perm // TOP_K]
        counts = torch.histc(ids_g.float(), bins=experts, min=0, max=high)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        out = torch.ops.transformers.grouped_mm_fallback(x_g, weight, offs=offs)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        return out[inv].view(hidden.shape[0], TOP_K, -1).sum(1)

    return routed


def _inputs(experts: int, tokens: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, 8, generator=g)
    top_k_index = torch.stack([torch.randperm(max(experts, TOP_K), generator=g)[:TOP_K] for _ in range(tokens)])
    top_k_index = top_k_index.clamp(max=experts - 1)
    return hidden, top_k_index, torch.randn(experts, 8, 16, generator=g)


def test_routing_exports_directly_and_runs_on_qnn() -> None:
    """The grouped_mm routing exports through the direct translator and matches eager on the CPU EP (exactly the
    selected products) and on the HTP simulator (fp16)."""
    fn, args = _routing(4), _inputs(4)
    cap = only(capture(fn, *args)[0])
    exported = qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    assert exported.exporter == "fast"
    ref = fn(*args)
    cpu = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    assert rel_err(cpu[0] if isinstance(cpu, (tuple, list)) else cpu, ref) <= 1e-5
    qnn = run_exported(qnn_session(exported.model_bytes()), exported, cap.example_inputs)
    assert rel_err(qnn[0] if isinstance(qnn, (tuple, list)) else qnn, ref) <= 2e-2


@settings(max_examples=6)
@given(experts=st.integers(2, 6), tokens=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_routing_export_matches_eager_for_any_routing(experts: int, tokens: int, seed: int) -> None:
    """Property: whatever the experts' count, the tokens and their chosen experts (experts that no token chose
    included), the exported routing gives eager's result on the CPU EP."""
    fn, args = _routing(experts), _inputs(experts, tokens, seed)
    cap = only(capture(fn, *args)[0])
    exported = qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    got = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    assert rel_err(got[0] if isinstance(got, (tuple, list)) else got, fn(*args)) <= 1e-5


def test_the_dense_cost_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The export logs each grouped product it computes densely, with its rows and experts (the cost a user pays)."""
    fn, args = _routing(4), _inputs(4)
    cap = only(capture(fn, *args)[0])
    with caplog.at_level(logging.INFO, logger="qnnx_export._moe"):
        qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    assert any("12 rows x 4 experts (4 expert products per row instead of 1)" in r.message for r in caplog.records)


def test_more_experts_than_max_dense_experts_is_an_error_naming_the_option() -> None:
    """Above max_dense_experts the export refuses the dense form and says which option accepts it."""
    fn, args = _routing(4), _inputs(4)
    cap = only(capture(fn, *args)[0])
    with pytest.raises(ExportError, match=r"4 experts.*max_dense_experts=3"):
        qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis, options=qe.ExportOptions(max_dense_experts=3))


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "64"])
def test_max_dense_experts_must_be_a_positive_int(value: object) -> None:
    """A max_dense_experts that is not an int >= 1 is refused with the accepted values."""
    with pytest.raises(InvalidOptionsError, match="max_dense_experts"):
        qe.ExportOptions(max_dense_experts=value)  # type: ignore[arg-type]  # the bad value under test


@pytest.mark.parametrize(("experts", "high", "rewritten"), [(4, 3, True), (4, 4, False), (4, 2, False), (1, 0, False)])
def test_histc_counts_are_rewritten_only_when_each_bin_holds_one_integer(
    experts: int, high: int, rewritten: bool
) -> None:
    """cumsum(histc(ids.float())) is counted on the integers only when its bins are the integers min..max (min < max);
    other bins keep histc (whose float counts then stay where opcheck puts them)."""
    fn, args = _routing(experts, bins_high=high), _inputs(experts)
    cap = only(capture(fn, *args)[0])
    cumsum = next(n for n in cap.gm.graph.nodes if n.target is torch.cumsum)
    assert rewrite_moe_node(cumsum) is rewritten
    assert (cumsum.target is counts_cumsum) is rewritten


def test_floor_division_index_is_rewritten_only_for_a_positive_int_divisor() -> None:
    """x[i // k] becomes the repeated rows for a positive int k; a tensor divisor is left as it is."""

    def f(x: torch.Tensor, i: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[i // 2], x[i // k]

    x, i, k = torch.randn(4, 3), torch.tensor([0, 5, 7, -1]), torch.tensor(2)
    cap = only(capture(f, x, i, k)[0])
    gets = [n for n in cap.gm.graph.nodes if n.target is operator.getitem]
    assert [rewrite_moe_node(n) for n in gets] == [True, False]
    cap.gm.recompile()
    got = cap.gm(*cap.example_inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, f(x, i, k), strict=True))
