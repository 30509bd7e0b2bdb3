"""Shared fixtures for qnnx-detection's tests (the Hypothesis profiles come from the qnnx-testkit plugin)."""

from __future__ import annotations

import pytest
from detection_helpers import QNNX_VARS


@pytest.fixture(autouse=True)
def _clean_qnnx_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test inherits the developer's QNNX_* settings, nor reads or fills the user's probe cache (the folder is
    inherited by the test's subprocesses too)."""
    for name in QNNX_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("QNNX_PROBE_CACHE", raising=False)
    monkeypatch.setenv("QNNX_PROBE_CACHE_DIR", str(tmp_path_factory.mktemp("probe-cache")))
