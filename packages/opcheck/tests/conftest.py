"""Hypothesis profiles and shared helpers for qnnx-opcheck tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile("ci", max_examples=30, derandomize=True, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip @slow tests in a plain run; `-m slow` (nox session "slow") or QNNX_OPCHECK_LIVE_ALL=1 runs them."""
    if config.option.markexpr or os.environ.get("QNNX_OPCHECK_LIVE_ALL") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or QNNX_OPCHECK_LIVE_ALL=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
