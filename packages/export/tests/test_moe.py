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
from qnnx_export._moe import (
    choose_expert_form,
    counts_cumsum,
    dense_grouped_mm,
    gathered_grouped_mm,
    repeated_rows,
    rewrite_moe_node,
)
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


FORMS = [dense_grouped_mm, gathered_grouped_mm]


@pytest.mark.parametrize("form", FORMS)
@given(
    counts=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    tail=st.integers(0, 3),
    k=st.integers(1, 5),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_static_grouped_mm_equals_the_grouped_loop(
    form: Callable[..., torch.Tensor], counts: list[int], tail: int, k: int, n: int, seed: int
) -> None:
    """Both forms give every row its own group's expert product, and zero to rows past the last group end, as the
    loop does (one expert and empty groups included)."""
    g = torch.Generator().manual_seed(seed)
    rows = sum(counts) + tail
    x = torch.randn(max(rows, 1), k, generator=g)[:rows]
    w = torch.randn(len(counts), k, n, generator=g)
    offs = torch.cumsum(torch.tensor(counts), 0, dtype=torch.int32)
    torch.testing.assert_close(form(x, w, offs), _grouped_loop(x, w, offs))


@pytest.mark.parametrize("form", FORMS)
def test_static_grouped_mm_ignores_other_experts_overflow(form: Callable[..., torch.Tensor]) -> None:
    """An expert whose product is infinite on rows it does not own leaves those rows finite (selected, not masked
    by a multiplication, which would make inf * 0 = NaN): rows past the last end take the last expert's weights in
    the gathered form, and are still zero."""
    x = torch.ones(4, 2)
    w = torch.stack([torch.ones(2, 2), torch.full((2, 2), float("inf"))])
    out = form(x, w, torch.tensor([3, 3], dtype=torch.int32))
    assert torch.equal(out, torch.tensor([[2.0, 2.0]] * 3 + [[0.0, 0.0]]))


@given(
    rows=st.integers(1, 512),
    experts=st.integers(1, 256),
    gathered_bytes=st.integers(0, 2**30),
    max_dense=st.integers(1, 256),
    max_gathered=st.integers(0, 2**30),
)
def test_the_chosen_form_is_within_its_limit_and_gathered_for_fewer_rows_than_experts(
    rows: int, experts: int, gathered_bytes: int, max_dense: int, max_gathered: int
) -> None:
    """The form chosen is never over its own limit; with both allowed, gathered is chosen exactly when there are
    fewer rows than experts; None only when both are over their limits."""
    form = choose_expert_form(rows, experts, gathered_bytes, (max_dense, max_gathered))
    dense_ok, gathered_ok = experts <= max_dense, gathered_bytes <= max_gathered
    if form == "gathered":
        assert gathered_ok and (rows < experts or not dense_ok)
    elif form == "dense":
        assert dense_ok and (rows >= experts or not gathered_ok)
    else:
        assert form is None and not dense_ok and not gathered_ok


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


def _routing(experts: int, bins_high: int | None = None, top_k: int = TOP_K) -> Callable[..., torch.Tensor]:
    """transformers' grouped_mm experts forward reduced to one projection: sort by expert, group ends from histc and
    cumsum, the grouped product, and the inverse permutation back to the tokens."""
    high = experts - 1 if bins_high is None else bins_high

    def routed(hidden: torch.Tensor, top_k_index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        expert_ids = top_k_index.reshape(-1)
        ids_g, perm = torch.sort(expert_ids)
        x_g = hidden[perm // top_k]
        counts = torch.histc(ids_g.float(), bins=experts, min=0, max=high)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        out = torch.ops.transformers.grouped_mm_fallback(x_g, weight, offs=offs)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0))
        return out[inv].view(hidden.shape[0], top_k, -1).sum(1)

    return routed


def _inputs(
    experts: int, tokens: int = 6, seed: int = 0, top_k: int = TOP_K, hidden: int = 8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(tokens, hidden, generator=g)
    top_k_index = torch.stack([torch.randperm(max(experts, top_k), generator=g)[:top_k] for _ in range(tokens)])
    top_k_index = top_k_index.clamp(max=experts - 1)
    return states, top_k_index, torch.randn(experts, hidden, 16, generator=g)


def _form_logged(caplog: pytest.LogCaptureFixture) -> str:
    """The form the export logged for its one grouped product (logged by each copy of the graph the export makes)."""
    (message,) = {r.getMessage() for r in caplog.records if "grouped expert product" in r.getMessage()}
    return "gathered" if "by gathered experts" in message else "dense"


@pytest.mark.parametrize(
    ("experts", "tokens", "form"),
    [(4, 6, "dense"), (8, 1, "gathered")],
    ids=["prefill-dense", "decode-gathered"],
)
def test_routing_exports_directly_and_runs_on_qnn(
    experts: int, tokens: int, form: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The grouped_mm routing exports through the direct translator in the form its size calls for (dense for 12
    rows over 4 experts, gathered for a decode's 2 rows over 8) and matches eager on the CPU EP (exactly the
    selected products) and on the HTP simulator (fp16)."""
    fn, args = _routing(experts), _inputs(experts, tokens)
    cap = only(capture(fn, *args)[0])
    with caplog.at_level(logging.INFO, logger="qnnx_export._moe"):
        exported = qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    assert exported.exporter == "fast" and _form_logged(caplog) == form
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


@settings(max_examples=8, deadline=None)
@given(
    experts=st.integers(2, 96),
    tokens=st.integers(1, 4),
    top_k=st.integers(1, 4),
    hidden=st.sampled_from([4, 8, 16]),
    seed=st.integers(0, 2**16),
)
def test_gathered_routing_export_matches_eager(experts: int, tokens: int, top_k: int, hidden: int, seed: int) -> None:
    """Property: with the dense form refused (max_dense_experts=1), any tokens, experts (up to 96), experts per
    token and width export in the gathered form and give eager's result on the CPU EP."""
    top_k = min(top_k, experts)
    fn, args = _routing(experts, top_k=top_k), _inputs(experts, tokens, seed, top_k=top_k, hidden=hidden)
    cap = only(capture(fn, *args)[0])
    exported = qe.export(
        cap.gm, cap.example_inputs, analysis=cap.analysis, options=qe.ExportOptions(max_dense_experts=1)
    )
    got = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    assert rel_err(got[0] if isinstance(got, (tuple, list)) else got, fn(*args)) <= 1e-5


def test_the_chosen_form_and_its_cost_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The export logs each grouped product with its form, rows, experts and cost (what a user pays)."""
    fn, args = _routing(4), _inputs(4)
    cap = only(capture(fn, *args)[0])
    with caplog.at_level(logging.INFO, logger="qnnx_export._moe"):
        qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    assert any("densely: 12 rows x 4 experts (4 expert products per row" in r.message for r in caplog.records)


def test_over_max_dense_experts_the_gathered_form_is_taken(caplog: pytest.LogCaptureFixture) -> None:
    """Above max_dense_experts a product with more rows than experts is gathered instead (12 rows of 8 x 16 float32
    weights: 6144 bytes), and the log says so."""
    fn, args = _routing(4), _inputs(4)
    cap = only(capture(fn, *args)[0])
    with caplog.at_level(logging.INFO, logger="qnnx_export._moe"):
        exported = qe.export(
            cap.gm, cap.example_inputs, analysis=cap.analysis, options=qe.ExportOptions(max_dense_experts=3)
        )
    assert _form_logged(caplog) == "gathered"
    assert any("1 expert products per row, 6144 gathered weight bytes" in r.message for r in caplog.records)
    got = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    assert rel_err(got[0] if isinstance(got, (tuple, list)) else got, fn(*args)) <= 1e-5


def test_over_both_limits_is_an_error_naming_both_options() -> None:
    """A product over max_dense_experts and max_gathered_expert_bytes is refused, naming both options and its cost."""
    fn, args = _routing(4), _inputs(4)
    cap = only(capture(fn, *args)[0])
    options = qe.ExportOptions(max_dense_experts=3, max_gathered_expert_bytes=6143)
    with pytest.raises(
        ExportError, match=r"4 experts.*max_dense_experts=3.*6144 bytes.*max_gathered_expert_bytes=6143"
    ):
        qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis, options=options)


@pytest.mark.parametrize("value", [-1, True, 2.5, "64"])
def test_max_gathered_expert_bytes_must_be_a_non_negative_int(value: object) -> None:
    """A max_gathered_expert_bytes that is not an int >= 0 is refused with the accepted values."""
    with pytest.raises(InvalidOptionsError, match=r"max_gathered_expert_bytes=.*int >= 0"):
        qe.ExportOptions(max_gathered_expert_bytes=value)  # type: ignore[arg-type]  # the bad value under test


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
