"""``qnnx_ctxcache.ort.cached_session`` and ``qnnx-ctxcache compile`` on the QNN HTP simulator: one process
compiles, another loads from the cache (the store's counters, summed over processes, show no second build), with
free-dimension overrides in the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ctxcache_helpers import run_child

import qnnx_ctxcache as cc
from qnnx_ctxcache import errors

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_qnn")

_CHILD = """
import json, sys
import numpy as np
from qnnx_ctxcache.ort import cached_session
session = cached_session(
    {model!r}, device="npu", soc_model=60, free_dims={dims!r}, cache_dir={root!r},
    session_options={{"session.disable_cpu_ep_fallback": "1"}},
)
x = np.linspace(-1, 1, {rows} * 16, dtype=np.float32).reshape({rows}, 16)
(y,) = session.run(None, {{"x": x}})
print("RESULT " + json.dumps(y.tolist()))
"""


@pytest.fixture(scope="module")
def symbolic_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """x['batch', 16] @ w + relu: a model with a named free dimension; returns (path, w)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "symbolic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = tmp_path_factory.mktemp("model") / "symbolic.onnx"
    onnx.save(model, str(path))
    return path, w


def _session_in_child(model: Path, root: Path, dims: dict[str, int]) -> np.ndarray:
    done = run_child(_CHILD.format(model=str(model), root=str(root), dims=dims, rows=dims["batch"]), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return np.asarray(json.loads(line[len("RESULT ") :]), dtype=np.float32)


def _totals(root: Path) -> dict[str, int]:
    return dict(cc.ContextStore(root).stats().totals)


def test_a_second_process_loads_from_the_cache(symbolic_model: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    """Process 1 compiles (one build), process 2 hits (still one build); both give the right output."""
    model, w = symbolic_model
    first = _session_in_child(model, tmp_path, {"batch": 2})
    assert _totals(tmp_path).get("build") == 1
    second = _session_in_child(model, tmp_path, {"batch": 2})
    totals = _totals(tmp_path)
    assert totals.get("build") == 1 and totals.get("hit", 0) >= 1, totals
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    want = np.maximum(x @ w, 0)
    np.testing.assert_array_equal(first, second)
    assert np.abs(second - want).max() <= 1e-2 * np.abs(want).max()  # HTP computes float in fp16
    assert len(cc.ContextStore(tmp_path).entries()) == 1


def test_free_dims_are_part_of_the_key(symbolic_model: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    """Another batch size is another compile (a context is compiled for static shapes)."""
    model, _ = symbolic_model
    _session_in_child(model, tmp_path, {"batch": 1})
    y = _session_in_child(model, tmp_path, {"batch": 3})
    assert y.shape == (3, 8)
    assert _totals(tmp_path).get("build") == 2
    assert len(cc.ContextStore(tmp_path).entries()) == 2


def test_cli_compile_prebuilds_what_cached_session_loads(
    symbolic_model: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    """`qnnx-ctxcache compile` with the same options fills the cache; cached_session in another process hits it,
    and a second compile reports the entry as already cached."""
    model, _ = symbolic_model
    cmd = [sys.executable, "-m", "qnnx_ctxcache", "--root", str(tmp_path), "compile", str(model), "--soc-model",
           "SC8380XP", "--dim", "batch=2", "--config", "session.disable_cpu_ep_fallback=1", "--json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    built = json.loads(done.stdout)  # stdout holds only the JSON document
    assert (built["hit"], built["persisted"]) == (False, True)
    _session_in_child(model, tmp_path, {"batch": 2})
    assert _totals(tmp_path).get("build") == 1
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert json.loads(again.stdout)["hit"] is True and json.loads(again.stdout)["key"] == built["key"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "dsp"}, "accepted: npu"),
        ({"soc_model": "SM0000"}, "accepted: a non-negative QNN SoC number"),
        ({"free_dims": {"bach": 1}}, "accepted: batch"),
        ({"free_dims": {"batch": 0}}, "positive integers"),
        ({"session_options": {"ep.context_enable": "1"}}, "the cache sets"),
    ],
)
def test_bad_arguments_are_invalid_options(
    symbolic_model: tuple[Path, np.ndarray], tmp_path: Path, kwargs: dict[str, object], match: str
) -> None:
    """Misuse raises InvalidOptionsError (a ValueError) naming what is accepted, before anything compiles."""
    from qnnx_ctxcache.ort import cached_session

    with pytest.raises(errors.InvalidOptionsError, match=match):
        cached_session(symbolic_model[0], cache_dir=tmp_path, **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "v1" / "entries").exists() or not any((tmp_path / "v1" / "entries").iterdir())


def test_a_session_options_object_is_refused_with_the_fix(
    symbolic_model: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    """An onnxruntime.SessionOptions cannot be read back into the key: refused, saying to pass a dict."""
    import onnxruntime as ort

    from qnnx_ctxcache.ort import cached_session

    with pytest.raises(errors.InvalidOptionsError, match="pass them as a dict"):
        cached_session(symbolic_model[0], cache_dir=tmp_path, session_options=ort.SessionOptions())  # type: ignore[arg-type]


def test_without_onnxruntime_the_error_names_the_extra(tmp_path: Path, symbolic_model: tuple[Path, np.ndarray]) -> None:
    """With onnxruntime missing, cached_session raises ImportError naming the qnn extra; import of the package and
    of the module still work."""
    done = run_child(
        "import sys\n"
        "sys.modules['onnxruntime'] = None\n"
        "import qnnx_ctxcache, qnnx_ctxcache.ort as o\n"
        "try:\n"
        f"    o.cached_session({str(symbolic_model[0])!r}, cache_dir={str(tmp_path)!r})\n"
        "except ImportError as exc:\n"
        "    print('IMPORT-ERROR', exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "IMPORT-ERROR" in done.stdout and "qnnx-ctxcache[qnn]" in done.stdout
