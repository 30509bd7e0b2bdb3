"""Process-level behaviour: import hygiene, exactly-once EP registration under concurrency, foreign registration."""

from __future__ import annotations

import json
from pathlib import Path

from detection_helpers import run_python

from qnnx_testkit import pythonpath_env

# The spy wraps ONNX Runtime's public registration function before qnnx_detection registers anything; register_ep()
# looks the function up on the onnxruntime module at call time (the documented seam in qnnx_detection.testing).
_SPY = """
import json, threading
import onnxruntime as ort
calls = []
_real = ort.register_execution_provider_library
def spy(name, path):
    calls.append(name)
    return _real(name, path)
ort.register_execution_provider_library = spy
import qnnx_detection as qd
"""


def test_import_does_no_work() -> None:
    """Importing qnnx_detection imports neither onnxruntime, onnxruntime_qnn, onnx nor torch."""
    code = (
        "import sys, qnnx_detection, qnnx_detection.errors\n"
        "heavy = [m for m in ('onnxruntime', 'onnxruntime_qnn', 'onnx', 'torch', 'numpy') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_concurrent_first_calls_register_exactly_once() -> None:
    """16 threads calling probe()/register_ep() at once register the EP once and share one cached report."""
    code = (
        _SPY
        + """
barrier = threading.Barrier(16)
results = []
def work(i):
    barrier.wait()
    results.append(qd.register_ep() if i % 2 else id(qd.probe()))
threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
for t in threads: t.start()
for t in threads: t.join()
names = {r for r in results if isinstance(r, str)}
reports = {r for r in results if isinstance(r, int)}
print(json.dumps({"calls": len(calls), "names": sorted(names), "reports": len(reports), "n": len(results),
                  "usable": list(qd.probe().usable_devices)}))
"""
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {"calls": 1, "names": ["QNNExecutionProvider"], "reports": 1, "n": 16, "usable": ["npu"]}


def test_registration_by_someone_else_counts_as_success() -> None:
    """If user code registered the QNN library first, register_ep() succeeds without registering again."""
    code = (
        _SPY
        + """
import onnxruntime_qnn as oq
_real(oq.get_ep_name(), oq.get_library_path())
name = qd.register_ep()
print(json.dumps({"calls": len(calls), "name": name, "usable": list(qd.probe().usable_devices)}))
"""
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"calls": 0, "name": "QNNExecutionProvider", "usable": ["npu"]}


def test_disabled_probe_loads_no_native_code() -> None:
    """With QNNX_DISABLE=1, probe() reports versions without importing onnxruntime (the escape hatch stays safe)."""
    code = (
        "import sys, json, qnnx_detection as qd\n"
        "r = qd.probe()\n"
        "print(json.dumps({'ort_loaded': 'onnxruntime' in sys.modules, 'usable': list(r.usable_devices),\n"
        "                  'ort': r.versions.onnxruntime, 'reason': r.backend('npu').reason}))\n"
    )
    result = run_python(code, env={"QNNX_DISABLE": "1"})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["ort_loaded"] is False
    assert out["usable"] == []
    assert out["ort"] is not None
    assert "QNNX_DISABLE" in out["reason"]


def test_missing_onnxruntime_qnn_is_a_report_and_register_raises() -> None:
    """When onnxruntime_qnn cannot be imported, probe() reports it and register_ep raises QnnNotInstalledError."""
    code = (
        "import sys, json\n"
        "sys.modules['onnxruntime_qnn'] = None  # makes 'import onnxruntime_qnn' raise ImportError\n"
        "import qnnx_detection as qd\n"
        "r = qd.probe()\n"
        "try:\n"
        "    qd.register_ep()\n"
        "    raised = None\n"
        "except qd.errors.QnnNotInstalledError as exc:\n"
        "    raised = [isinstance(exc, ImportError), str(exc)]\n"
        "print(json.dumps({'usable': list(r.usable_devices), 'reasons': [b.reason for b in r.backends],\n"
        "                  'raised': raised, 'avail': qd.is_available()}))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["usable"] == [] and out["avail"] is False
    assert all("pip install" in reason for reason in out["reasons"])
    assert out["raised"][0] is True
    assert "onnxruntime-qnn" in out["raised"][1]


def test_broken_onnxruntime_qnn_is_a_report(tmp_path: Path) -> None:
    """An onnxruntime_qnn that raises OSError on import yields a report naming the failure, not an exception."""
    package = tmp_path / "onnxruntime_qnn"
    package.mkdir()
    (package / "__init__.py").write_text("raise OSError('libQnnHtp.so: wrong ELF class')\n")
    code = "import json, qnnx_detection as qd\nr = qd.probe()\nprint(json.dumps([b.reason for b in r.backends]))\n"
    result = run_python(code, env=pythonpath_env(tmp_path))
    assert result.returncode == 0, result.stderr
    reasons = json.loads(result.stdout)
    assert all("wrong ELF class" in reason for reason in reasons)
