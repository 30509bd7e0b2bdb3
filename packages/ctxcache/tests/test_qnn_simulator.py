"""End to end on the QNN HTP simulator: a real EPContext is cached, corruption is caught, output stays right.

Also runs the plain-onnxruntime example from docs/ctxcache.md exactly as written.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from ctxcache_helpers import TESTS_DIR, run_child

import qnnx_ctxcache as cc

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_qnn")

DOC = TESTS_DIR.parent.parent.parent / "docs" / "ctxcache.md"


def _example_source() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(
        r"<!-- example:plain-ort:start -->\s*```python\n(.*?)```\s*<!-- example:plain-ort:end -->", text, re.S
    )
    assert match, "docs/ctxcache.md lost its plain-ort example block"
    return match.group(1)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs example written to a file."""
    path = tmp_path_factory.mktemp("example") / "ctx_example.py"
    path.write_text(_example_source(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """A 16x16 MatMul + bias model small enough for the simulator; returns (path, weight, bias)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal((16,)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "tiny", [x], [y], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(model, str(path))
    return path, w, b


def _run_example(example: Path, model: Path, root: Path) -> str:
    done = run_child(
        f"import runpy, sys; sys.argv = ['x', {str(model)!r}]; runpy.run_path({str(example)!r}, run_name='__main__')",
        env={"QNNX_CTXCACHE_DIR": str(root)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_docs_example_compiles_then_hits(
    example: Path, tiny_model: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    """The documented plain-ORT script compiles on the first run and hits the cache on the second (the store's
    counters, summed over both processes, show one build and one hit)."""
    first = _run_example(example, tiny_model[0], tmp_path)
    assert cc.ContextStore(tmp_path).stats().totals.get("build") == 1
    second = _run_example(example, tiny_model[0], tmp_path)
    assert first == second and "QNNExecutionProvider" in second
    totals = cc.ContextStore(tmp_path).stats().totals
    assert (totals.get("build"), totals.get("hit")) == (1, 1), totals
    (entry,) = cc.ContextStore(tmp_path).entries()
    manifest = json.loads((entry.path / "manifest.json").read_text())
    assert [c["source"] for c in manifest["ep_contexts"]] == ["QNNExecutionProvider"]
    assert manifest["ep_contexts"][0]["file"] == "model_ctx_qnn.bin"


def test_corrupted_context_binary_is_detected_rebuilt_and_correct(
    example: Path, tiny_model: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Bytes overwritten in a real cached .bin (size and mtime kept) are caught on first use; the rebuilt output is right."""
    from qnnx_ctxcache.ort import cached_session

    model, w, b = tiny_model
    root = tmp_path / "cache"
    _run_example(example, model, root)  # written by another process
    entries = list((root / "v1" / "entries").glob("*/*"))
    assert len(entries) == 1
    binary = entries[0] / "model_ctx_qnn.bin"
    stat = binary.stat()
    data = bytearray(binary.read_bytes())
    offset = len(data) * 3 // 4  # inside the weights: on 2.7.0 this loads fine and gives wrong output
    data[offset : offset + 8] = b"\x7f" * 8
    binary.write_bytes(bytes(data))
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    session = cached_session(str(model), device="npu", soc_model=60, cache_dir=root)
    reasons = [json.loads(p.read_text())["reason"] for p in (root / "v1" / "quarantine").glob("*.json")]
    assert reasons == ["corrupt:checksum"]
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    reference = x @ w + b
    # HTP with soc_model=60 computes float graphs in fp16: ~1e-3 relative error.
    assert np.abs(y - reference).max() <= 1e-2 * np.abs(reference).max()
    assert cc.ContextStore(root).verify(full=True).ok
    capfd.readouterr()


def test_session_from_cache_hit_matches_fresh_compile(
    tiny_model: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    """A session loaded from a cache hit gives the same output as the compile that produced it."""
    from qnnx_ctxcache.ort import cached_session

    model = str(tiny_model[0])
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    fresh = cached_session(model, soc_model=60, cache_dir=tmp_path / "cache")
    cached = cached_session(model, soc_model=60, cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(fresh.run(None, {"x": x})[0], cached.run(None, {"x": x})[0])
    assert "onnxruntime" in sys.modules
