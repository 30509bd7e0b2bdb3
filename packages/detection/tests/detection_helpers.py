"""Subprocess helpers shared by qnnx-detection's tests (named uniquely, as every package's test helpers are)."""

from __future__ import annotations

import os
import subprocess
import sys

QNNX_VARS = ("QNNX_DISABLE", "QNNX_DEVICE", "QNNX_SOC_MODEL")


def run_python(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` in a fresh interpreter with QNNX_* cleared, plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if k not in QNNX_VARS}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env, timeout=timeout, check=False
    )


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m qnnx_detection`` with ``args`` in a fresh interpreter."""
    full_env = {k: v for k, v in os.environ.items() if k not in QNNX_VARS}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "qnnx_detection", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        check=False,
    )
