"""Shared test configuration: Dynamo settings and a fresh Dynamo per test (the Hypothesis profiles come from the
qnnx-testkit plugin)."""

from __future__ import annotations

import pytest
import torch

# Dynamo skips frames that call nn.LSTM/nn.GRU unless allowed (torch 2.13 default allow_rnn=False).
torch._dynamo.config.allow_rnn = True


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    """Every test starts with an empty Dynamo cache (no automatic-dynamic recompiles across tests)."""
    torch._dynamo.reset()
