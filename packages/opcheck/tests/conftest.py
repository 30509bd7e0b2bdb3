"""qnnx-opcheck's test run: @slow tests are skipped unless asked for (the Hypothesis profiles come from the
qnnx-testkit plugin)."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip @slow tests in a plain run; `-m slow` (nox session "slow") or QNNX_OPCHECK_LIVE_ALL=1 runs them."""
    if config.option.markexpr or os.environ.get("QNNX_OPCHECK_LIVE_ALL") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or QNNX_OPCHECK_LIVE_ALL=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
