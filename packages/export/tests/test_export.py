"""export(): the backend contract (freezing, signature, determinism, errors, external data)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
import torch.nn as nn
from export_capture import capture, only
from export_models_small import CONTRACT_MODELS
from export_qnn_helpers import Capture, compile_and_run, cosine, cpu_session, qnn_session, rel_err, run_exported
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe
from qnnx_export.errors import ExportError, QnnxExportError, SignatureError
from qnnx_testkit import pythonpath_env


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """The backend exports under the grad mode of the call; these tests model inference (no_grad)."""
    with torch.no_grad():
        yield


@pytest.mark.parametrize("name", sorted(CONTRACT_MODELS))
def test_contract_models_on_cpu(name: str) -> None:
    """MLP, CNN+BN and TransformerEncoderLayer (fused fast path) export and match eager on ORT CPU."""
    model, x = CONTRACT_MODELS[name]()
    with torch.no_grad():
        ref = model(x)
    backend = Capture(cpu_session)
    out = compile_and_run(model, (x,), backend)
    assert len(backend.exported) == 1
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("name", sorted(CONTRACT_MODELS))
def test_contract_models_on_qnn_htp(name: str) -> None:
    """The three contract models run fully on the QNN HTP simulator within fp16 tolerance."""
    model, x = CONTRACT_MODELS[name]()
    with torch.no_grad():
        ref = model(x)
    out = compile_and_run(model, (x,), Capture(qnn_session))
    assert rel_err(out, ref) <= 5e-2
    assert cosine(out, ref) >= 0.999


def test_encoder_layer_fast_path_is_decomposed() -> None:
    """Under no_grad Dynamo records the fused op; the export replaces it (no custom/unknown op left)."""
    model, x = CONTRACT_MODELS["encoder_layer"]()
    cap = only(capture(model, x)[0])
    assert "_transformer_encoder_layer_fwd" in cap.gm.code
    exported = qe.export(cap.gm, cap.example_inputs)
    ops = {n.op_type for n in exported.model.graph.node}
    assert {"LayerNormalization", "Softmax", "MatMul"} <= ops
    assert all(n.domain in ("", "ai.onnx") for n in exported.model.graph.node)


def test_mha_fast_path_is_decomposed() -> None:
    """nn.MultiheadAttention's fused fast path under no_grad exports and matches eager (both outputs)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 16)

    def fn(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return mha(q, q, q, need_weights=True)

    with torch.no_grad():
        ref = fn(x)
    out = compile_and_run(fn, (x,), Capture(cpu_session))
    assert rel_err(out[0], ref[0]) < 1e-5 and rel_err(out[1], ref[1]) < 1e-5


def test_params_become_initializers_and_gm_untouched() -> None:
    """Params/buffers are initializers, only user inputs are ONNX inputs, and the Dynamo gm is unchanged."""
    model, x = CONTRACT_MODELS["cnn"]()
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    graph = exported.model.graph
    assert [i.name for i in graph.input] == ["l_x_"]
    assert len(graph.initializer) >= 2
    assert exported.signature.user_indices == cap.analysis.user_indices
    assert cap.gm.code == cap.code_before
    assert len([n for n in cap.gm.graph.nodes if n.op == "placeholder"]) == len(cap.example_inputs)


def test_model_bytes_deterministic_in_process() -> None:
    """Exporting the same graph twice gives byte-identical models."""
    model, x = CONTRACT_MODELS["encoder_layer"]()
    cap = only(capture(model, x)[0])
    a = qe.export(cap.gm, cap.example_inputs).model_bytes()
    b = qe.export(cap.gm, cap.example_inputs).model_bytes()
    assert a == b


_CHILD = textwrap.dedent(
    """
    import hashlib, torch
    torch.set_grad_enabled(False)
    from export_capture import capture, only
    from export_models_small import CONTRACT_MODELS
    import qnnx_export as qe
    model, x = CONTRACT_MODELS[{name!r}]()
    cap = only(capture(model, x)[0])
    g = qe.export(cap.gm, cap.example_inputs)
    print(hashlib.sha256(g.model_bytes()).hexdigest(), qe.fingerprint(cap.gm, cap.example_inputs))
    """
)


@pytest.mark.parametrize("name", ["cnn", "encoder_layer"])
def test_model_bytes_and_fingerprint_stable_across_processes(name: str) -> None:
    """Another process exporting the same model gets the same bytes and the same fingerprint."""
    model, x = CONTRACT_MODELS[name]()
    cap = only(capture(model, x)[0])
    here = (
        hashlib.sha256(qe.export(cap.gm, cap.example_inputs).model_bytes()).hexdigest()
        + " "
        + qe.fingerprint(cap.gm, cap.example_inputs)
    )
    code = _CHILD.format(name=name)
    env = {**os.environ, **pythonpath_env(Path(__file__).parent)}  # the child imports the helpers too
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, env=env)
    assert res.stdout.strip().splitlines()[-1] == here


