"""Attention's output projection after the heads are merged back: QNN HTP computes
``MatMul(Reshape(x[A, A, A, D] -> [A, A, A*D]), W)`` silently wrong. qnnx-export's ``flatten_merged_heads_matmul``
multiplies on the rank-2 view instead, and qnnx-opcheck refuses exactly the class the pass rewrites."""

from __future__ import annotations

import warnings

import onnx
import onnx_ir as ir
import torch
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import qnnx_backend
import qnnx_opcheck
from qnnx_export._passes import run_passes


def _merge_then_matmul(source: list[int], merged: list[int]) -> onnx.ModelProto:
    nodes = [
        h.make_node("Reshape", ["x", "s"], ["r"], name="merge"),
        h.make_node("MatMul", ["r", "w"], ["y"], name="mm"),
    ]
    inits = [nh.from_array(torch.tensor(merged).numpy(), "s"), nh.from_array(torch.ones(merged[-1], 4).numpy(), "w")]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, source)],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 20)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _refused(model: onnx.ModelProto) -> bool:
    report = qnnx_opcheck.check_model(model, "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    return any(v.status != "supported" for v in report.verdicts)


@given(
    dims=st.lists(st.integers(1, 5), min_size=4, max_size=4),
    equal=st.booleans(),
    lead_one=st.booleans(),
    split=st.sampled_from(["last_two", "middle"]),
)
def test_opcheck_refuses_exactly_what_the_pass_rewrites(
    dims: list[int], equal: bool, lead_one: bool, split: str
) -> None:
    """Over random rank-4 sources (three equal leading dims or not) merged into rank 3 (or 4 with a leading 1):
    qnnx-opcheck refuses the MatMul exactly when the pass rewrites it, and vouches for what the pass writes."""
    if equal:
        dims[1] = dims[2] = dims[0]
    a, b, c, d = dims
    merged = [a, b, c * d] if split == "last_two" else [a, b * c, d]
    merged = [1, *merged] if lead_one else merged
    model = _merge_then_matmul(dims, merged)
    rewritten = ir.serde.deserialize_model(model)
    ((_, changed),) = run_passes(rewritten, ("flatten_merged_heads_matmul",))
    assert changed == _refused(model)
    assert not _refused(ir.to_proto(rewritten))


def test_a_merge_through_a_first_reshape_is_refused_and_rewritten() -> None:
    """[4, 4, 4, 6] -> [16, 24] -> [4, 4, 24] before the MatMul: ONNX Runtime merges the two Reshapes into the
    defect's one, so opcheck refuses the MatMul and the pass rewrites it all the same."""
    model = _merge_then_matmul([4, 4, 4, 6], [4, 4, 24])
    graph = model.graph
    graph.initializer.append(nh.from_array(torch.tensor([16, 24]).numpy(), "via"))
    graph.node.insert(0, h.make_node("Reshape", ["x", "via"], ["v"], name="first"))
    graph.node[1].input[0] = "v"
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert _refused(model)
    rewritten = ir.serde.deserialize_model(model)
    ((_, changed),) = run_passes(rewritten, ("flatten_merged_heads_matmul",))
    assert changed and not _refused(ir.to_proto(rewritten))


def test_mobilevit_through_torch_onnx_is_right_on_qnn() -> None:
    """A tiny MobileViT (4 heads of 6 channels on 4x4 patches) exported by torch.onnx merges its heads into
    [4, 4, 24] before the output projection: QNN returned cosine 0.19 against eager there, with no error and the
    first-call check off. With the rewrite every graph runs on QNN within fp16 tolerance of eager: cosine 0.99879
    and 4.4e-2 of the scale, the same as the direct translator's graph, the error growing through LayerNorms whose
    inputs sit far from zero for their spread (measured node by node, no node off by more than 1.3e-2 alone)."""
    import torch.nn as nn
    import transformers

    torch.manual_seed(0)
    config = transformers.MobileViTConfig(
        image_size=64, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32], num_attention_heads=4
    )
    model = transformers.MobileViTModel(config).eval()
    for module in model.modules():  # HF's init shrinks activations below fp16: keep them at unit scale
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="linear")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    options = {"device": "npu", "soc_model": 60, "verify": False, "exporter": "torch.onnx"}
    with torch.no_grad():
        ref = model(x).last_hidden_state
        torch._dynamo.reset()
        qnnx_backend.clear_compile_reports()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = torch.compile(lambda t: model(t).last_hidden_state, backend="qnn", options=options)(x)
    reports = qnnx_backend.compile_reports()
    assert reports and all(r.device == "npu" for r in reports), [r.summary() for r in reports]
    assert "flatten_merged_heads_matmul" in reports[0].passes_applied
    assert_close_fp16(out, ref, rel=5e-2, cos=0.998)
