"""The garbage collector is held off while a graph compiles and left exactly as the caller had it."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qnnx_backend
from qnnx_backend import _compiled, _trace


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


class _Seen(torch.nn.Module):
    """Records whether the collector was running when the compiled graph is built (first call only)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


@pytest.mark.parametrize("enabled", [True, False])
def test_first_call_leaves_the_collector_as_it_was(enabled: bool) -> None:
    """A real compile on the QNN simulator: the collector is off during it and back to its state after."""
    torch._dynamo.reset()
    seen: list[bool] = []
    original = _compiled.QnnGraph._compile

    def spy(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return original(self, *args, **kwargs)

    (gc.enable if enabled else gc.disable)()
    model = _Seen().eval()
    x = torch.randn(2, 8)
    try:
        _compiled.QnnGraph._compile = spy
        with torch.no_grad():
            out = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True})(x)
    finally:
        _compiled.QnnGraph._compile = original
    assert seen == [False]
    assert gc.isenabled() is enabled
    torch.testing.assert_close(out, model(x).detach(), rtol=5e-2, atol=5e-3)


def test_a_failing_compile_restores_the_collector() -> None:
    torch._dynamo.reset()
    gc.enable()

    class Svd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.linalg.svd(x).S  # no ONNX translation: strict mode raises

    with pytest.raises(qnnx_backend.errors.QnnxBackendError), torch.no_grad():
        torch.compile(Svd(), backend="qnn", options={"device": "npu", "strict": True})(torch.randn(3, 3))
    assert gc.isenabled()


@given(initial=st.booleans(), depths=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=4))
def test_nested_and_concurrent_pauses_restore_the_initial_state(initial: bool, depths: list[int]) -> None:
    (gc.enable if initial else gc.disable)()
    barrier = threading.Barrier(len(depths))
    inside: list[bool] = []

    def worker(depth: int) -> None:
        def nest(k: int) -> None:
            if k == 0:
                barrier.wait(timeout=10)
                inside.append(gc.isenabled())
                return
            with _trace.gc_paused():
                nest(k - 1)

        nest(depth)

    threads = [threading.Thread(target=worker, args=(d,)) for d in depths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert inside == [False] * len(depths)
    assert gc.isenabled() is initial