def test_export_refuses_problem_graphs_listing_all() -> None:
    """A graph with several problems raises ExportError listing each (and is a RuntimeError)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return torch.nn.functional.dropout(x, 0.5, training=True)

    cap = only(capture(fn, torch.randn(2, 3))[0])
    with pytest.raises(ExportError) as info:
        qe.export(cap.gm, cap.example_inputs)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, QnnxExportError)
    assert {p.kind for p in info.value.problems} == {"input_mutation", "training_op"}
    assert "input_mutation" in str(info.value) and "training_op" in str(info.value)


def test_exporter_failure_names_the_op() -> None:
    """An op torch.onnx cannot translate raises ExportError that names the failing op."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svdvals(x)  # no ONNX translation in torch 2.13

    cap = only(capture(fn, torch.randn(3, 3))[0])
    with pytest.raises(ExportError, match=r"No ONNX function found for .*linalg_svd"):
        qe.export(cap.gm, cap.example_inputs)


def test_output_layout_duplicates_and_int64() -> None:
    """A tensor returned twice maps to one ONNX output; int64 results come back as int64, exactly."""

    def fn(x: torch.Tensor, idx: torch.Tensor) -> tuple[Any, ...]:
        y = x * 2
        return y, idx + 1, y, idx.argmax()

    # symbolic_trace keeps the repeated output (Dynamo already dedups it before the backend).
    gm = torch.fx.symbolic_trace(fn)
    args = [torch.randn(3), torch.tensor([4, 1, 7])]
    exported = qe.export(gm, args)
    slots = exported.signature.outputs
    assert [s.kind for s in slots] == ["onnx"] * 4
    assert slots[0].index == slots[2].index and exported.signature.num_onnx_outputs == 3
    assert [s.dtype for s in slots] == ["float32", "int64", "float32", "int64"]
    out = run_exported(cpu_session(exported.model_bytes()), exported, args)
    ref = fn(*args)
    assert out[0] is out[2]
    for o, r in zip(out, ref, strict=True):
        assert o.dtype == r.dtype and torch.equal(o, r)


def test_assemble_passthrough_none_constant_and_cast_back() -> None:
    """assemble() returns args as is, None, constants, and casts ONNX outputs back to the torch dtype."""
    sig = qe.GraphSignature(
        inputs=(),
        outputs=(
            qe.OutputSlot(kind="onnx", index=0, dtype="int64"),
            qe.OutputSlot(kind="arg", index=1),
            qe.OutputSlot(kind="none"),
            qe.OutputSlot(kind="constant", value=3),
            qe.OutputSlot(kind="onnx", index=0, dtype="int64"),
        ),
        onnx_output_names=("o",),
        onnx_output_dtypes=("int32",),
        output_container="list",
    )
    arg = torch.ones(2)
    out = sig.assemble([torch.tensor([1, 2], dtype=torch.int32)], [torch.zeros(1), arg])
    assert isinstance(out, list) and out[1] is arg and out[2] is None and out[3] == 3
    assert out[0].dtype == torch.int64 and out[0].tolist() == [1, 2] and out[4] is out[0]
    with pytest.raises(SignatureError, match="got 0 ONNX outputs"):
        sig.assemble([], [])


def test_dynamo_passthrough_and_none_outputs_end_to_end() -> None:
    """Returning an input, None and a repeated tensor through torch.compile gives eager's structure."""

    def fn(x: torch.Tensor) -> tuple[Any, ...]:
        y = x.relu()
        return y, x, None, y

    x = torch.randn(4)
    out = compile_and_run(fn, (x,), Capture(cpu_session))
    assert out[1] is x
    assert out[2] is None
    assert torch.equal(out[0], x.relu())
    assert torch.equal(out[3], out[0])


def test_signature_json_round_trip() -> None:
    """GraphSignature.to_dict() survives JSON and from_dict() rebuilds an equal signature."""
    model, x = CONTRACT_MODELS["mlp"]()
    cap = only(capture(model, x)[0])
    sig = qe.export(cap.gm, cap.example_inputs).signature
    again = qe.GraphSignature.from_dict(json.loads(json.dumps(sig.to_dict())))
    assert again == sig
    with pytest.raises(SignatureError):
        qe.GraphSignature.from_dict({"inputs": []})


