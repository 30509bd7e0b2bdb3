"""Context models with several EPContext nodes, as a graph split between an EP and the CPU has them."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from qnnx_ctxcache._manifest import inspect_context_model


def _split_context(directory: Path, *, second_names_a_file: bool) -> None:
    """Two QNN partitions around a CPU Floor: the main EPContext node names the binary, the other does not."""
    common = {"domain": "com.microsoft", "embed_mode": 0, "source": "QNNExecutionProvider"}
    main = helper.make_node(
        "EPContext", ["x"], ["a"], name="ctx_0", main_context=1, ep_cache_context="m_qnn.bin", **common
    )
    floor = helper.make_node("Floor", ["a"], ["b"], name="floor_1")
    extra = {"ep_cache_context": "other.bin"} if second_names_a_file else {}
    second = helper.make_node("EPContext", ["b"], ["y"], name="ctx_1", main_context=0, **extra, **common)
    graph = helper.make_graph(
        [main, floor, second],
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    (directory / "m_qnn.bin").write_bytes(b"\x01context")
    onnx.save(helper.make_model(graph), str(directory / "m_ctx.onnx"))


def test_a_partition_inside_the_main_binary_references_no_file(tmp_path: Path) -> None:
    """main_context=0 without ep_cache_context is a graph inside the main binary: no problem is reported."""
    _split_context(tmp_path, second_names_a_file=False)
    contexts, problems = inspect_context_model(tmp_path, "m_ctx.onnx")
    assert problems == []
    assert [c["file"] for c in contexts] == ["m_qnn.bin", None]


def test_a_file_a_secondary_node_names_must_still_exist(tmp_path: Path) -> None:
    """A main_context=0 node that does name a file is checked like any other (here the file is missing)."""
    _split_context(tmp_path, second_names_a_file=True)
    _, problems = inspect_context_model(tmp_path, "m_ctx.onnx")
    assert problems == ["EPContext node 'ctx_1' references 'other.bin', which is missing"]
