"""The compile's eager run serves the first call's accuracy guard when the arguments are unchanged."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend import _compare, _compiled
from qnnx_backend._compare import EagerReference


@st.composite
def _arguments(draw: st.DrawFn) -> list[object]:
    """Graph arguments as Dynamo passes them: tensors (inputs, weights) and Python numbers."""
    kinds = draw(st.lists(st.sampled_from(["tensor", "int", "float"]), min_size=1, max_size=6))
    args: list[object] = []
    for kind in kinds:
        if kind == "tensor":
            args.append(torch.zeros(draw(st.integers(1, 3))))
        else:
            args.append(draw(st.integers(-5, 5)) if kind == "int" else draw(st.floats(-2, 2, allow_nan=False)))
    return args


_CHANGES = st.sampled_from(["none", "same values, another tensor", "written in place", "another number", "shorter"])


@given(args=_arguments(), change=_CHANGES, data=st.data())
def test_the_reference_matches_only_the_same_unchanged_arguments(args: list[object], change: str, data: Any) -> None:
    """The kept outputs serve only arguments that are the same tensors at the same versions and equal numbers:
    another tensor with the same values, an in-place write, another number or another count refuse them."""
    reference = EagerReference(args, outputs="kept")
    later = list(args)
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    numbers = [i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
    expected = True
    if change == "same values, another tensor" and tensors:
        i = data.draw(st.sampled_from(tensors))
        later[i] = later[i].clone()  # type: ignore[union-attr]
        expected = False
    elif change == "written in place" and tensors:
        later[data.draw(st.sampled_from(tensors))].add_(0)  # type: ignore[union-attr]
        expected = False
    elif change == "another number" and numbers:
        i = data.draw(st.sampled_from(numbers))
        later[i] = later[i] + 1  # type: ignore[operator]
        expected = False
    elif change == "shorter":
        later = later[:-1]
        expected = False
    assert reference.matches(later) is expected
    assert reference.matches(list(args)) is (change not in ("written in place",) or not tensors)


def test_a_number_is_not_a_tensor_of_the_same_value() -> None:
    """A Python number where a tensor was (or the reverse) refuses the kept outputs."""
    t = torch.ones(())
    assert not EagerReference([t], outputs=None).matches([1.0])
    assert not EagerReference([1.0], outputs=None).matches([t])
    assert not EagerReference([1], outputs=None).matches([True])


@pytest.fixture
def eager_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the eager runs of every graph the backend receives (the range check's and the guard's)."""
    runs, depth = [0], [0]
    real_init = _compiled.QnnGraph.__init__

    def enter(module: Any, inputs: Any) -> None:
        runs[0] += depth[0] == 0  # a GraphModule's call passes through Module.__call__ twice: count the outer one
        depth[0] += 1

    def leave(module: Any, inputs: Any, output: Any) -> None:
        depth[0] -= 1

    def init(self: Any, gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> None:
        gm.register_forward_pre_hook(enter)
        gm.register_forward_hook(leave)
        real_init(self, gm, *args, **kwargs)

    monkeypatch.setattr(_compiled.QnnGraph, "__init__", init)
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    yield runs
    torch._dynamo.reset()


def test_the_first_call_runs_the_graph_in_eager_once(eager_runs: list[int]) -> None:
    """A graph compiled on QNN with the accuracy guard on runs in eager PyTorch once in its first call (the
    float16 range check; the guard reads those outputs), and its result is eager's within float16 rounding."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    compiled = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True, "soc_model": 60})
    with torch.no_grad():
        got = compiled(x)
        want = model(x)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu"
    assert eager_runs[0] == 1
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()
    with torch.no_grad():
        compiled(x)
    assert eager_runs[0] == 1  # the guard checks the first call only


@given(
    sizes=st.lists(st.integers(0, 3 * 2**20), min_size=0, max_size=3),
    threads=st.integers(1, 4),
    fails=st.booleans(),
)
def test_the_eager_run_of_a_small_graph_uses_one_thread_and_restores_the_count(
    sizes: list[int], threads: int, fails: bool
) -> None:
    """At most SMALL_GRAPH_ELEMENTS elements run on one intra-op thread, more (or an unknown count) on the threads
    set before; the count set before is back afterwards, also when the run raises."""
    elements = sum(sizes) if sizes else None
    small = elements is not None and elements <= _compare.SMALL_GRAPH_ELEMENTS
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        expected = pytest.raises(RuntimeError) if fails else contextlib.nullcontext()
        with expected, _compare.intra_op_threads_for(elements) as used:
            assert used == torch.get_num_threads() == (1 if small else threads)
            if fails:
                raise RuntimeError("the graph failed")
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


@settings(deadline=None, max_examples=8)  # each example is a Dynamo compile
@given(batch=st.integers(1, 64), width=st.integers(1, 64))
def test_a_graphs_elements_count_its_arguments_and_every_value_it_computes(batch: int, width: int) -> None:
    """graph_elements adds the tensor arguments' elements to those of each value Dynamo's graph computes, so a
    graph with small weights but large intermediate values is not counted as small."""
    seen: list[int] = []

    def backend(gm: torch.fx.GraphModule, args: list[Any]) -> Any:
        seen.append(_compare.graph_elements(gm, args) or -1)
        return gm.forward

    x = torch.randn(batch, width)
    torch._dynamo.reset()
    torch.compile(lambda t: (t * 2).sum(dim=1).exp(), backend=backend)(x)
    # x itself, t * 2 (same size), the row sums and their exp (batch each)
    assert seen == [2 * batch * width + 2 * batch]


def test_the_eager_run_gives_the_graphs_outputs_without_autograd() -> None:
    """run_eager returns what the module computes, with no autograd history, and leaves the thread count as it was."""
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    before = torch.get_num_threads()
    out = _compare.run_eager(layer, [x])
    assert torch.equal(out, layer(x).detach())
    assert not out.requires_grad
    assert torch.get_num_threads() == before
