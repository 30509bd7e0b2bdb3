"""Shared fixtures for qnnx-ctxcache tests (the Hypothesis profiles come from the qnnx-testkit plugin)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import qnnx_ctxcache as cc
from qnnx_ctxcache.testing import forget_verified


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees the user's cache settings, faults or salt; no test inherits another's verify memo."""
    for name in [n for n in os.environ if n.startswith("QNNX_CTXCACHE_")]:
        monkeypatch.delenv(name, raising=False)
    forget_verified()
    yield
    forget_verified()


@pytest.fixture
def store(tmp_path: Path) -> cc.ContextStore:
    """A fresh read-write store with no grace period."""
    return cc.ContextStore(tmp_path / "cache", options=cc.StoreOptions(min_age_seconds=0))
