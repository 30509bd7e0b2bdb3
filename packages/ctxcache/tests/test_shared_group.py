"""Weight-shared EPContext groups: one _qnn.bin for several graphs over the same weights, on the HTP simulator."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qnnx_ctxcache import errors
from qnnx_ctxcache._shared import sharing_problems, size_verdict

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_qnn")

from onnx import helper, numpy_helper  # noqa: E402

from qnnx_ctxcache.ort import SharedContextGroup, check_shared_group, compile_shared_group  # noqa: E402

# 512 x 512 float32 weights: about 0.5 MB in a context binary, against about 20 kB for a graph's own overhead.
_N = 512
_WEIGHTS = np.random.default_rng(0).standard_normal((_N, _N)).astype(np.float32)


def _matmul(batch: int | str, *, columns: int = _N) -> Any:
    """``y = x @ w`` with the same weights ``w`` at any batch (``columns`` != 512: a graph that cannot compile)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, columns])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, _N])],
        [numpy_helper.from_array(_WEIGHTS, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[SharedContextGroup, list[int]]:
    """The group of batch 1 and batch 4, and the binary sizes of the two graphs compiled apart."""
    root = tmp_path_factory.mktemp("shared")
    group = compile_shared_group([_matmul(1), _matmul(4)], root / "group", names=["b1", "b4"], soc_model=60)
    apart = [
        compile_shared_group([_matmul(b)], root / f"apart{b}", names=[f"b{b}"], soc_model=60).binary_bytes
        for b in (1, 4)
    ]
    return group, apart


def _references(context_model: Path) -> list[tuple[str, str]]:
    """``(ep_cache_context, partition_name)`` of every EPContext node."""
    proto = onnx.load(str(context_model))
    out = []
    for node in proto.graph.node:
        assert node.op_type == "EPContext"
        values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        out.append((values["ep_cache_context"].decode(), values["partition_name"].decode()))
    return out


def test_a_group_writes_one_binary_that_every_node_names(compiled: tuple[SharedContextGroup, list[int]]) -> None:
    group, _ = compiled
    bins = sorted(p.name for p in group.directory.glob("*.bin"))
    assert bins == ["b1_ctx_qnn.bin"]
    assert group.binaries == (group.directory / "b1_ctx_qnn.bin",)
    assert [p.name for p in group.context_models] == ["b1_ctx.onnx", "b4_ctx.onnx"]
    refs = [r for model in group.context_models for r in _references(model)]
    assert {file for file, _ in refs} == {"b1_ctx_qnn.bin"}
    assert len({partition for _, partition in refs}) == 2
    assert group.binary_bytes == (group.directory / "b1_ctx_qnn.bin").stat().st_size
    assert group.bytes_on_disk == group.binary_bytes + sum(p.stat().st_size for p in group.context_models)


def test_the_shared_binary_is_about_one_copy(compiled: tuple[SharedContextGroup, list[int]]) -> None:
    group, apart = compiled
    check = check_shared_group(group, separate_bytes=apart)
    assert check.binary == group.binaries[0] and check.graphs == 2
    assert check.separate_bytes == tuple(apart)
    assert check.copies is not None and check.copies <= 1.1
    assert check.ratio is not None and check.ratio < 0.6
    assert check.ratio == pytest.approx(group.binary_bytes / sum(apart))
    # The same check from the paths alone, without sizes.
    assert check_shared_group([str(p) for p in group.context_models]).ratio is None


def test_the_buckets_of_one_symbolic_model_share_one_binary(tmp_path: Path) -> None:
    """One file at two free-dim sizes: the EP names graphs after the model path, so a repeat must not collide."""
    source = tmp_path / "symbolic.onnx"
    onnx.save(_matmul("batch"), str(source))
    group = compile_shared_group(
        [source, source], tmp_path / "g", names=["b1", "b4"], free_dims=[{"batch": 1}, {"batch": 4}], soc_model=60
    )
    assert len(group.binaries) == 1
    assert check_shared_group(group).graphs == 2


def test_separate_compiles_are_not_a_group(compiled: tuple[SharedContextGroup, list[int]], tmp_path: Path) -> None:
    group, _ = compiled
    for batch in (1, 4):
        for name in (f"b{batch}_ctx.onnx", f"b{batch}_ctx_qnn.bin"):
            shutil.copy(group.directory.parent / f"apart{batch}" / name, tmp_path / name)
    with pytest.raises(errors.SharedContextError, match="references 2 context binaries") as info:
        check_shared_group([tmp_path / "b1_ctx.onnx", tmp_path / "b4_ctx.onnx"])
    assert "Fix: compile the whole group with qnnx_ctxcache.ort.compile_shared_group" in str(info.value)


def test_a_binary_larger_than_one_copy_is_refused(compiled: tuple[SharedContextGroup, list[int]]) -> None:
    group, apart = compiled
    with pytest.raises(errors.SharedContextError, match="times the largest graph compiled apart"):
        check_shared_group(group, separate_bytes=[apart[0] // 2, apart[1] // 2])


def test_a_failed_group_leaves_nothing_behind(tmp_path: Path) -> None:
    """A session of the group that fails: the group's files are deleted and the next group holds only its graphs."""
    with pytest.raises(Exception, match="MatMul"):
        compile_shared_group([_matmul(1), _matmul(4, columns=_N + 1)], tmp_path / "bad", soc_model=60)
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == ["graph_0.onnx", "graph_1.onnx"]
    after = compile_shared_group([_matmul(2)], tmp_path / "after", soc_model=60)
    fresh = compile_shared_group([_matmul(2)], tmp_path / "fresh", soc_model=60)
    assert after.binary_bytes == fresh.binary_bytes


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"models": []}, "a non-empty list of ONNX paths or ModelProtos"),
        ({"models": "model.onnx"}, "a non-empty list"),
        ({"models": [b"bytes"]}, "accepted: a path of a .onnx file or an onnx.ModelProto"),
        ({"names": ["one"]}, "one name per model"),
        ({"names": ["same", "same"]}, "repeat"),
        ({"names": ["a/b", "c"]}, "is not a file name"),
        ({"free_dims": [{"batch": 1}]}, "a list of 2 mappings"),
        ({"session_options": {"ep.share_ep_contexts": "0"}}, "which the group compile sets"),
        ({"session_options": {"ep.context_enable": "0"}}, "which the cache sets"),
        ({"device": "cpu"}, "is not a QNN device"),
    ],
)
def test_bad_arguments_name_the_value_and_the_fix(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"models": [_matmul(1), _matmul(4)], "directory": tmp_path / "g", **kwargs}
    with pytest.raises(errors.InvalidOptionsError, match=match) as info:
        compile_shared_group(**args)
    assert "Fix:" in str(info.value)


