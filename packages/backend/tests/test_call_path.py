"""The per-call weight check and the model files handed to ONNX Runtime (no QNN session needed)."""

from __future__ import annotations

import gc

import onnx
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qnnx_export
from qnnx_backend._session import StagedModel
from qnnx_backend._variant import FrozenWeights


def _args(n: int) -> list[object]:
    """A user input, n weights and a Python int, the way Dynamo passes them."""
    return [torch.randn(2), *(torch.randn(3) for _ in range(n)), 7]


@pytest.mark.parametrize("n", [0, 1, 40])
def test_unchanged_weights_are_not_reported(n):
    """The same tensors at the same versions are not a change, for no, one or many frozen weights."""
    args = _args(n)
    frozen = FrozenWeights(args, range(1, n + 1))
    assert not frozen.changed(args)
    assert not frozen.changed(list(args))  # a new argument list holding the same tensors
    args[0].add_(1)  # the user input is not frozen
    assert not frozen.changed(args)


@given(n=st.integers(1, 12), data=st.data())
def test_any_replaced_or_updated_weight_is_reported(n, data):
    """Replacing any frozen tensor by another, or updating one in place, is reported; touching none is not."""
    args = _args(n)
    frozen = FrozenWeights(args, range(1, n + 1))
    edits = data.draw(st.lists(st.tuples(st.integers(1, n), st.sampled_from(["replace", "add_", "fill_"]))))
    with torch.no_grad():
        for index, how in edits:
            if how == "replace":
                args[index] = args[index].clone()  # equal values, another tensor
            else:
                getattr(args[index], how)(0.0)
    assert frozen.changed(args) == bool(edits)


def test_non_tensor_parameter_slots_are_skipped():
    """A parameter index that holds no tensor (a Python scalar) is not watched."""
    args = _args(2)
    frozen = FrozenWeights(args, [1, 2, 3])
    assert not frozen.changed(args)
    args[3] = 8
    assert not frozen.changed(args)


def _exported_linear() -> qnnx_export.ExportedGraph:
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    captured = {}

    def backend(gm, example_inputs):
        captured["graph"] = (gm, example_inputs)
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=backend)(torch.randn(2, 64))
        gm, example_inputs = captured["graph"]
        return qnnx_export.export(gm, example_inputs)


def test_staged_model_keeps_weights_out_of_the_graph_file():
    """The graph file holds references, the data file the weights; the exported model is left as it was."""
    torch._dynamo.reset()
    exported = _exported_linear()
    before = exported.model.SerializeToString(deterministic=True)
    staged = StagedModel(exported)
    header = onnx.load(staged.path, load_external_data=False)
    big = [t for t in header.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.name for t in big} == {t.name for t in exported.model.graph.initializer if len(t.raw_data) > 1024}
    assert staged.path.stat().st_size < 4096
    full = onnx.load(staged.path)
    want = {t.name: onnx.numpy_helper.to_array(t) for t in exported.model.graph.initializer}
    got = {t.name: onnx.numpy_helper.to_array(t) for t in full.graph.initializer}
    assert want.keys() == got.keys() and all((want[k] == got[k]).all() for k in want)
    assert exported.model.SerializeToString(deterministic=True) == before
    assert "bytes" not in exported._cache  # no serialized copy was kept


def test_staged_files_live_as_long_as_their_owner():
    """The folder goes when the staged model is garbage, or later, when the session it was kept for goes."""
    torch._dynamo.reset()
    exported = _exported_linear()
    staged = StagedModel(exported)
    folder = staged.path.parent
    del staged
    gc.collect()
    assert not folder.exists()

    class Session:
        pass

    session = Session()
    staged = StagedModel(exported)
    folder = staged.path.parent
    staged.keep_for(session)
    del staged
    gc.collect()
    assert folder.exists()
    del session
    gc.collect()
    assert not folder.exists()
