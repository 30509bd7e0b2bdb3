"""Graphs with symbolic sizes are specialised to one static graph per concrete shape."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend._trace import specialize


def _capture(fn, *shapes):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for shape in shapes:
        compiled(torch.randn(*shape))
    return graphs


def _f(x):
    return x.reshape(x.shape[0], -1).sum(-1) * x.shape[0]


@given(st.integers(1, 6), st.integers(1, 4))
def test_specialised_graph_matches_the_symbolic_one(batch, width):
    """Property: replacing SymInt placeholders by the concrete sizes gives a static graph with the same result."""
    torch._dynamo.reset()
    gm, example = _capture(_f, (3, 2, 2))[0]
    sym = [i for i, a in enumerate(example) if not isinstance(a, torch.Tensor)]
    assert sym, "Dynamo passed no size arguments: the test would prove nothing"
    x = torch.randn(batch, width, 2)
    # Fill every size placeholder from the real tensor, in Dynamo's order (sizes come first, then tensors).
    sizes = iter(s for s in x.shape)
    args = [next(sizes) if i in sym else x for i in range(len(example))]
    static = specialize(gm, args, sym)
    assert not any(
        n.op == "placeholder" and n.name.startswith("s") and n.type is torch.SymInt for n in static.graph.nodes
    )
    rest = [a for i, a in enumerate(args) if i not in sym]
    torch.testing.assert_close(static(*rest), gm(*args))
    # the original graph is untouched
    assert sum(1 for n in gm.graph.nodes if n.op == "placeholder") == len(example)
