"""Save a compiled function with ``aot_compile``, load it in a fresh process without Dynamo tracing or export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from integration_helpers import assert_close_fp16

import qnnx_backend
from qnnx_backend.errors import SavedGraphError

pytestmark = pytest.mark.skipif(not qnnx_backend.is_available("npu"), reason="QNN HTP is not usable here")

OPTIONS = {"device": "npu", "soc_model": 60}

# The loading process: the saved function runs, no export or operator check runs, and its report says where.
_LOADER = textwrap.dedent(
    """
    import json, logging, sys
    import torch
    import qnnx_backend, qnnx_export, qnnx_backend._session as session

    def refuse(*args, **kwargs):
        raise AssertionError("a loaded function must not export or check operators")

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    qnnx_export.export = refuse
    warnings = []
    logging.getLogger("qnnx_backend").addHandler(Collect(logging.WARNING))
    if "__VERSIONS__":
        real = session.runtime_versions
        session.runtime_versions = lambda: {**real(), "onnxruntime-qnn": "__VERSIONS__"}
    data = torch.load(sys.argv[2])
    with open(sys.argv[1], "rb") as fh:
        try:
            fn = torch.compiler.load_compiled_function(fh)
        except qnnx_backend.errors.QnnDeviceError as exc:
            print(json.dumps({"error": str(exc)}))
            raise SystemExit(0)
    __MODEL__
    with torch.no_grad():
        got = fn(*args)
    torch.save(got, sys.argv[3])
    print(json.dumps({
        "caches": [r.cache for r in qnnx_backend.compile_reports()],
        "devices": [r.device for r in qnnx_backend.compile_reports()],
        "opcheck_imported": "qnnx_opcheck" in sys.modules,
        "warnings": warnings,
    }))
    """
)


def _load_in_subprocess(
    saved: Path,
    inputs: dict[str, object],
    tmp_path: Path,
    *,
    model: str,
    versions: str = "",
    env: dict[str, str] | None = None,
) -> tuple[dict[str, object], object]:
    torch.save(inputs, tmp_path / "inputs.pt")
    code = _LOADER.replace("__MODEL__", model).replace("__VERSIONS__", versions)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(saved), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QNNX_CACHE": "0", **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    out = torch.load(tmp_path / "out.pt") if "error" not in result else None
    return result, out


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w1 + b1) @ w2


def forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()


# The loader builds the same architecture with other weights: the saved weights must be the ones used.
_NET = "torch.manual_seed(1234); model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval(); args = (model, data['x'])"


def test_function_loads_in_a_fresh_process_without_export(tmp_path: Path) -> None:
    """A saved MLP function runs in a new process from its compiled context: same result as eager, no export."""
    args = (torch.randn(4, 8), torch.randn(8, 32), torch.randn(32), torch.randn(32, 4))
    with torch.no_grad():  # the saved guards check the grad mode: the loader calls under no_grad too
        compiled = torch.compile(mlp, backend="qnn", fullgraph=True, options=OPTIONS).aot_compile((args, {}))
        compiled.save_compiled_function(str(tmp_path / "mlp.qnnx"))
    fresh = tuple(torch.randn_like(a) for a in args)
    result, out = _load_in_subprocess(tmp_path / "mlp.qnnx", {"args": fresh}, tmp_path, model="args = data['args']")
    assert result["caches"] == ["aot"]
    assert not result["opcheck_imported"]
    assert_close_fp16(out, mlp(*fresh))


def test_module_weights_are_frozen_into_the_saved_file(tmp_path: Path) -> None:
    """A module wrapped in a function: the loading process's own weights are ignored, the saved ones are used."""
    net, x = _net(), torch.randn(2, 8)
    with torch.no_grad():
        compiled = torch.compile(forward, backend="qnn", fullgraph=True, options=OPTIONS).aot_compile(((net, x), {}))
        compiled.save_compiled_function(str(tmp_path / "net.qnnx"))
        expected = net(x)
    result, out = _load_in_subprocess(tmp_path / "net.qnnx", {"x": x}, tmp_path, model=_NET)
    assert result["caches"] == ["aot"] and not result["warnings"]
    assert_close_fp16(out, expected)


