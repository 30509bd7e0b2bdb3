"""The qnnx-opcheck CLI, run as a subprocess: exit codes, JSON schema, messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from opcheck_graphs import const, inp, model, node, unary

import qnnx_opcheck as oc


def _run(*args: str, block_heavy: bool = False) -> subprocess.CompletedProcess[str]:
    if block_heavy:
        # sys.modules[name] = None makes any import of it fail: proves the CLI needs neither.
        code = (
            "import sys\n"
            "for m in ('torch', 'onnxruntime', 'onnxruntime_qnn'): sys.modules[m] = None\n"
            "from qnnx_opcheck.__main__ import main\n"
            f"sys.exit(main({list(args)!r}))\n"
        )
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-m", "qnnx_opcheck", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    """A supported two-node model on disk."""
    p = tmp_path / "good.onnx"
    onnx.save(model([node("Relu", ["x"], ["a"]), node("Sigmoid", ["a"], ["y"])], [inp("x", [2, 8])], ["y"]), p)
    return p


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    """A model with one unsupported node (Erf)."""
    p = tmp_path / "bad.onnx"
    onnx.save(
        model([node("Relu", ["x"], ["a"]), node("Erf", ["a"], ["y"], name="the_erf")], [inp("x", [2, 8])], ["y"]), p
    )
    return p


def test_exit_0_when_supported(good: Path) -> None:
    """A supported model exits 0 and prints the per-node table and the summary."""
    r = _run(str(good), "--onnxruntime-qnn", "2.7.0")
    assert r.returncode == 0, r.stderr
    assert "relu" in r.stdout and "sigmoid" in r.stdout
    assert "2/2 nodes supported" in r.stdout.splitlines()[-1]


def test_exit_1_when_unsupported(bad: Path) -> None:
    """A model with an unsupported node exits 1 and names it."""
    r = _run(str(bad), "--onnxruntime-qnn", "2.7.0")
    assert r.returncode == 1
    assert "unsupported: Erf (the_erf)" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("--backend", "tpu"),
        ("--device", "tpu"),
        ("--onnxruntime-qnn", "banana"),
        ("--soc-model", "sixty"),
        ("--soc-model", "-3"),
        ("--json", "--markdown"),
        ("--no-such-flag",),
    ],
)
def test_exit_2_on_usage_errors(good: Path, args: tuple[str, ...]) -> None:
    """Bad options exit 2 with a message on stderr and nothing on stdout."""
    r = _run(str(good), *args)
    assert r.returncode == 2
    assert "qnnx-opcheck: error:" in r.stderr
    assert r.stdout == "" or "--json" in args  # with --json the error is also a JSON document on stdout


def test_a_bad_version_lists_each_table_release_once(good: Path) -> None:
    """--onnxruntime-qnn abc names the accepted form and every release with a table, each once."""
    r = _run(str(good), "--onnxruntime-qnn", "abc")
    assert r.returncode == 2
    releases = sorted({t.onnxruntime_qnn for t in oc.available_tables()})
    line = next(x for x in r.stderr.splitlines() if "error:" in x)
    assert "MAJOR.MINOR[.PATCH]" in line
    assert all(line.count(v) == 1 for v in releases), line


def test_a_negative_soc_model_is_refused_naming_the_accepted_values(good: Path) -> None:
    """--soc-model -3 exits 2 (it used to be accepted with a note), naming numbers and chip names."""
    r = _run(str(good), "--soc-model", "-3")
    assert r.returncode == 2
    assert "non-negative QNN SoC number" in r.stderr and "SM8650" in r.stderr


@pytest.mark.parametrize(("spelling", "number"), [("SM8650", 57), ("sc8380xp", 60), ("x-elite", 60), ("57", 57)])
def test_soc_model_takes_chip_names_and_numbers(good: Path, spelling: str, number: int) -> None:
    """--soc-model accepts QNN numbers and chip names as qnnx-detect does (the table probed for 60 serves 57)."""
    r = _run(str(good), "--soc-model", spelling, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["soc_model"] == 60
    assert number == 60 or any(f"soc_model {number}" in n for n in doc["notes"])


def test_device_is_the_name_and_backend_still_works(good: Path) -> None:
    """--device npu|htp|gpu, as in qnnx-detect and the backend; --backend is the former name of the same flag."""
    for flag, value, table in (("--device", "npu", "htp"), ("--device", "GPU", "gpu"), ("--backend", "htp", "htp")):
        r = _run(str(good), flag, value, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["backend"] == table


def test_missing_model_argument_is_usage_error() -> None:
    """No model path exits 2."""
    assert _run().returncode == 2


def test_exit_3_empty_file(tmp_path: Path) -> None:
    """An empty file exits 3 with a message naming the file and saying it is empty."""
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    r = _run(str(p))
    assert r.returncode == 3
    assert "empty.onnx" in r.stderr and "empty" in r.stderr


def test_exit_3_malformed_file(tmp_path: Path) -> None:
    """A malformed file exits 3 with a clear message."""
    p = tmp_path / "junk.onnx"
    p.write_bytes(b"\x08\x07garbage\xff\xff\xff")
    r = _run(str(p))
    assert r.returncode == 3
    assert "cannot read ONNX model" in r.stderr


def test_exit_3_missing_file(tmp_path: Path) -> None:
    """A path that does not exist exits 3."""
    r = _run(str(tmp_path / "absent.onnx"))
    assert r.returncode == 3
    assert "no such file" in r.stderr


def test_missing_external_data_is_reported(tmp_path: Path) -> None:
    """A model whose external data is missing is still checked; the output names the missing file."""
    m = model([node("MatMul", ["x", "w"], ["y"])], [inp("x", [2, 32])], ["y"], [const("w", np.ones((32, 32)))])
    p = tmp_path / "ext.onnx"
    onnx.save_model(m, p, save_as_external_data=True, location="ext.bin", size_threshold=0)
    (tmp_path / "ext.bin").unlink()
    r = _run(str(p), "--onnxruntime-qnn", "2.7.0")
    assert r.returncode == 0
    assert "ext.bin" in r.stdout and "missing" in r.stdout


def test_json_schema(bad: Path) -> None:
    """--json prints one JSON document with the report schema."""
    r = _run(str(bad), "--json", "--onnxruntime-qnn", "2.7.0", "--soc-model", "60")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert set(doc) >= {
        "backend",
        "onnxruntime_qnn",
        "soc_model",
        "supported",
        "counts",
        "summary",
        "notes",
        "verdicts",
    }
    assert doc["backend"] == "htp" and doc["soc_model"] == 60 and doc["supported"] is False
    assert doc["counts"]["unsupported"] == 1
    for v in doc["verdicts"]:
        assert set(v) >= {"node_name", "op_type", "domain", "status", "reason", "evidence", "dtype"}
        assert v["status"] in ("supported", "unsupported", "hazard")


def test_json_error_document(tmp_path: Path) -> None:
    """With --json, an unreadable model and a usage error print one JSON error document of the same shape on
    stdout (type, message, fix, exit code), the human line on stderr."""
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    for args, code, kind in (
        ((str(p), "--json"), 3, "ModelLoadError"),
        ((str(p), "--json", "--soc-model", "x"), 2, "UsageError"),
    ):
        r = _run(*args)
        assert r.returncode == code
        error = json.loads(r.stdout)["error"]
        assert set(error) == {"type", "message", "fix", "exit_code"}
        assert (error["type"], error["exit_code"]) == (kind, code) and error["fix"]
        assert f"qnnx-opcheck: error: {error['message']}" in r.stderr


def test_markdown(bad: Path) -> None:
    """--markdown prints a Markdown table."""
    r = _run(str(bad), "--markdown", "--onnxruntime-qnn", "2.7.0")
    assert r.returncode == 1
    assert "| # | node | op | dtype | status | reason |" in r.stdout


def test_gpu_backend(good: Path) -> None:
    """--backend gpu (the former name of --device) checks against the GPU table."""
    r = _run(str(good), "--backend", "gpu", "--json", "--onnxruntime-qnn", "2.7.0")
    assert json.loads(r.stdout)["backend"] == "gpu"


def test_help_shows_example_and_exit_codes() -> None:
    """--help shows an example command and the exit codes."""
    r = _run("--help")
    assert r.returncode == 0
    assert "qnnx-opcheck model.onnx" in r.stdout
    assert "exit codes" in r.stdout


def test_runs_without_torch_and_onnxruntime(tmp_path: Path) -> None:
    """The CLI works when torch, onnxruntime and onnxruntime_qnn cannot be imported."""
    p = tmp_path / "m.onnx"
    onnx.save(unary("Relu"), p)
    r = _run(str(p), "--json", block_heavy=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["supported"] is True


def test_version_flag() -> None:
    """--version prints the package version and exits 0."""
    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"qnnx-opcheck {oc.__version__}"


def test_live_runs_the_model_on_the_installed_qnn_ep(good: Path) -> None:
    """--live builds the model on the installed QNN EP (the HTP simulator here) in a child process: every node it
    keeps lands on QNN and the outputs match the CPU EP; text and JSON say so, and the exit code stays 0."""
    pytest.importorskip("onnxruntime_qnn")
    r = _run(str(good), "--onnxruntime-qnn", "2.7.0", "--soc-model", "60", "--live")
    assert r.returncode == 0, r.stderr
    assert "QNNExecutionProvider" in r.stdout and "matches the CPU EP" in r.stdout
    assert "nodes on QNN; outputs match the CPU EP" in r.stdout.splitlines()[-1]
    j = _run(str(good), "--onnxruntime-qnn", "2.7.0", "--live", "--json")
    live = json.loads(j.stdout)["live"]
    assert live["ran"] and live["whole_on_qnn"] and live["outputs_match"], live
    assert {a["ep"] for a in live["assignment"]} == {"QNNExecutionProvider"}


def test_live_without_onnxruntime_is_a_usage_error_with_the_fix(good: Path) -> None:
    """Without onnxruntime-qnn installed, --live exits 2 naming the package to install; the static check still
    needs none of it."""
    r = _run(str(good), "--live", block_heavy=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "onnxruntime-qnn" in r.stderr and "pip install onnxruntime-qnn" in r.stderr
