"""Helpers shared by the qnnx-ctxcache tests (importable by name: `pythonpath = ["tests"]` in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import qnnx_ctxcache as cc

TESTS_DIR = Path(__file__).resolve().parent


def key_for(name: str = "m", **overrides: object) -> cc.CacheKey:
    """A key with plausible QNN material; ``name`` varies the model digest."""
    fields: dict[str, object] = {
        "model_digest": f"sha256:{name}",
        "ep_name": "QNNExecutionProvider",
        "ep_options": {"backend_type": "htp", "soc_model": "60"},
        "session_config": {"session.disable_cpu_ep_fallback": "1"},
        "versions": {"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0"},
        "input_specs": [{"name": "x", "shape": [1, 4], "dtype": "float32"}],
        "target": {"soc_model": 60},
    }
    fields.update(overrides)
    return cc.make_key(**fields)  # type: ignore[arg-type]


def run_child(
    code: str, *, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run Python code in a fresh interpreter (spawn semantics) with the package importable."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("QNNX_CTXCACHE_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


CHILD_PRELUDE = """
import sys, json, pathlib
import qnnx_ctxcache as cc
from qnnx_ctxcache.testing import FakeBuild
def key_for(name="m"):
    return cc.make_key(
        model_digest=f"sha256:{name}", ep_name="QNNExecutionProvider",
        ep_options={"backend_type": "htp", "soc_model": "60"},
        session_config={"session.disable_cpu_ep_fallback": "1"},
        versions={"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0"},
        input_specs=[{"name": "x", "shape": [1, 4], "dtype": "float32"}], target={"soc_model": 60})
"""