def _save_loose_and_strict(tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The same net saved twice, as loose.qnnx and strict.qnnx (strict=True); returns its input and eager output."""
    net, x = _net(), torch.randn(2, 8)
    with torch.no_grad():
        for name, strict in (("loose.qnnx", False), ("strict.qnnx", True)):
            torch._dynamo.reset()
            options = {**OPTIONS, "strict": strict}
            fn = torch.compile(forward, backend="qnn", fullgraph=True, options=options).aot_compile(((net, x), {}))
            fn.save_compiled_function(str(tmp_path / name))
        return x, net(x)


def test_fingerprint_mismatch_rebuilds_from_the_saved_model_or_raises_under_strict(tmp_path: Path) -> None:
    """Another onnxruntime-qnn: the graph is rebuilt from the saved ONNX model with one warning; strict raises."""
    x, expected = _save_loose_and_strict(tmp_path)
    result, out = _load_in_subprocess(tmp_path / "loose.qnnx", {"x": x}, tmp_path, model=_NET, versions="9.9.9")
    assert result["caches"] == ["aot-rebuilt"]
    assert len(result["warnings"]) == 1 and "onnxruntime-qnn" in result["warnings"][0]
    assert_close_fp16(out, expected)
    result, _ = _load_in_subprocess(tmp_path / "strict.qnnx", {"x": x}, tmp_path, model=_NET, versions="9.9.9")
    assert "onnxruntime-qnn" in result["error"] and "9.9.9" in result["error"] and "strict=False" in result["error"]


def test_where_qnn_is_not_usable_the_saved_model_runs_on_the_cpu_ep_or_strict_raises(tmp_path: Path) -> None:
    """Loaded where its QNN device is not usable, a saved graph runs its saved ONNX model on ONNX Runtime's CPU EP,
    with one warning and float32 results; saved under strict, loading raises and names the way out."""
    x, expected = _save_loose_and_strict(tmp_path)
    off = {"QNNX_DISABLE": "1"}
    result, out = _load_in_subprocess(tmp_path / "loose.qnnx", {"x": x}, tmp_path, model=_NET, env=off)
    assert result["caches"] == ["aot-cpu"] and result["devices"] == ["ort-cpu"]
    assert len(result["warnings"]) == 1 and "CPU EP" in result["warnings"][0]
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)  # float32 on the CPU, not fp16 on HTP
    result, _ = _load_in_subprocess(tmp_path / "strict.qnnx", {"x": x}, tmp_path, model=_NET, env=off)
    assert "not usable here" in result["error"] and "strict=False" in result["error"]


_CRASHING_LOAD = (
    "import os, qnnx_backend._session as s\n"
    "real = s.create_for_device\n"
    "def dies(model, *a, **k):\n"
    "    if str(model).endswith('model_ctx.onnx'):\n"
    "        os._exit(3)  # as a native crash in the EP would: no Python clean-up\n"
    "    return real(model, *a, **k)\n"
    "s.create_for_device = dies\n"
)


def test_a_saved_context_that_killed_its_loader_is_rebuilt_from_the_saved_model(tmp_path: Path) -> None:
    """A process that dies while ONNX Runtime loads a saved context leaves a mark: every later process on this
    machine rebuilds that graph from its saved ONNX model (one warning) instead of crashing the same way."""
    net, x = _net(), torch.randn(2, 8)
    with torch.no_grad():
        expected = net(x)
        fn = torch.compile(forward, backend="qnn", fullgraph=True, options=OPTIONS).aot_compile(((net, x), {}))
        fn.save_compiled_function(str(tmp_path / "net.qnnx"))
    env = {"QNNX_CTXCACHE_DIR": str(tmp_path / "store")}
    torch.save({"x": x}, tmp_path / "inputs.pt")
    crashing = _CRASHING_LOAD + _LOADER.replace("__MODEL__", _NET).replace("__VERSIONS__", "")
    proc = subprocess.run(
        [sys.executable, "-c", crashing, str(tmp_path / "net.qnnx"), str(tmp_path / "inputs.pt"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QNNX_CACHE": "0", **env},
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    for _ in range(2):  # remembered: not only the first process after the crash rebuilds
        result, out = _load_in_subprocess(tmp_path / "net.qnnx", {"x": x}, tmp_path, model=_NET, env=env)
        assert result["caches"] == ["aot-rebuilt"]
        assert len(result["warnings"]) == 1 and "died while loading" in result["warnings"][0]
        assert_close_fp16(out, expected)


def test_a_graph_served_from_the_context_cache_is_saved_with_its_model(tmp_path: Path) -> None:
    """A cache hit has no exported model in memory: saving exports it again, and the file loads and rebuilds."""
    net, x = _net(), torch.randn(2, 8)
    options = {**OPTIONS, "cache": True, "cache_dir": str(tmp_path / "cache")}
    with torch.no_grad():
        expected = net(x)
        for _ in range(2):  # the second compile is a hit
            torch._dynamo.reset()
            fn = torch.compile(forward, backend="qnn", fullgraph=True, options=options).aot_compile(((net, x), {}))
            fn(net, x)
    assert [r.cache for r in qnnx_backend.compile_reports()] == ["miss", "hit"]
    fn.save_compiled_function(str(tmp_path / "hit.qnnx"))
    result, out = _load_in_subprocess(tmp_path / "hit.qnnx", {"x": x}, tmp_path, model=_NET, versions="9.9.9")
    assert result["caches"] == ["aot-rebuilt"]
    assert_close_fp16(out, expected)


def test_a_graph_running_in_pytorch_is_refused_with_the_reason(tmp_path: Path) -> None:
    """A graph that runs in eager PyTorch cannot be saved (the file holds no PyTorch graph): a clear error."""
    net, x = _net(), torch.randn(2, 8)
    with torch.no_grad():
        fn = torch.compile(forward, backend="qnn", fullgraph=True, options={"device": "cpu"}).aot_compile(
            ((net, x), {})
        )
        with pytest.raises(SavedGraphError, match=r"runs in eager PyTorch.*device='cpu'"):
            fn.save_compiled_function(str(tmp_path / "eager.qnnx"))
    assert not (tmp_path / "eager.qnnx").exists()


def test_a_never_called_graph_whose_model_is_gone_is_refused(tmp_path: Path) -> None:
    """Saving compiles a never-called graph from its example inputs; if the model is gone, it says so."""
    with torch.no_grad():
        fn = torch.compile(forward, backend="qnn", fullgraph=True, options=OPTIONS).aot_compile(
            ((_net(), torch.randn(2, 8)), {})
        )
        with pytest.raises(SavedGraphError, match=r"example tensors .* are gone"):
            fn.save_compiled_function(str(tmp_path / "gone.qnnx"))
