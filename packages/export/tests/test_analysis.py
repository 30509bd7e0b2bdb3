"""analyze(): placeholder classification and detection of what cannot be frozen."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from export_capture import capture, only

import qnnx_export as qe


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def test_params_and_buffers_are_params() -> None:
    """Lifted parameters and buffers (BN running stats) are param_indices; the input is a user index."""
    cap = only(capture(_CNN().eval(), torch.randn(1, 3, 8, 8))[0])
    names = cap.analysis.placeholder_names
    users = [names[i] for i in cap.analysis.user_indices]
    params = [names[i] for i in cap.analysis.param_indices]
    assert users == ["l_x_"]
    assert any("running_mean" in p for p in params) and any("conv_parameters_weight" in p for p in params)
    assert sorted(cap.analysis.param_indices + cap.analysis.user_indices) == list(range(len(names)))
    assert cap.analysis.exportable


def test_analysis_after_backend_returns() -> None:
    """Classification still works after Dynamo cleaned meta['grapharg'] (uses node._dynamo_source)."""
    cap = only(capture(_CNN().eval(), torch.randn(1, 3, 8, 8))[0])
    again = qe.analyze(cap.gm, cap.example_inputs)
    assert again.param_indices == cap.analysis.param_indices


def test_plain_fx_graph_falls_back_to_parameter_type() -> None:
    """Without Dynamo sources, nn.Parameter examples are params and plain tensors user inputs."""
    gm = torch.fx.symbolic_trace(lambda x, w: x * w)
    w = nn.Parameter(torch.ones(3), requires_grad=False)
    analysis = qe.analyze(gm, [torch.ones(3), w])
    assert analysis.param_indices == (1,) and analysis.user_indices == (0,)


def test_input_mutation_detected() -> None:
    """x.add_(1) and x[0] = 3 on a user input are input_mutation problems naming the node."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        x[0] = 3
        return x * 2

    cap = only(capture(fn, torch.randn(2, 4))[0])
    kinds = [p.kind for p in cap.analysis.problems]
    assert kinds.count("input_mutation") == 2
    assert not cap.analysis.exportable
    assert any("add_" in p.detail for p in cap.analysis.problems)


def test_bitwise_operators_are_not_mutations() -> None:
    """a & b, a | b on inputs (Dynamo records operator.and_ / or_) write nothing; a &= b does."""

    def pure(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a & b, a | b

    cap = only(capture(pure, torch.tensor([True, False]), torch.tensor([True, True]))[0])
    assert cap.analysis.exportable, cap.analysis.problems

    def inplace(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a &= b
        return a

    cap = only(capture(inplace, torch.tensor([True, False]), torch.tensor([True, True]))[0])
    assert [p.kind for p in cap.analysis.problems] == ["input_mutation"]


def test_mutation_through_view_detected() -> None:
    """An in-place op on a view of an input is a mutation of that input."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.view(-1)
        y.mul_(2)
        return x + 1

    cap = only(capture(fn, torch.randn(2, 4))[0])
    assert [p.kind for p in cap.analysis.problems] == ["input_mutation"]


def test_inplace_on_intermediate_is_fine() -> None:
    """An in-place op on a fresh intermediate tensor is not a problem."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1)
        return torch.relu_(y)

    cap = only(capture(fn, torch.randn(2, 4))[0])
    assert cap.analysis.exportable, cap.analysis.problems


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return x * self.count


class _CastsItsLayer(nn.Module):
    """``self.proj = self.proj.to(dtype)`` in forward, as Switch Transformers' router casts its classifier."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.proj = self.proj.to(self.dtype)
        return self.proj(x.to(self.dtype))


def test_a_cast_of_a_layer_to_its_own_dtype_writes_nothing() -> None:
    """``module.to(dtype)`` in forward records ``weight.set_(weight.to(dtype))``; to the dtype the weight already
    has, the ``to`` returns the weight itself and nothing is written (the graph was refused as an unliftable write);
    a ``set_`` from a real cast still writes."""
    model = _CastsItsLayer(torch.float32).eval()
    with torch.no_grad():
        cap = only(capture(model, torch.randn(2, 4))[0])
    assert any(str(getattr(n.target, "__name__", n.target)).endswith("set_") for n in cap.gm.graph.nodes)
    assert cap.analysis.mutated_indices == () and cap.analysis.exportable
    for node in cap.gm.graph.nodes:  # the same graph with a cast that changes the dtype: a write again
        if node.op == "call_method" and node.target == "to":
            node.meta["example_value"] = node.meta["example_value"].to(torch.float64)
    assert qe.analyze(cap.gm, cap.example_inputs).mutated_indices != ()


def test_buffer_mutation_detected() -> None:
    """self.count += 1 on a buffer is a buffer_mutation problem."""
    cap = only(capture(_Counter(), torch.randn(2))[0])
    assert [p.kind for p in cap.analysis.problems] == ["buffer_mutation"]
    assert "count" in cap.analysis.problems[0].detail


@pytest.mark.parametrize(("train_bn", "train_dropout"), [(True, False), (False, True)])
def test_training_ops_detected(train_bn: bool, train_dropout: bool) -> None:
    """BatchNorm or Dropout in training mode is a training_op problem."""
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    model.eval()
    model[1].train(train_bn)
    model[2].train(train_dropout)
    cap = only(capture(model, torch.randn(3, 4))[0])
    kinds = {p.kind for p in cap.analysis.problems}
    assert "training_op" in kinds
    if train_bn:
        assert "buffer_mutation" in kinds  # num_batches_tracked.add_(1)


def test_eval_mode_dropout_is_fine() -> None:
    """Dropout with training=False and p=0 dropout are not problems."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, training=False) + F.dropout(x, 0.0, training=True)

    cap = only(capture(fn, torch.randn(3, 4))[0])
    assert cap.analysis.exportable, cap.analysis.problems


def test_requires_grad_detected_only_with_grad_enabled() -> None:
    """Params requiring grad are a problem only when grad mode is on at analyze time."""
    model = nn.Linear(4, 2)
    with_grad = only(capture(model, torch.randn(1, 4), grad=True)[0])
    assert [p.kind for p in with_grad.analysis.problems] == ["requires_grad"]
    no_grad = only(capture(model, torch.randn(1, 4), grad=False)[0])
    assert no_grad.analysis.exportable


def test_dynamic_shapes_detected() -> None:
    """dynamic=True gives SymInt placeholders: a dynamic_shape problem."""
    cap = only(capture(nn.Linear(4, 2), torch.randn(3, 4), dynamic=True)[0])
    assert "dynamic_shape" in {p.kind for p in cap.analysis.problems}


def test_unsupported_inputs_reported_together() -> None:
    """A Python scalar and a complex tensor placeholder are both reported (not only the first)."""
    graph = torch.fx.Graph()
    a = graph.placeholder("a")
    b = graph.placeholder("b")
    c = graph.placeholder("c")
    graph.output((graph.call_function(operator.add, (a, c)), b))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    analysis = qe.analyze(gm, [torch.ones(2), 3, torch.ones(2, dtype=torch.complex64)])
    assert [p.kind for p in analysis.problems] == ["unsupported_input", "unsupported_input"]
    assert {p.node for p in analysis.problems} == {"b", "c"}


def test_problem_kind_validated() -> None:
    """Problem refuses an unknown kind."""
    with pytest.raises(ValueError):
        qe.Problem(kind="bogus", detail="x")  # type: ignore[arg-type]


def test_wrong_number_of_inputs_raises() -> None:
    """analyze refuses example_inputs that do not match the placeholders."""
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(qe.errors.ExportError, match="placeholders"):
        qe.analyze(gm, [])


def test_problem_positional_construction() -> None:
    """Problem(kind, detail, node) can be built positionally, as the backend contract spells it."""
    p = qe.Problem("training_op", "node dropout runs dropout(p=0.5, training=True)", "dropout")
    assert (p.kind, p.node) == ("training_op", "dropout")


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (lambda x, y: (x * y).sum(-1), (torch.randn(0), torch.randn(0))),
        (lambda a, b: a @ b, (torch.randn(3, 0), torch.randn(0, 4))),
        (lambda x: x[:, 5:].relu(), (torch.randn(2, 4),)),  # an empty intermediate from an ordinary input
    ],
    ids=["empty-inputs", "empty-inner-dim", "empty-slice"],
)
def test_zero_element_values_detected(fn: object, args: tuple[torch.Tensor, ...]) -> None:
    """A zero-element input or intermediate is an empty_tensor problem: such a graph never reaches QNN."""
    cap = only(capture(fn, *args)[0])
    assert "empty_tensor" in {p.kind for p in cap.analysis.problems}
    assert not cap.analysis.exportable


