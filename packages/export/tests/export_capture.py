"""Capture the FX graphs Dynamo hands a backend, with the analysis made inside the backend call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

import qnnx_export as qe


@attrs.define
class Captured:
    """One graph Dynamo handed the backend."""

    gm: torch.fx.GraphModule
    example_inputs: list[Any]
    analysis: qe.GraphAnalysis
    code_before: str


def capture(
    fn: Callable[..., Any], *inputs: Any, grad: bool = False, dynamic: bool | None = False
) -> tuple[list[Captured], Any]:
    """Compile ``fn`` with a recording backend (which runs the graph eagerly) and call it once."""
    graphs: list[Captured] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(Captured(gm, list(example_inputs), qe.analyze(gm, example_inputs), gm.code))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    with torch.set_grad_enabled(grad):
        out = compiled(*inputs)
    return graphs, out


def only(graphs: Sequence[Captured]) -> Captured:
    """Return the single captured graph (fails when Dynamo produced 0 or several)."""
    assert len(graphs) == 1, f"expected one graph, Dynamo produced {len(graphs)}"
    return graphs[0]
