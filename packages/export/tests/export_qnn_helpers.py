"""Test helpers: QNN HTP simulator and ORT CPU sessions, a Dynamo capture backend, error metrics."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

import qnnx_export as qe

SOC_MODEL = "60"


@functools.cache
def _qnn_device() -> Any:
    import onnxruntime_qnn as oq

    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
    return next(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")


def qnn_session(model: bytes | str) -> ort.InferenceSession:
    """Create an HTP-simulator session with CPU fallback disabled and soc_model pinned."""
    import onnxruntime_qnn as oq

    dev = _qnn_device()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([dev], {"backend_path": oq.get_qnn_htp_path(), "soc_model": SOC_MODEL})
    # The simulator prints a LIBNATIVE line on fd 1 at the first session of a process.
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    try:
        return ort.InferenceSession(model, sess_options=so)
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def cpu_session(model: bytes | str) -> ort.InferenceSession:
    """Create a plain ORT CPU session."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])


def run_exported(sess: ort.InferenceSession, exported: qe.ExportedGraph, args: Sequence[Any]) -> Any:
    """Run an exported graph in ``sess`` with Dynamo-style args and assemble the torch outputs."""
    sig = exported.signature
    ins = sig.onnx_inputs(args)
    outs = sess.run(None, {n: t.numpy() for n, t in zip(sig.input_names, ins, strict=True)})
    return sig.assemble([torch.from_numpy(np.asarray(o)) for o in outs], args)


class Capture:
    """A torch.compile backend that exports every graph and runs it on a chosen ORT session kind."""

    def __init__(self, session: Callable[[bytes], ort.InferenceSession], options: qe.ExportOptions | None = None):
        self.session = session
        self.options = options or qe.ExportOptions()
        self.exported: list[qe.ExportedGraph] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        exported = qe.export(gm, example_inputs, options=self.options)
        self.exported.append(exported)
        sess = self.session(exported.model_bytes())

        def run(*args: Any) -> Any:
            return run_exported(sess, exported, args)

        return run


def compile_and_run(model: torch.nn.Module, inputs: Sequence[Any], backend: Capture) -> Any:
    """torch.compile ``model`` with ``backend`` (fresh Dynamo state) and call it under no_grad."""
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(model, backend=backend, dynamic=False)(*inputs)


def close_on_qnn_fast(
    fn: Callable[..., Any], *inputs: torch.Tensor, tol: float = 1e-3, atol: float = 1e-6
) -> torch.Tensor:
    """Run ``fn`` through the direct translator (which must not decline) on the HTP simulator, CPU fallback off, and
    check eager's dtype, shape and values to ``tol`` of the output's scale plus ``atol``; return the output."""
    ref = fn(*inputs)
    backend = Capture(qnn_session, qe.ExportOptions(exporter="fast"))
    out = compile_and_run(fn, inputs, backend)
    (exported,) = backend.exported
    assert exported.exporter == "fast" and exported.fast_path_declined is None
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert float((out - ref).abs().max()) <= tol * float(ref.abs().max()) + atol
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref|."""
    ref = ref.detach().float()
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors."""
    a, b = out.detach().double().flatten(), ref.detach().double().flatten()
    return float(torch.dot(a, b) / (a.norm() * b.norm()).clamp_min(1e-300))


_CHILD_RUN = """
import sys
import numpy as np
from export_qnn_helpers import cpu_session, qnn_session
feeds = dict(np.load(sys.argv[2]))
model = open(sys.argv[1], "rb").read()
got = qnn_session(model).run(None, feeds)
want = cpu_session(model).run(None, feeds)
print(max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-6)) for g, w in zip(got, want)))
"""


def qnn_error_in_child(model: bytes, feeds: dict[str, np.ndarray]) -> tuple[int, float | None, str]:
    """Run ``model`` on the HTP simulator in a child process (a crash of QNN takes only the child): the child's
    exit status, the largest error relative to the CPU EP's output scale (None when it failed) and its stderr's
    last line."""
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="qnnx-export-child-") as tmp:
        path, data = Path(tmp) / "model.onnx", Path(tmp) / "feeds.npz"
        path.write_bytes(model)
        np.savez(data, **feeds)
        here = str(Path(__file__).resolve().parent)
        path_var = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD_RUN, str(path), str(data)],
            env={**os.environ, "PYTHONPATH": path_var},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    lines = proc.stdout.strip().splitlines()
    error = float(lines[-1]) if proc.returncode == 0 and lines else None
    return proc.returncode, error, (proc.stderr.strip().splitlines() or [""])[-1]