def test_existing_outputs_and_missing_models_are_refused(tmp_path: Path) -> None:
    (tmp_path / "b1_ctx.onnx").write_bytes(b"old")
    with pytest.raises(errors.InvalidOptionsError, match="exist"):
        compile_shared_group([_matmul(1), _matmul(4)], tmp_path, names=["b1", "b4"])
    with pytest.raises(FileNotFoundError, match="no such ONNX file"):
        compile_shared_group([tmp_path / "missing.onnx"], tmp_path / "g")


@pytest.mark.parametrize(
    ("separate", "tolerance"), [([], 0.1), ([0, 5], 0.1), ([True], 0.1), ("12", 0.1), ([5], -1.0), ([5], float("nan"))]
)
def test_bad_sizes_are_refused(compiled: tuple[SharedContextGroup, list[int]], separate: Any, tolerance: Any) -> None:
    group, _ = compiled
    with pytest.raises(errors.InvalidOptionsError, match="accepted"):
        check_shared_group(group, separate_bytes=separate, tolerance=tolerance)


_files = st.sampled_from(["a_qnn.bin", "b_qnn.bin", "c_qnn.bin"])
_references_st = st.dictionaries(
    st.text("abcdef", min_size=1, max_size=4), st.lists(st.none() | _files, max_size=4), min_size=1, max_size=4
)


@given(references=_references_st)
def test_one_binary_named_by_every_node_is_the_only_shared_group(references: dict[str, list[str | None]]) -> None:
    shared, problems = sharing_problems(references)
    flat = [ref for refs in references.values() for ref in refs]
    is_group = all(references.values()) and None not in flat and len(set(flat)) == 1
    assert (shared is not None) == is_group == (not problems)
    if is_group:
        assert shared == flat[0]


@given(
    binary=st.integers(1, 10**10),
    separate=st.lists(st.integers(1, 10**10), min_size=1, max_size=5),
    tolerance=st.floats(0, 2),
)
def test_the_size_verdict_is_one_copy_within_the_tolerance(binary: int, separate: list[int], tolerance: float) -> None:
    sizes, ratio, copies, problem = size_verdict(binary, separate, tolerance=tolerance)
    assert sizes == tuple(separate)
    assert ratio == pytest.approx(binary / sum(separate))
    assert copies == pytest.approx(binary / max(separate))
    assert (problem is None) == (binary / max(separate) <= 1 + tolerance)
    assert size_verdict(binary, None, tolerance=tolerance) == ((), None, None, None)
