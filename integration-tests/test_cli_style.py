"""One CLI style: qnnx-detect, qnnx-opcheck and qnnx-ctxcache share --version, --soc-model (numbers and chip
names), exit code 2 for bad arguments and one JSON error shape, run as the installed programs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import qnnx_clikit
import qnnx_ctxcache
import qnnx_ctxcache.__main__ as ctxcache_cli
import qnnx_detection
import qnnx_opcheck
import qnnx_opcheck.__main__ as opcheck_cli
from qnnx_detection._soc import SOC_TABLE

_PACKAGES = {"qnnx-detect": qnnx_detection, "qnnx-opcheck": qnnx_opcheck, "qnnx-ctxcache": qnnx_ctxcache}


def _run(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    module = {"qnnx-detect": "qnnx_detection", "qnnx-opcheck": "qnnx_opcheck", "qnnx-ctxcache": "qnnx_ctxcache"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("QNNX_")}
    env["QNNX_DISABLE"] = "1"  # qnnx-detect: no backend to initialize, the answer comes at once
    return subprocess.run(
        [sys.executable, "-m", module[program], *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cli") / "relu.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _args(program: str, model: str, *extra: str) -> tuple[str, ...]:
    """A valid command of each CLI, plus ``extra``."""
    return {"qnnx-detect": extra, "qnnx-opcheck": (model, *extra), "qnnx-ctxcache": ("ls", *extra)}[program]


def test_every_cli_and_qnnx_detection_read_one_chip_table() -> None:
    """--soc-model of qnnx-opcheck and qnnx-ctxcache is qnnx-clikit's, and every chip name and alias qnnx-detection
    knows resolves to the same number there, in any spelling."""
    assert {soc.number for soc in SOC_TABLE} == {chip.number for chip in qnnx_clikit.CHIPS}
    for cli in (opcheck_cli, ctxcache_cli):
        assert cli.soc_model is qnnx_clikit.soc_model
    for soc in SOC_TABLE:
        for spelling in (soc.name, soc.marketing_name, *soc.aliases):
            assert qnnx_clikit.soc_model(spelling) == qnnx_detection.resolve_soc_model(spelling) == soc.number
            assert qnnx_clikit.soc_model(spelling.upper().replace(" ", "-")) == soc.number


@pytest.mark.parametrize("program", sorted(_PACKAGES))
def test_version_flag(program: str) -> None:
    """--version prints the program and its distribution's version, exit 0."""
    result = _run(program, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{program} {_PACKAGES[program].__version__}"


@pytest.mark.parametrize("program", sorted(_PACKAGES))
@pytest.mark.parametrize("bad", ["--soc-model=banana", "--soc-model=-3", "--no-such-flag"])
def test_bad_arguments_exit_2_with_one_json_error_shape(program: str, bad: str, model: str) -> None:
    """A bad value or an unknown flag: exit 2, a `<program>: error:` line on stderr, and with --json one
    {"error": {type, message, fix, exit_code}} document on stdout, the same in all three."""
    result = _run(program, *_args(program, model, bad))
    assert result.returncode == 2
    assert f"{program}: error:" in result.stderr and result.stdout == ""
    result = _run(program, *_args(program, model, bad, "--json"))
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert set(error) == {"type", "message", "fix", "exit_code"}
    assert (error["type"], error["exit_code"]) == ("UsageError", 2)
    assert f"{program}: error: {error['message']}" in result.stderr


@pytest.mark.parametrize("program", sorted(_PACKAGES))
def test_soc_model_takes_a_chip_name_in_all_three(program: str, model: str, tmp_path: Path) -> None:
    """--soc-model SM8650 is accepted everywhere (for qnnx-ctxcache, as a filter of an existing cache)."""
    qnnx_ctxcache.ContextStore(tmp_path / "cache")  # creates an empty cache root
    extra = ("--root", str(tmp_path / "cache")) if program == "qnnx-ctxcache" else ()
    args = (*extra, *_args(program, model, "--soc-model", "SM8650"))
    result = _run(program, *args)
    assert result.returncode in (0, 1), result.stderr  # qnnx-detect: 1, QNN is disabled here
    assert "error" not in result.stderr


def test_runtime_errors_exit_3_in_opcheck_and_ctxcache(tmp_path: Path) -> None:
    """An input that cannot be used (a missing model, a missing cache root) exits 3 with the same error shape."""
    missing = str(tmp_path / "absent")
    for program, args in (("qnnx-opcheck", (missing + ".onnx",)), ("qnnx-ctxcache", ("--root", missing, "ls"))):
        result = _run(program, *args, "--json")
        assert result.returncode == 3, (program, result.stderr)
        error = json.loads(result.stdout)["error"]
        assert set(error) == {"type", "message", "fix", "exit_code"} and error["exit_code"] == 3
        assert error["fix"] and f"{program}: error:" in result.stderr
