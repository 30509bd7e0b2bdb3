"""The compile context of one graph: the export runs once for every device of the chain, and a failure reaches
every device with its cause (no QNN session needed)."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qnnx_export
from qnnx_backend._export import CompileContext, export_once
from qnnx_backend._options import BackendOptions
from qnnx_backend._program import NoSessionProgram, Target
from qnnx_backend._session import DeviceRejected


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def _context(**options: object) -> CompileContext:
    gm = torch.fx.symbolic_trace(_Tiny().eval())
    args = [torch.randn(2, 4)]
    return CompileContext(
        gm=gm,
        args=args,
        options=BackendOptions.from_mapping({"device": "npu", **options}),
        analysis=qnnx_export.analyze(gm, args),
    )


@pytest.fixture
def counted_export(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """qnnx_export.export, counting its calls."""
    calls: list[int] = []
    real = qnnx_export.export

    def export(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(qnnx_export, "export", export)
    return calls


def test_every_device_and_the_float_retry_share_one_export(counted_export):
    """The graph is exported once: a second device, and the float build after a refused quantization, get the same
    ONNX model."""
    ctx = _context()
    first = export_once(ctx)
    assert export_once(ctx) is first
    assert export_once(ctx.in_float()) is first
    assert ctx.in_float().memo is ctx.memo
    assert len(counted_export) == 1
    assert "export" in ctx.timings


def _failing_export(monkeypatch: pytest.MonkeyPatch, calls: list[int]) -> None:
    def export(*args: object, **kwargs: object) -> object:
        calls.append(1)
        raise RuntimeError("no ONNX for this op\nsecond line of the traceback text")

    monkeypatch.setattr(qnnx_export, "export", export)


def test_a_failed_export_refuses_every_device_with_its_cause_without_exporting_again(monkeypatch):
    """The first device sees the exporter's exception as the cause; later devices are refused with the same one-line
    reason, without a second export, and the memo keeps the reason, not the exception object."""
    calls: list[int] = []
    _failing_export(monkeypatch, calls)
    ctx = _context()
    with pytest.raises(DeviceRejected) as first:
        export_once(ctx)
    assert first.value.cause == "ONNX export failed: no ONNX for this op"
    assert isinstance(first.value.__cause__, RuntimeError)
    with pytest.raises(DeviceRejected) as second:
        export_once(ctx.in_float())
    assert second.value.cause == first.value.cause
    assert second.value.__cause__ is None
    assert calls == [1]
    assert not any(isinstance(value, BaseException) for value in attrs.asdict(ctx.memo, recurse=False).values())


@given(fails=st.booleans(), devices=st.integers(1, 6), floats=st.lists(st.booleans(), min_size=6, max_size=6))
def test_any_number_of_devices_sees_one_export_and_one_outcome(fails, devices, floats):
    """Whatever the number of devices asking, and whether each asks through the float retry, the export runs once
    and every device gets the same outcome."""
    calls: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        if fails:
            _failing_export(mp, calls)
        else:
            real = qnnx_export.export
            mp.setattr(qnnx_export, "export", lambda *a, **k: calls.append(1) or real(*a, **k))
        ctx = _context()
        outcomes = []
        for k in range(devices):
            asking = ctx.in_float() if floats[k] else ctx
            try:
                outcomes.append(id(export_once(asking)))
            except DeviceRejected as exc:
                outcomes.append(exc.cause)
    assert calls == [1]
    assert len(set(map(str, outcomes))) == 1


def test_a_graph_with_nothing_to_run_answers_from_its_arguments():
    """A program without a session returns what the signature assembles from the arguments, and recreating it is
    a no-op."""
    gm = torch.fx.symbolic_trace(lambda x: (x,))
    args = [torch.randn(3)]
    exported = qnnx_export.export(gm, args)
    assert exported.signature.num_onnx_outputs == 0
    program = NoSessionProgram(exported.signature, Target("npu", 60, True, ()))
    (out,) = program.run(args)
    assert out is args[0]
    assert program.recreate() is program
    assert program.target.param_indices == ()
