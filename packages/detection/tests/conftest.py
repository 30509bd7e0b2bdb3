"""Hypothesis profiles and shared fixtures for qnnx-detection's tests."""

from __future__ import annotations

import os

import pytest
from detection_helpers import QNNX_VARS
from hypothesis import settings

settings.register_profile("dev", max_examples=40, deadline=None)
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def _clean_qnnx_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test inherits the developer's QNNX_* settings."""
    for name in QNNX_VARS:
        monkeypatch.delenv(name, raising=False)
