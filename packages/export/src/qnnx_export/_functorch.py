"""Tracing a graph that holds a ``torch.vmap`` region without leaving functorch's state behind (private)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["functorch_levels_kept"]


@contextlib.contextmanager
def functorch_levels_kept() -> Iterator[None]:
    """Leave functorch's stack of transform levels (vmap, grad, functionalize) as deep as it was, whatever the
    traced graph did.

    Dynamo writes a ``torch.vmap`` region as ``_vmap_increment_nesting`` ... ``_vmap_decrement_nesting`` calls in the
    graph (under torch.compile, transformers' Mamba, FalconMamba and Jamba run their selective scan as torch's
    ``associative_scan``, which it writes with vmap). Both exporters run those calls while they trace (the direct translator's ``make_fx``, torch.onnx's torch.export), and a trace that fails inside the
    region never reaches the decrement: the process kept a vmap level pushed, and every later run of the graph, the
    backend's eager fallback included, failed with ``batched == nullptr INTERNAL ASSERT FAILED`` (torch 2.13).
    Dynamo restores the depth the same way around the frames it traces.
    """
    import torch

    functorch = torch._C._functorch
    depth = functorch.get_dynamic_layer_stack_depth()
    try:
        yield
    finally:
        if functorch.get_dynamic_layer_stack_depth() > depth:
            functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)
