"""A bfloat16 graph is exported as a float32 (or float16) copy: its casts and factories change dtype, the caller's
graph does not."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend._export import _export_args, _export_graph


def _graph() -> torch.fx.GraphModule:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = (x.float() * 2).to(torch.bfloat16)
        z = torch.zeros(3, dtype=torch.bfloat16)
        return (h @ w).bfloat16() + z.sum()

    return torch.fx.symbolic_trace(f)


def _dtypes(gm: torch.fx.GraphModule) -> list[object]:
    found = [v for n in gm.graph.nodes for v in (*n.args, *n.kwargs.values()) if isinstance(v, torch.dtype)]
    return found + [n.target for n in gm.graph.nodes if n.op == "call_method" and n.target in ("bfloat16", "half")]


@given(fp16=st.booleans(), rows=st.integers(1, 4))
def test_the_copy_computes_in_one_float_dtype_and_the_original_is_kept(fp16: bool, rows: int) -> None:
    gm = _graph()
    before = gm.code
    args = [torch.randn(rows, 3, dtype=torch.bfloat16), torch.randn(3, 3, dtype=torch.bfloat16)]
    want = torch.float16 if fp16 else torch.float32
    copy = _export_graph(gm, args, fp16)
    assert copy is not gm and gm.code == before
    assert torch.bfloat16 not in _dtypes(copy) and "bfloat16" not in _dtypes(copy)
    exported = _export_args(args, fp16)
    assert all(a.dtype == want for a in exported)
    out = copy(*exported)
    assert out.dtype == want
    ref = gm(*args)
    assert ref.dtype == torch.bfloat16  # the caller's graph and its constants are untouched
    assert torch.allclose(out.float(), ref.float(), rtol=3e-2, atol=3e-2)


def test_a_float32_graph_is_exported_as_it_is() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    gm = torch.fx.symbolic_trace(f)
    args = [torch.randn(2)]
    assert _export_graph(gm, args, False) is gm
    assert _export_args(args, False)[0] is args[0]
