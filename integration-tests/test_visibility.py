"""What a user sees when QNN is not used: one warning per process, not silence and not one per graph."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


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
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-1500:]
    count, all_eager = proc.stdout.split("\n")[0].split()
    assert (count, all_eager) == ("1", "True")
    assert "QNNX_DISABLE" in proc.stdout and "once per process" in proc.stdout
