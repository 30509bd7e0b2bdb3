"""The device chain: where one static graph runs, decided and built in one pass (private).

:func:`place` probes the devices, analyses the graph (a graph the QNN path cannot reproduce faithfully runs in
PyTorch, or raises under ``strict``), then tries each device of the chain in order (``device="auto"``: NPU, then
GPU) with one :class:`~qnnx_backend._export.CompileContext`, so the graph is exported (and quantized) once; the
first device whose build succeeds takes the graph, and every attempt is in the report. No device: eager PyTorch.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from qnnx_backend import _report
from qnnx_backend._build import build_program, build_quantized
from qnnx_backend._calibrate import Calibration
from qnnx_backend._compare import EagerReference
from qnnx_backend._export import NOTHING_TO_COMPUTE, CompileContext, analyze, computes_nothing, export_report
from qnnx_backend._host_outputs import HostOutputsProgram, HostSplit, separate
from qnnx_backend._options import CHAIN, BackendOptions, effective_device
from qnnx_backend._program import Program
from qnnx_backend._session import DeviceRejected
from qnnx_backend._trace import op_counts
from qnnx_backend.errors import QnnDeviceError, QnnFallbackWarning, UnsupportedGraphError

logger = logging.getLogger(__name__)


def _strict_hint(kinds: set[str]) -> str:
    """What ``strict`` says of a graph the analysis keeps off QNN, with the fixes that apply to its problems."""
    fixes = []
    if kinds - {"empty_tensor"}:
        fixes.append(
            "call the model under torch.no_grad() and model.eval(), avoid in-place updates of inputs and buffers"
        )
    if "empty_tensor" in kinds:
        fixes.append("give the graph tensors with at least one element (QNN cannot hold an empty one)")
    return (
        "With strict=True qnnx refuses to run such a graph on QNN, since the result would differ from PyTorch. Fix: "
        f"{'; '.join(fixes)}; or use strict=False to run these graphs in PyTorch."
    )


def place(
    gm: torch.fx.GraphModule,
    args: list[object],
    opts: BackendOptions,
    *,
    exclude: frozenset[str],
    graph_id: int,
    timings: dict[str, float],
    shapes: tuple[tuple[int, ...], ...],
    bucket: tuple[int, ...] | None = None,
    calibration: Calibration | None = None,
) -> tuple[Program | None, _report.CompileReport, EagerReference | None]:
    """The program of ``gm`` on the first device of the chain that takes it, the graph's compile report (which
    is recorded), and the eager outputs the compile computed on ``args`` (for the first call's accuracy guard; None
    when it ran none); no program when the graph runs in eager PyTorch. Raises under ``strict`` what a fallback
    would hide."""
    import qnnx_detection

    start = time.perf_counter()
    base: dict[str, Any] = {
        "graph_id": graph_id,
        "requested_device": opts.device,
        "strict": opts.strict,
        "input_shapes": shapes,
        "bucket": bucket,
        "fx_ops": op_counts(gm),
    }

    def eager(
        reason: str,
        attempts: Sequence[_report.Attempt] = (),
        *,
        warn: bool,
        export: _report.ExportReport | None = None,
    ) -> tuple[None, _report.CompileReport, None]:
        timings["total"] = time.perf_counter() - start
        rep = _report.CompileReport(
            device="eager", reason=reason, attempts=tuple(attempts), timings=timings, export=export, **base
        )
        _report.record(rep)
        if warn:
            warnings.warn(
                f"qnn backend: {reason}; running the original PyTorch graph.", QnnFallbackWarning, stacklevel=3
            )
        logger.info("%s", rep.summary())
        return None, rep, None

    # A quick probe (no backend initialized): the session built below is the real test of the device, and its
    # failure carries the true cause. Devices known to be unusable (QNN missing or disabled, no library, no
    # device enumerated) are still skipped without trying.
    probe = qnnx_detection.probe(initialize=False)
    device = effective_device(opts.device, probe.overrides.device)
    if device != opts.device:
        logger.info("QNNX_DEVICE=%s overrides device='auto'", device)
    if device == "cpu":
        return eager("device='cpu' was requested", warn=False)

    t = time.perf_counter()
    analysis = analyze(gm, args, opts)
    timings["analyze"] = time.perf_counter() - t
    base["problem_kinds"] = tuple(sorted({p.kind for p in analysis.problems}))
    if analysis.problems:
        if computes_nothing(gm, args, analysis):
            return eager(NOTHING_TO_COMPUTE, warn=False)
        details = [p.detail for p in analysis.problems]
        if opts.strict:
            raise UnsupportedGraphError(details, _strict_hint({p.kind for p in analysis.problems}))
        return eager("; ".join(details), warn=True)

    devices = [d for d in ([device] if device != "auto" else CHAIN) if d not in exclude]
    attempts: list[_report.Attempt] = []
    # One context for every device of the chain: the graph is exported (and quantized) once.
    ctx = CompileContext(gm=gm, args=args, options=opts, analysis=analysis, timings=timings, calibration=calibration)
    whole = ctx
    host: HostSplit | None = None
    if "npu" in devices and probe.backend("npu").available:
        # Light outputs beyond float16's range (a mask for the next graph) are computed in PyTorch beside the graph.
        ctx, host = separate(ctx)
    for pos, dev in enumerate(devices):
        nxt = devices[pos + 1] if pos + 1 < len(devices) else "eager PyTorch"
        t = time.perf_counter()
        status = probe.backend(dev)
        if not status.available:
            attempts.append(_report.Attempt(device=dev, ok=False, reason=f"skipped: {status.reason}"))
            if opts.strict and device != "auto":
                raise QnnDeviceError(dev, f"the QNN backend is not usable here: {status.reason}")
            logger.info("qnn backend: graph %d: %s unavailable (%s); now trying %s", graph_id, dev, status.reason, nxt)
            continue
        try:
            quantization = None
            if ctx.calibration is not None:
                program, quantization = build_quantized(ctx, dev, graph_id)
            else:
                program = build_program(ctx, dev)
            if attempts:
                _confirm_usable(dev)
            if host is not None:
                program = HostOutputsProgram(program, host)
        except DeviceRejected as exc:
            attempts.append(_report.Attempt(device=dev, ok=False, reason=exc.cause, seconds=time.perf_counter() - t))
            if opts.strict and device != "auto":
                raise QnnDeviceError(dev, exc.cause) from exc.__cause__
            logger.warning("qnn backend: graph %d failed on %s (%s); now trying %s", graph_id, dev, exc.cause, nxt)
            continue
        attempts.append(_report.Attempt(device=dev, ok=True, seconds=time.perf_counter() - t))
        timings["total"] = time.perf_counter() - start
        rep = _report.CompileReport(
            device=dev,
            attempts=tuple(attempts),
            is_simulator=program.target.is_simulator,
            soc_model=program.target.soc_model,
            soc_name=qnnx_detection.soc_name(program.target.soc_model),
            cache=program.cache,
            onnx_nodes=program.onnx_nodes,
            passes_applied=program.passes_applied,
            placement=dict(program.placement),
            cpu_nodes=dict(program.cpu_nodes),
            parts=program.parts,
            weight_bytes=program.weight_bytes,
            context_bytes=program.context_bytes,
            weight_copies=1 if program.weight_bytes else 0,
            timings=timings,
            quantization=quantization,
            export=program.export,
            host_outputs=host.host_positions if host is not None else (),
            **base,
        )
        _report.record(rep)
        logger.info("%s", rep.summary())
        return program, rep, whole.memo.eager
    reasons = "; ".join(f"{a.device}: {a.reason}" for a in attempts) or "no QNN device was tried"
    if opts.strict:  # device='auto' with strict: no device of the chain took the graph
        raise QnnDeviceError(device, f"no QNN device could take the graph ({reasons})")
    reason = f"no QNN device could take the graph ({reasons})"
    if not exclude and attempts and all(a.reason and a.reason.startswith("skipped") for a in attempts):
        _warn_no_device_once(reason)  # nothing was even tried: say so once, not per graph
    return eager(reason, attempts, warn=False, export=export_report(ctx))


def _confirm_usable(device: str) -> None:
    """Raise DeviceRejected when the full probe (which initializes the backend, once per process) finds ``device``
    unusable.

    The chain trusts the quick probe because building the session is the real test of a device, but a session that
    puts nothing on QNN (ONNX Runtime folded every node of the graph into a constant) never initializes the backend:
    measured here, a graph ``torch.full((3,), 1e6)`` that the NPU refused for float16's range was then reported on
    the GPU of a machine without an Adreno GPU. A device reached after an earlier one refused the graph is confirmed.
    """
    import qnnx_detection

    status = qnnx_detection.probe().backend(device)
    if not status.available:
        raise DeviceRejected(f"skipped: {status.reason}")


_no_device_warned = threading.Event()


def _warn_no_device_once(reason: str) -> None:
    """One QnnFallbackWarning per process when auto mode runs graphs in PyTorch because no QNN device is usable
    (QNNX_DISABLE=1, onnxruntime-qnn missing, no device): otherwise the only trace is an INFO log line."""
    if _no_device_warned.is_set():
        return
    _no_device_warned.set()
    warnings.warn(
        f"qnn backend: {reason}; graphs run in PyTorch. This warning is shown once per process; "
        "qnnx_backend.compile_reports() lists every graph.",
        QnnFallbackWarning,
        stacklevel=4,
    )
