"""The qnnx-detect CLI, run as a subprocess (python -m qnnx_detection)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from detection_helpers import QNNX_VARS, run_cli

import qnnx_detection as qd
from qnnx_detection.__main__ import render_table
from qnnx_detection.testing import FakeEnvironment, use_environment


def test_json_report_and_exit_0_when_the_npu_is_usable() -> None:
    """--json prints the documented schema on stdout only, and exit status 0 says an accelerator is usable."""
    result = run_cli("--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1
    assert set(data) == {
        "schema_version",
        "usable_devices",
        "backends",
        "versions",
        "platform",
        "overrides",
        "devices",
        "problems",
        "elapsed_s",
        "initialized",
    }
    assert data["initialized"] is True
    assert data["usable_devices"] == ["npu"]
    npu, gpu = data["backends"]
    assert set(npu) == {
        "device",
        "available",
        "reason",
        "library_path",
        "is_simulator",
        "hardware_type",
        "soc_model",
        "soc_name",
        "htp_arch",
        "soc_source",
        "reused",
    }
    assert (npu["device"], npu["available"], npu["is_simulator"], npu["soc_model"]) == ("npu", True, True, 60)
    assert (gpu["device"], gpu["available"]) == ("gpu", False)
    assert "could not initialize" in gpu["reason"]
    assert set(data["versions"]) == {"onnxruntime", "onnxruntime_qnn", "qairt", "python"}
    assert set(data["overrides"]) == {
        "disabled",
        "device",
        "soc_model",
        "raw_disable",
        "raw_device",
        "raw_soc_model",
        "problems",
    }


def test_exit_1_when_disabled_and_device_flag() -> None:
    """QNNX_DISABLE=1 gives exit 1 with the reason in the table; --device gpu gives 1 on this machine."""
    result = run_cli(env={"QNNX_DISABLE": "1"})
    assert result.returncode == 1, result.stderr
    assert "QNNX_DISABLE" in result.stdout
    assert "usable QNN devices: none" in result.stdout
    result = run_cli("--device", "gpu", "--json", env={"QNNX_SOC_MODEL": "SM8650", "QNNX_DISABLE": "yes"})
    assert result.returncode == 1
    assert json.loads(result.stdout)["overrides"]["soc_model"] == 57


def test_exit_2_on_usage_errors() -> None:
    """Unknown options and bad --device values exit 2 with a message on stderr and nothing on stdout."""
    for args in (["--bogus"], ["--device", "tpu"]):
        result = run_cli(*args)
        assert result.returncode == 2
        assert result.stdout == ""
        assert "usage: qnnx-detect" in result.stderr


def test_help_shows_examples_and_exit_codes() -> None:
    """--help lists an example invocation, the environment variables and the exit statuses."""
    result = run_cli("--help")
    assert result.returncode == 0
    for fragment in ("examples:", "qnnx-detect --json", "QNNX_DISABLE=1", "exit status:", "2  usage error"):
        assert fragment in result.stdout


def _console_script() -> str | None:
    beside = Path(sys.executable).with_name("qnnx-detect")
    return str(beside) if beside.exists() else shutil.which("qnnx-detect")


@pytest.mark.skipif(_console_script() is None, reason="console script not installed in this environment")
def test_console_script_entry_point() -> None:
    """The installed qnnx-detect console script runs main() and honours the exit status."""
    env = {k: v for k, v in os.environ.items() if k not in QNNX_VARS}
    env["QNNX_DISABLE"] = "1"
    exe = _console_script()
    assert exe is not None
    result = subprocess.run([exe, "--json"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["overrides"]["disabled"] is True


def test_table_for_a_snapdragon_laptop() -> None:
    """The table names silicon hardware, the SoC with its source, and lists every unavailable reason."""
    with use_environment(FakeEnvironment.snapdragon(soc_model=60, gpu=False)):
        text = render_table(qd.probe())
    assert "NPU (Hexagon HTP)" in text
    assert "60 SC8380XP (Snapdragon X Elite, HTP v73) [detected]" in text
    assert "gpu unavailable: the QNN GPU backend could not initialize" in text
    assert "usable QNN devices: npu" in text


def test_closed_pipe_is_not_an_error() -> None:
    """`qnnx-detect --json | head -c0`: a reader that leaves early causes no traceback and keeps the exit status."""
    env = {k: v for k, v in os.environ.items() if k not in QNNX_VARS}
    env["QNNX_DISABLE"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qnnx_detection", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has started: its first write hits a closed pipe
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("spelling", ["SM8650", "57", "snapdragon-8-gen-3"])
def test_soc_model_flag_takes_numbers_and_chip_names(spelling: str) -> None:
    """--soc-model probes the simulator as that SoC, like QNNX_SOC_MODEL (and overrides it)."""
    result = run_cli("--soc-model", spelling, "--json", env={"QNNX_DISABLE": "1", "QNNX_SOC_MODEL": "60"})
    assert result.returncode == 1, result.stderr  # QNN disabled: the report still resolves the SoC
    assert json.loads(result.stdout)["overrides"]["soc_model"] == 57


def test_bad_soc_model_is_a_usage_error_with_one_json_error_shape() -> None:
    """--soc-model banana exits 2 naming the accepted values on stderr; with --json the same error is one JSON
    document on stdout (type, message, fix, exit code), as in qnnx-opcheck and qnnx-ctxcache."""
    result = run_cli("--soc-model", "banana")
    assert result.returncode == 2 and result.stdout == ""
    assert "qnnx-detect: error:" in result.stderr and "SM8650" in result.stderr
    result = run_cli("--soc-model", "-1", "--json")
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert set(error) == {"type", "message", "fix", "exit_code"}
    assert (error["type"], error["exit_code"]) == ("UsageError", 2) and "negative" in error["message"]
