"""What a user sees when QNN is not used: one warning per process, not silence and not one per graph."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import qnnx_backend
from qnnx_backend.errors import QnnDeviceError


def test_disabled_qnn_warns_exactly_once() -> None:
    """With QNNX_DISABLE=1, auto mode runs three graphs in PyTorch and prints one QnnFallbackWarning."""
    code = textwrap.dedent(
        """
        import warnings, torch, qnnx_backend
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f = torch.compile(torch.nn.Linear(4, 4), backend="qnn")
            g = torch.compile(lambda x: x.relu() * 2, backend="qnn")
            with torch.no_grad():
                f(torch.randn(2, 4)); g(torch.randn(3)); f(torch.randn(5, 4))
        mine = [w for w in caught if w.category.__name__ == "QnnFallbackWarning"]
        print(len(mine), all(r.device == "eager" for r in qnnx_backend.compile_reports()))
        print(mine[0].message)
        """
    )
    env = {**os.environ, "QNNX_DISABLE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-1500:]
    count, all_eager = proc.stdout.split("\n")[0].split()
    assert (count, all_eager) == ("1", "True")
    assert "QNNX_DISABLE" in proc.stdout and "once per process" in proc.stdout


def test_recompile_budget_caps_static_graphs() -> None:
    """With max_graphs=2, two sizes compile for QNN; later new sizes run in PyTorch with one warning, still right."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    compiled = torch.compile(model, backend="qnn", dynamic=True, options={"max_graphs": 2, "soc_model": 60})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 5, 3):
            x = torch.randn(n, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=2e-2, atol=2e-2)
    devices = [r.device for r in qnnx_backend.compile_reports()]
    assert devices.count("npu") == 2 and devices.count("eager") == 2, devices
    budget = [w for w in caught if "max_graphs=2" in str(w.message)]
    assert len(budget) == 1 and "[2], [3]" in str(budget[0].message)


def test_recompile_budget_raises_under_strict() -> None:
    """Under strict, a size past max_graphs raises QnnDeviceError naming the sizes and the fix."""
    model = torch.nn.Linear(8, 8).eval()
    options = {"max_graphs": 1, "strict": True, "device": "npu", "soc_model": 60}
    compiled = torch.compile(model, backend="qnn", dynamic=True, options=options)
    with torch.no_grad():
        compiled(torch.randn(2, 8))
        with pytest.raises(QnnDeviceError, match="max_graphs=1"):
            compiled(torch.randn(3, 8))
