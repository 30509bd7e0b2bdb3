"""Shared test configuration: Hypothesis profiles, Dynamo settings and quiet logs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci",
    max_examples=10,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Dynamo skips frames that call nn.LSTM/nn.GRU unless allowed (torch 2.13 default allow_rnn=False).
torch._dynamo.config.allow_rnn = True


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    """Every test starts with an empty Dynamo cache (no automatic-dynamic recompiles across tests)."""
    torch._dynamo.reset()