def test_int64_input_legalized_with_range_check() -> None:
    """An int64 index input is fed as int32; a value beyond int32 raises instead of saturating."""
    emb = nn.Embedding(10, 4).eval()
    ids = torch.tensor([[1, 2, 3]])
    cap = only(capture(emb, ids)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    (spec,) = exported.signature.inputs
    assert (spec.dtype, spec.onnx_dtype) == ("int64", "int32")
    out = run_exported(cpu_session(exported.model_bytes()), exported, cap.example_inputs)
    assert torch.equal(out[0], emb(ids))
    bad = list(cap.example_inputs)
    bad[spec.arg_index] = torch.tensor([[1, 2, 2**40]])
    with pytest.raises(SignatureError, match="int32"):
        exported.signature.onnx_inputs(bad)


def test_onnx_inputs_checks_shape_and_dtype() -> None:
    """onnx_inputs refuses an argument whose shape or dtype differs from the export, naming it."""
    model, x = CONTRACT_MODELS["mlp"]()
    cap = only(capture(model, x)[0])
    sig = qe.export(cap.gm, cap.example_inputs).signature
    args = list(cap.example_inputs)
    args[sig.user_indices[0]] = torch.randn(5, 8)
    with pytest.raises(SignatureError, match=r"\[5, 8\]"):
        sig.onnx_inputs(args)


def test_onnx_inputs_casts_bfloat16_to_the_exported_float_dtype() -> None:
    """A bfloat16 graph is exported in float32 (QNN has no bfloat16): its bfloat16 argument is cast to the float32
    input, with its values; a float16 argument stays a mismatch that names the argument."""
    model, x = CONTRACT_MODELS["mlp"]()
    cap = only(capture(model, x)[0])
    sig = qe.export(cap.gm, cap.example_inputs).signature
    i = sig.user_indices[0]
    args = list(cap.example_inputs)
    args[i] = x.to(torch.bfloat16)
    ins = sig.onnx_inputs(args)
    k = [spec.arg_index for spec in sig.inputs].index(i)
    assert ins[k].dtype == torch.float32 and torch.equal(ins[k], x.to(torch.bfloat16).float())
    args[i] = x.half()
    with pytest.raises(SignatureError, match="float16"):
        sig.onnx_inputs(args)


def test_params_unchanged_detects_reassign_and_inplace_update() -> None:
    """params_unchanged is True for the frozen args and False after an in-place update or a new tensor."""
    model, x = CONTRACT_MODELS["mlp"]()
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    assert exported.params_unchanged(cap.example_inputs)
    i = cap.analysis.param_indices[0]
    with torch.no_grad():
        cap.example_inputs[i].add_(1.0)
    assert not exported.params_unchanged(cap.example_inputs)
    args = list(cap.example_inputs)
    args[i] = args[i].clone()
    assert not exported.params_unchanged(args)


def test_timings_and_passes_reported() -> None:
    """ExportedGraph reports per-stage timings and which passes changed the graph."""
    model, x = CONTRACT_MODELS["mlp"]()
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs)
    assert set(exported.timings) == {"prepare", "translate", "passes", "size_check"}
    assert all(v >= 0 for v in exported.timings.values())
    assert set(exported.passes_applied) <= set(exported.passes_run)
    assert exported.passes_run == qe.ExportOptions().resolved_passes()
    assert len(exported.weight_digest) == 64