def test_complex_intermediate_detected() -> None:
    """A complex intermediate with an op that has no real-pair rewrite (exp) is an unsupported_value problem; one
    whose ops all have one (a product) is exportable."""
    cap = only(capture(lambda x: torch.view_as_real(torch.exp(torch.view_as_complex(x))), torch.randn(3, 2))[0])
    assert [p.kind for p in cap.analysis.problems] == ["unsupported_value"]
    cap = only(capture(lambda x: torch.view_as_real(torch.view_as_complex(x) * 2), torch.randn(3, 2))[0])
    assert cap.analysis.exportable


def test_ordinary_graph_has_no_value_problem() -> None:
    """Non-empty real tensors throughout give no empty_tensor/unsupported_value problem."""
    cap = only(capture(lambda x: (x[:, 1:] * 2).sum(-1), torch.randn(2, 4))[0])
    assert cap.analysis.exportable


def test_mutated_placeholders_are_recorded_and_liftable() -> None:
    """add_/index_copy_ on buffers and an input are recorded; lift_mutations unfreezes exactly those."""

    class Cache(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("kv", torch.zeros(2, 6))
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))
            self.proj = nn.Linear(6, 6)

        def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            self.count.add_(1)
            self.kv.index_copy_(0, pos, self.proj(x))
            x.mul_(2)
            return self.kv.sum(0)

    cap = only(capture(Cache().eval(), torch.randn(1, 6), torch.tensor([1]))[0])
    names = cap.analysis.placeholder_names
    written = {names[i] for i in cap.analysis.mutated_indices}
    assert written == {n for n in names if "kv" in n or "count" in n or n == "l_x_"}
    lifted = qe.lift_mutations(cap.analysis)
    assert lifted is not None and lifted.exportable
    assert not set(lifted.param_indices) & set(cap.analysis.mutated_indices)
    assert set(cap.analysis.mutated_indices) <= set(lifted.user_indices)
    # The structural reading (no example values, so no guard on symbolic sizes) agrees with analyze().
    assert qe.written_arguments(cap.gm) == cap.analysis.mutated_indices


def test_lift_mutations_refuses_other_problems() -> None:
    """A graph with a training-mode op besides its writes is not liftable."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return F.dropout(x, 0.5, training=True)

    cap = only(capture(fn, torch.randn(4))[0])
    assert qe.lift_mutations(cap.analysis) is None
