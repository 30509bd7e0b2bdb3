"""What a cold compile imports: a graph that qnnx-export's direct translator takes is compiled without torch.onnx's
exporter and onnxscript, whose first import would add to every cold first call (Dynamo itself imports the
``torch.onnx`` package, not its exporter). Each compile runs in a fresh process, whose ``sys.modules`` is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The exporter behind torch.onnx.export(dynamo=True) and the library it writes ONNX with.
_TORCH_ONNX_EXPORTER = ("onnxscript", "torch.onnx._internal.exporter._core")

_SCRIPT = """
import json, sys, torch
import qnnx_backend
watched = json.loads(sys.argv[2])
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
x = torch.randn(3, 16)
options = {'device': 'npu', 'strict': True, 'soc_model': 60, 'exporter': sys.argv[1]}
with torch.no_grad():
    y = torch.compile(m, backend='qnn', options=options)(x)
    ref = m(x)
r = qnnx_backend.compile_reports()[-1]
print(json.dumps({"device": r.device, "exporter": r.export.exporter,
                  "err": ((y - ref).abs().max() / ref.abs().max()).item(),
                  "imported": sorted(m for m in watched if m in sys.modules)}))
"""


def _compile_in_child(tmp_path: Path, exporter: str) -> dict[str, object]:
    script = tmp_path / "compile.py"
    script.write_text(_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), exporter, json.dumps(_TORCH_ONNX_EXPORTER)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("exporter", "used", "imported"),
    [("auto", "fast", []), ("torch.onnx", "torch.onnx", sorted(_TORCH_ONNX_EXPORTER))],
)
def test_a_translated_graph_compiles_without_torch_onnx_exporter(
    tmp_path: Path, exporter: str, used: str, imported: list[str]
) -> None:
    """A graph the direct translator takes (exporter='auto') runs on QNN and right without importing torch.onnx's
    exporter or onnxscript; the same graph exported by torch.onnx imports both (the watch sees them)."""
    got = _compile_in_child(tmp_path, exporter)
    assert got["device"] == "npu" and got["exporter"] == used
    assert isinstance(got["err"], float) and got["err"] < 2e-2
    assert got["imported"] == imported
