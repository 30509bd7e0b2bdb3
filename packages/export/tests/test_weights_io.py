"""The exported model shares the frozen tensors: no copy at export, a weightless structure, streamed saves,
and never a model written with weights other than the ones it was exported with."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from export_capture import capture, only
from export_qnn_helpers import cpu_session, rel_err, run_exported
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export.errors import ExportError
from qnnx_testkit.strategies import seeds


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    with torch.no_grad():
        yield


def _mlp(width: int = 64) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 8)).eval(), torch.randn(2, width)


def test_structure_has_every_node_and_no_weight_bytes() -> None:
    model, x = _mlp(256)
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    structure = exported.structure
    assert structure.ByteSize() < 16 * 1024  # 256x256 float weights alone are 256 KiB
    assert [n.op_type for n in structure.graph.node] == [n.op_type for n in exported.model.graph.node]
    big = [t for t in structure.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert big and all(not t.raw_data for t in big)
    full = {t.name: t for t in exported.model.graph.initializer}
    for t in big:  # same name, dtype and shape as the real initializer
        assert (t.data_type, list(t.dims)) == (full[t.name].data_type, list(full[t.name].dims))


def test_save_external_streams_weights_and_runs(tmp_path: Path) -> None:
    model, x = _mlp()
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    path = exported.save(tmp_path / "m.onnx", external_data=True)
    assert (tmp_path / "m.onnx.data").stat().st_size >= 64 * 64 * 4
    assert path.stat().st_size < 8 * 1024
    out = run_exported(cpu_session(str(path)), exported, cap.example_inputs)
    assert rel_err(out[0], model(x)) < 1e-6
    with pytest.raises(ExportError, match="cannot be written as one file"):
        qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(external_data_threshold=1024)).save(
            tmp_path / "x.onnx", external_data=False
        )


def test_in_place_weight_change_after_export_is_refused(tmp_path: Path) -> None:
    """The model refers to the frozen tensors: once one is written in place, writing the model would
    silently carry new weights under the old digest, so it is refused."""
    model, x = _mlp()
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    i = cap.analysis.param_indices[0]
    cap.example_inputs[i].mul_(2.0)
    with pytest.raises(ExportError, match="export the graph again"):
        exported.save(tmp_path / "m.onnx", external_data=True)
    with pytest.raises(ExportError, match="export the graph again"):
        _ = exported.model


def test_model_taken_before_a_change_keeps_the_exported_weights() -> None:
    model, x = _mlp()
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    before = exported.model_bytes()
    ref = model(x).clone()
    i = cap.analysis.param_indices[0]
    cap.example_inputs[i].add_(1.0)
    assert exported.model_bytes() == before  # the serialized form was taken at first use
    out = run_exported(cpu_session(before), exported, cap.example_inputs)
    assert rel_err(out[0], ref) < 1e-6


@settings(max_examples=15, deadline=None)
@given(width=st.sampled_from([4, 16, 64, 200]), seed=seeds())
def test_saved_external_model_equals_model_bytes(
    tmp_path_factory: pytest.TempPathFactory, width: int, seed: int
) -> None:
    """Whatever the weight sizes (inline below 1 KiB, external above), both written forms hold the same
    initializer values."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 3)).eval()
    x = torch.randn(1, width)
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    _assert_written_forms_agree(exported, tmp_path_factory.mktemp("save"))


def _assert_written_forms_agree(exported: qe.ExportedGraph, folder: Path) -> Path:
    """Both written forms (external data, one buffer) hold the same initializer values; the external one's path."""
    path = exported.save(folder / "m.onnx", external_data=True)
    got = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    inline = onnx.load_from_string(exported.model_bytes())
    want = {t.name: onnx.numpy_helper.to_array(t) for t in inline.graph.initializer}
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
    return path


def _anon_bytes() -> int:
    """The process's anonymous resident memory (Linux), which a copy of the weights would grow."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status on this system")


def test_bias_free_linear_export_holds_no_transposed_copy(tmp_path: Path) -> None:
    """A bias-free Linear on a 3-D input reaches the translator as ``mm(x, t(weight))``: exporting it holds no
    contiguous copy of the transposed weight (a decoder's MLP would otherwise be a second copy of its weights for as
    long as the export lives), and the written model still carries the transposed values and matches eager."""
    torch.manual_seed(0)
    model = nn.Linear(4096, 4096, bias=False).eval()  # 64 MiB of float32 weights
    x = torch.randn(1, 3, 4096)
    cap = only(capture(model, x)[0])
    before = _anon_bytes()
    exported = qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(exporter="fast"))
    grown = _anon_bytes() - before
    assert exported.exporter == "fast"
    assert grown < 24 * 2**20, f"the export grew anonymous memory by {grown / 2**20:.0f} MiB (the weight is 64 MiB)"
    path = exported.save(tmp_path / "m.onnx", external_data=True)
    out = run_exported(cpu_session(str(path)), exported, cap.example_inputs)
    assert rel_err(out[0], model(x)) < 1e-5


@settings(max_examples=12, deadline=None)
@given(
    width=st.sampled_from([4, 16, 64, 200]),
    out=st.sampled_from([3, 32, 300]),
    rank=st.sampled_from([2, 3, 4]),
    seed=seeds(),
)
def test_transposed_weights_are_written_as_exported(
    tmp_path_factory: pytest.TempPathFactory, width: int, out: int, rank: int, seed: int
) -> None:
    """Weights the translator reads through a transposing view (bias-free Linears on inputs of any rank) are written
    with the same values in both forms (external data, one buffer) and the model matches eager on the CPU EP."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, width, bias=False), nn.Tanh(), nn.Linear(width, out, bias=False)).eval()
    x = torch.randn(*([2] * (rank - 1)), width)
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(exporter="fast"))
    path = _assert_written_forms_agree(exported, tmp_path_factory.mktemp("save"))
    result = run_exported(cpu_session(str(path)), exported, cap.example_inputs)
    assert rel_err(result[0], model(x)) < 1e-5