def test_external_data_with_lowered_threshold(tmp_path: Path) -> None:
    """Above the threshold the model is saved with external data that ORT loads and runs correctly."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    x = torch.randn(2, 64)
    cap = only(capture(model, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(external_data_threshold=4096))
    assert exported.external_data
    with pytest.raises(ExportError, match="save"):
        exported.model_bytes()
    path = exported.save(tmp_path / "m.onnx")
    data = tmp_path / "m.onnx.data"
    assert data.exists() and data.stat().st_size >= 64 * 64 * 4
    stored = onnx.load(str(path), load_external_data=False).graph.initializer
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in stored)
    out = run_exported(cpu_session(str(path)), exported, cap.example_inputs)
    assert rel_err(out[0], model(x)) < 1e-5
    small = qe.export(cap.gm, cap.example_inputs)
    assert not small.external_data
    assert small.save(tmp_path / "s.onnx").read_bytes() == small.model_bytes()


def test_export_without_dynamo_sources() -> None:
    """A hand-made FX graph (no Dynamo metadata) exports with Parameter args frozen."""
    gm = torch.fx.symbolic_trace(lambda x, w: torch.relu(x @ w))
    w = nn.Parameter(torch.randn(4, 3), requires_grad=False)
    x = torch.randn(2, 4)
    exported = qe.export(gm, [x, w])
    assert [i.name for i in exported.model.graph.input] == [exported.signature.input_names[0]]
    out = run_exported(cpu_session(exported.model_bytes()), exported, [x, w])
    assert rel_err(out, torch.relu(x @ w)) < 1e-6


def test_graph_without_onnx_outputs() -> None:
    """A graph returning only an input and None needs no session: zero ONNX outputs, exact assembly."""
    gm = torch.fx.symbolic_trace(lambda x: (x, None))
    x = torch.randn(2)
    exported = qe.export(gm, [x])
    sig = exported.signature
    assert sig.num_onnx_outputs == 0
    out = sig.assemble([], [x])
    assert out[0] is x and out[1] is None


def test_lifted_writes_become_outputs_and_never_go_to_torch_onnx() -> None:
    """A graph writing a buffer exports with lift_mutations: the new value is an extra output with a writeback;
    without the option, or with exporter='torch.onnx' (which drops writes), export refuses."""
    from export_capture import capture, only

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.copy_(x * 2)  # an overwrite (float state updated from itself is refused: fp16 drift)
            return self.seen * 2

    cap = only(capture(Counter().eval(), torch.ones(3))[0])
    with pytest.raises(qe.errors.ExportError):
        qe.export(cap.gm, cap.example_inputs, analysis=cap.analysis)
    with pytest.raises(qe.errors.ExportError, match=r"torch\.onnx drops"):
        qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(lift_mutations=True, exporter="torch.onnx"))
    exported = qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(lift_mutations=True))
    sig = exported.signature
    (written_arg,) = [a for _, a in sig.writebacks]
    assert "seen" in cap.analysis.placeholder_names[written_arg]
    assert sig.writebacks[0][0] == len(sig.onnx_output_names) - 1
    assert qe.GraphSignature.from_dict(sig.to_dict()) == sig


def test_float_state_updated_from_itself_is_not_lifted() -> None:
    """count += 1.0 on a float buffer would accumulate fp16 rounding on HTP: the export refuses to lift it."""
    from export_capture import capture, only

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("count", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.count.add_(1.0)
            return x * self.count

    cap = only(capture(Counter().eval(), torch.ones(3))[0])
    with pytest.raises(qe.errors.ExportError, match="accumulate fp16 rounding"):
        qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(lift_mutations=True))


@pytest.mark.parametrize("scaled", [False, True])
def test_sliding_window_roll_of_float_state_is_lifted(scaled: bool) -> None:
    """A sliding window's update (transformers' full static sliding-window layer: roll the cache left by one and write
    the new row last) moves old values without arithmetic, so nothing accumulates and the write is lifted. The same
    roll scaled by 0.5 is arithmetic on the old values and is refused."""
    from export_capture import capture, only

    class Window(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("keys", torch.randn(1, 2, 4, 3))

        def forward(self, k: torch.Tensor) -> torch.Tensor:
            rolled = self.keys.roll(-1, dims=-2)
            if scaled:
                rolled = rolled * 0.5
            rolled[:, :, -1:] = k
            self.keys.copy_(rolled)
            return self.keys.sum(-1)

    cap = only(capture(Window().eval(), torch.randn(1, 2, 1, 3))[0])
    options = qe.ExportOptions(lift_mutations=True, exporter="fast")
    if scaled:
        with pytest.raises(qe.errors.ExportError, match="accumulate fp16 rounding"):
            qe.export(cap.gm, cap.example_inputs, options=options)
    else:
        assert qe.export(cap.gm, cap.example_inputs, options=options).signature.writes


@pytest.mark.parametrize("from_itself", [False, True])
def test_write_lifting_is_linear_in_shared_values(from_itself: bool) -> None:
    """Deciding whether a lifted write overwrites or accumulates walks the graph once: a chain of 40 values each
    used twice (a decoder's residual stream has this shape) is decided at once, where a walk along every path
    would take 2^40 steps. A cache written from values computed without it is lifted; one computed from itself is
    refused."""
    import threading

    from export_capture import capture, only

    class Cache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(4, 3))

        def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            y = self.cache[pos] if from_itself else x
            for _ in range(40):
                y = y + torch.sin(y)
            self.cache.index_copy_(0, pos, y)
            return self.cache.sum(0)

    cap = only(capture(Cache().eval(), torch.ones(1, 3), torch.tensor([1]))[0])
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(lift_mutations=True)))
        except qe.errors.ExportError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=120)  # far above the expected time (well under a second): a guard, not a benchmark
    assert outcome, "write lifting did not finish: a walk that grows with the number of paths is back"
    if from_itself:
        assert isinstance(outcome[0], qe.errors.ExportError) and "accumulate fp16 rounding" in str(outcome[0])
    else:
        assert isinstance(outcome[0], qe.ExportedGraph) and outcome[0].signature.writes


@pytest.mark.parametrize("row_write", [True, False])
def test_writes_are_lifted_through_torch_onnx_when_an_op_lacks_a_translation(row_write: bool) -> None:
    """A graph that writes a buffer (a row write as a KV cache does, or a whole-tensor copy) and uses an op the
    direct translator lacks (flip) exports through torch.onnx from the lifted trace: the written values come back
    as outputs, and running the model gives eager's result and eager's new buffer."""
    from export_capture import capture, only
    from export_qnn_helpers import cpu_session

    class Cache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(4, 3))

        def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            y = torch.flip(x, [1]) * 2
            if row_write:
                self.cache.index_copy_(0, pos, y)
            else:
                self.cache.copy_(torch.ones(4, 3) * y.sum())
            return self.cache.sum(0) + 1

    x, pos = torch.randn(1, 3), torch.tensor([2])
    eager = Cache().eval()
    with torch.no_grad():
        want = eager(x, pos)
    cap = only(capture(Cache().eval(), x, pos)[0])
    exported = qe.export(cap.gm, cap.example_inputs, options=qe.ExportOptions(lift_mutations=True))
    assert exported.exporter == "torch.onnx" and "flip" in (exported.fast_path_declined or "")
    sig = exported.signature
    assert sig.writes
    session = cpu_session(exported.model_bytes())
    feeds = {s.name: t.numpy() for s, t in zip(sig.inputs, sig.onnx_inputs(cap.example_inputs), strict=True)}
    outs = dict(zip(sig.onnx_output_names, session.run(None, feeds), strict=True))
    torch.testing.assert_close(torch.from_numpy(outs[sig.onnx_output_names[0]]), want)
    assert len(sig.onnx_output_names) > 1  # the written values came back


_FOLDED_TO_AN_INPUT = {
    "logsumexp": lambda x: torch.logsumexp(x, 0),
    "max_dim": lambda x: torch.max(x, 0)[0],
    "t_copy": lambda x: torch.t_copy(x),
}


@pytest.mark.parametrize(("op", "shape"), [("logsumexp", ()), ("max_dim", ()), ("t_copy", (3,))])
def test_an_input_torch_onnx_returns_as_an_output_keeps_its_name(op: str, shape: tuple[int, ...]) -> None:
    """An op torch.onnx folds into its input (logsumexp or max over the one dim of a scalar, t of a 1-D tensor)
    leaves the graph input named after the placeholder again (onnx_ir renamed it '<output>_orig'), and the graph
    runs and equals eager."""
    fn = _FOLDED_TO_AN_INPUT[op]
    x = torch.randn(shape)
    backend = Capture(cpu_session, qe.ExportOptions(exporter="torch.onnx"))
    out = compile_and_run(fn, (x,), backend)
    (exported,) = backend.exported
    assert [i.name for i in exported.signature.inputs] == [n.name for n in exported.model.graph.input]
    assert torch.equal(out, fn(x))


@settings(max_examples=5, deadline=None)
@given(count=st.integers(1, 3), folded=st.data())
def test_input_names_survive_any_mix_of_folded_and_used_inputs(count: int, folded: st.DataObject) -> None:
    """Whichever of several scalar inputs torch.onnx returns unchanged, every ONNX input keeps its placeholder's name
    and the outputs equal eager."""
    returned = folded.draw(st.lists(st.booleans(), min_size=count, max_size=count))

    def fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.logsumexp(x, 0) if r else x * 2 for x, r in zip(xs, returned, strict=True))

    xs = tuple(torch.tensor(float(i) + 0.5) for i in range(count))
    backend = Capture(cpu_session, qe.ExportOptions(exporter="torch.onnx"))
    out = compile_and_run(fn, xs, backend)
    assert all(torch.equal(a, b) for a, b in zip(out, fn(*xs), strict=True))
