"""Shared set-up of the end-to-end tests: a clean Dynamo per test (the Hypothesis profiles come from the
qnnx-testkit plugin; the comparison helpers are in integration_helpers.py)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch and sees only its own compile reports."""
    import qnnx_backend

    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
