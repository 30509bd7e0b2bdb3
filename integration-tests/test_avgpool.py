"""AveragePool windows QNN HTP averages wrongly, made whole by qnnx-export's ``avgpool_whole_windows``: an
EfficientNet-style model runs wholly on the simulator under strict, and qnnx-opcheck vouches for every pool the
pass writes (and refuses every pool it rewrites)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16, cosine
from integration_models import EfficientNetStyle, randomize_batchnorm
from onnx import TensorProto
from onnx import helper as h

import qnnx_backend
import qnnx_opcheck
from qnnx_backend.errors import QnnDeviceError
from qnnx_export._passes import run_passes
from qnnx_testkit.strategies import pool_windows

NPU_STRICT = {"device": "npu", "strict": True, "soc_model": 60}


def _efficientnet() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return randomize_batchnorm(EfficientNetStyle()).eval(), torch.randn(2, 3, 16, 16)


def test_efficientnet_style_runs_wholly_on_qnn() -> None:
    """AvgPool2d(3, 2, padding=1, ceil_mode=True), with and without count_include_pad (16 -> 8 -> 4, the last window
    of each axis hanging over the end), between Conv-BatchNorm-SiLU and squeeze-excite blocks: every node on QNN
    under strict, no CPU-EP node, eager's outputs (cosine 0.999995 measured)."""
    model, x = _efficientnet()
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="qnn", options=NPU_STRICT)(x)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and report.on_qnn and not report.cpu_nodes, report.summary()
    assert set(report.placement) == {"QNNExecutionProvider"}, report.placement
    assert "avgpool_whole_windows" in report.passes_applied
    assert_close_fp16(got, expected)
    assert cosine(got, expected) >= 0.999


def test_efficientnet_style_without_the_pass_is_refused_under_strict() -> None:
    """Without the rewrite qnnx-opcheck refuses the ceil_mode pools (HTP averages them wrongly), so strict raises
    naming AveragePool."""
    model, x = _efficientnet()
    options = {**NPU_STRICT, "disable_passes": ["avgpool_whole_windows"]}
    with torch.no_grad(), pytest.raises(QnnDeviceError, match="AveragePool"):
        torch.compile(model, backend="qnn", options=options)(x)


def _pool(shape: list[int], attrs: dict[str, object]) -> onnx.ModelProto:
    node = h.make_node("AveragePool", ["x"], ["y"], **attrs)
    inputs = [h.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    graph = h.make_graph([node], "g", inputs, [h.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 20)], ir_version=10)


def _refused(model: onnx.ModelProto) -> list[str]:
    report = qnnx_opcheck.check_model(model, "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    return [f"{v.op_type}: {v.reason}" for v in report.verdicts if v.status != "supported"]


@given(window=pool_windows(max_side=9, max_channels=4), ceil=st.booleans(), count_pad=st.booleans())
def test_opcheck_vouches_for_the_pools_the_pass_writes(
    window: tuple[list[int], dict[str, list[int]]], ceil: bool, count_pad: bool
) -> None:
    """Over random valid pools of rank 3-5: qnnx-opcheck refuses the node exactly when the pass rewrites it, and
    vouches for every node the pass writes (the zeros' Concat, the pool of whole windows, the Mul)."""
    shape, attrs = window
    model = _pool(shape, {**attrs, "ceil_mode": int(ceil), "count_include_pad": int(count_pad)})
    rewritten = ir.serde.deserialize_model(model)
    ((_, changed),) = run_passes(rewritten, ("avgpool_whole_windows",))
    assert changed == bool(_refused(model))
    assert _refused(ir.to_proto(rewritten)) == []
