"""The translator's ``nn.EmbeddingBag`` (``_embedding_bag``): bags of rows summed, averaged or maxed with static
shapes, the bag boundaries read from the runtime offsets by integer comparisons. It equals eager on the CPU EP for
any bag layout (empty bags, one bag, every index in one bag), with per-sample weights, the extra last offset and a
padding index; it declines when an output other than the bags is read, and runs wholly on the HTP simulator."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from export_capture import capture, only
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export.errors import ExportError

FAST = qe.ExportOptions(exporter="fast")
_MODES = ("sum", "mean", "max")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode, as the backend sees it."""
    with torch.no_grad():
        yield


@st.composite
def _layouts(draw: st.DrawFn) -> dict[str, object]:
    """A bag layout: indices into a table of ``rows`` rows, sorted offsets from 0 (repeats make empty bags), the
    mode, and the options PyTorch allows with it."""
    rows = draw(st.integers(2, 9))
    n = draw(st.integers(1, 12))
    bags = draw(st.integers(1, 5))
    starts = sorted([0, *draw(st.lists(st.integers(0, n), min_size=bags - 1, max_size=bags - 1))])
    mode = draw(st.sampled_from(_MODES))
    return {
        "rows": rows,
        "indices": draw(st.lists(st.integers(0, rows - 1), min_size=n, max_size=n)),
        "offsets": starts,
        "mode": mode,
        "weighted": mode == "sum" and draw(st.booleans()),
        "last_offset": draw(st.booleans()),
        "padding_idx": draw(st.one_of(st.none(), st.integers(0, rows - 1))),
    }


def _bag_call(layout: dict[str, object], seed: int) -> tuple[object, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(int(layout["rows"]), 5, generator=g)  # type: ignore[call-overload]  # an int
    indices = torch.tensor(layout["indices"], dtype=torch.int64)
    starts = list(layout["offsets"])  # type: ignore[call-overload]  # a list of ints
    # the extra last offset is the indices' size, as PyTorch documents it (its kernels disagree with one another on
    # a smaller one: the sum stops there, the mean still divides by the count to the end)
    offsets = torch.tensor([*starts, len(indices)] if layout["last_offset"] else starts, dtype=torch.int64)
    weights = torch.rand(len(indices), generator=g) + 0.5

    def bags(i: torch.Tensor, o: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(
            i,
            table,
            o,
            mode=str(layout["mode"]),
            per_sample_weights=w if layout["weighted"] else None,
            include_last_offset=bool(layout["last_offset"]),
            padding_idx=layout["padding_idx"],  # type: ignore[arg-type]  # an int or None
        )

    return bags, (indices, offsets, weights)


@settings(max_examples=40, deadline=None)
@given(layout=_layouts(), seed=st.integers(0, 2**16))
def test_bags_equal_eager_for_any_layout(layout: dict[str, object], seed: int) -> None:
    """Sum, mean and max bags (empty ones give 0), with per-sample weights, the extra last offset and a padding
    index, are translated (no fallback) and equal eager on the CPU EP up to the order of additions."""
    fn, inputs = _bag_call(layout, seed)
    ref = fn(*inputs)  # type: ignore[operator]  # a function of three tensors
    backend = Capture(cpu_session, FAST)
    out = compile_and_run(fn, inputs, backend)  # type: ignore[arg-type]  # a function of three tensors
    assert all(e.exporter == "fast" and e.fast_path_declined is None for e in backend.exported)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fixed_size_bags_of_a_2d_input_equal_eager() -> None:
    """A 2-D input is bags of its rows (PyTorch makes the offsets with an arange), translated as any bags."""
    table = torch.randn(7, 4, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[1, 2, 6], [0, 0, 3]])
    for mode in _MODES:
        backend = Capture(cpu_session, FAST)
        out = compile_and_run(lambda i, m=mode: F.embedding_bag(i, table, mode=m), (ids,), backend)
        assert backend.exported[0].fast_path_declined is None
        torch.testing.assert_close(out, F.embedding_bag(ids, table, mode=mode), rtol=1e-5, atol=1e-5)


def test_reading_the_bag_of_each_index_is_declined() -> None:
    """The op's other outputs (here the bag sizes) are not translated: the translator declines, naming the op."""
    table = torch.randn(6, 3)

    def with_bag_ids(i: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.ops.aten._embedding_bag_forward_only(table, i, o, False, 0)
        return out[0], out[2]

    cap = only(capture(with_bag_ids, torch.tensor([1, 2, 3]), torch.tensor([0, 1]))[0])
    with pytest.raises(ExportError, match="an output other than the bags"):
        qe.export(cap.gm, cap.example_inputs, options=FAST)


@pytest.mark.parametrize("mode", _MODES)
def test_bags_run_wholly_on_the_htp_simulator(mode: str) -> None:
    """A text classifier's bags (an empty one, a padding index) run wholly on the HTP simulator (no CPU fallback)
    within float16's precision of eager, and follow new offsets at run time."""
    table = torch.randn(50, 16, generator=torch.Generator().manual_seed(3))

    def bags(i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(i, table, o, mode=mode, padding_idx=7)

    ids = torch.tensor([3, 7, 11, 49, 0, 7, 20, 21, 22, 5])
    backend = Capture(qnn_session, FAST)
    for offsets in (torch.tensor([0, 2, 2, 7]), torch.tensor([0, 5, 9, 10])):
        out = compile_and_run(bags, (ids, offsets), backend)
        assert rel_err(out, bags(ids, offsets)) <= 2e-3
    assert backend.exported[0].exporter == "fast" and backend.exported[0].fast_path_declined is None
