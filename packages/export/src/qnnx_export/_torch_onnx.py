"""The fallback exporter: torch.onnx (its dynamo exporter) on the frozen graph, quietly, with its ATen->ONNX registry
built once per opset, and its failures condensed into one message."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import re
from typing import TYPE_CHECKING, Any

from qnnx_export._functorch import functorch_levels_kept
from qnnx_export.errors import ExportError

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

__all__ = ["torch_onnx_model"]

log = logging.getLogger("qnnx_export._export")  # the exporter's debug lines keep the logger they always had


def torch_onnx_model(frozen: torch.fx.GraphModule, args: tuple[Any, ...], opset: int) -> ir.Model:
    """Export ``frozen`` called with ``args`` to ONNX at ``opset`` with torch.onnx.

    Raises:
        ExportError: torch.onnx failed; the message names the op and the cause.
    """
    try:
        with functorch_levels_kept():
            program = _export_program(frozen, args, opset)
    except Exception as exc:
        raise ExportError(_describe_failure(exc, frozen)) from exc
    return program.model


@contextlib.contextmanager
def _quiet_logger(name: str) -> Any:
    """Raise one logger's level for the duration (torch 2.13 warns "torchvision is not installed.
    Skipping torchvision::nms" four times when it first builds the ONNX registry)."""
    logger = logging.getLogger(name)
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


@functools.cache
def _onnx_registry(opset: int) -> Any:
    """Build torch.onnx's ATen->ONNX registry once per opset and process.

    ``torch.onnx.export`` (torch 2.13) rebuilds it on every call by parsing the source of ~500
    onnxscript functions, most of each export's time. The private
    ``_registration``/``_core`` modules let us reuse it; if they move we fall back to the public API.
    """
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib(opset_version=opset)


def _export_program(frozen: torch.fx.GraphModule, args: tuple[Any, ...], opset: int) -> Any:
    import warnings

    import torch

    # torch.onnx prints progress to stdout unless verbose=False; it also warns "Exporting a model
    # while it is in training mode" and that torchvision is missing, which is noise for us.
    with (
        warnings.catch_warnings(),
        torch.no_grad(),
        contextlib.redirect_stdout(io.StringIO()),
        _quiet_logger("torch.onnx._internal.exporter._registration"),
        # onnxscript 0.7.2's constant folder warns "Evaluation failed: ..." for folds it skips.
        _quiet_logger("onnxscript.optimizer._constant_folding"),
    ):
        warnings.simplefilter("ignore")
        options: dict[str, Any] = {"verbose": False, "optimize": True, "opset_version": opset}  # either way
        try:
            from torch.onnx._internal.exporter import _core

            registry = _onnx_registry(opset)
        except (ImportError, AttributeError) as exc:  # pragma: no cover - depends on the torch version
            log.debug("private torch.onnx registry API unavailable (%s); using torch.onnx.export", exc)
            return torch.onnx.export(frozen, args, dynamo=True, external_data=False, report=False, **options)
        return _core.export(frozen, args, registry=registry, **options)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _describe_failure(exc: BaseException, frozen: torch.fx.GraphModule) -> str:
    """Condense a torch.onnx failure into one message naming the op/node and the cause."""
    text = _ANSI.sub("", str(exc))
    # torch 2.13's exporter errors carry an "## Exception summary" with the real causes (e.g.
    # "DispatchError: No ONNX function found for <OpOverload(op='aten._linalg_svd' ...)>").
    if "## Exception summary" in text:
        summary = text.split("## Exception summary", 1)[1]
        lines = [ln.strip() for ln in summary.splitlines()]
        lines = [ln for ln in lines if ln and ln != "⬆️" and not ln.startswith("(Refer to")]
        cause = " <- ".join(lines)
    else:
        chain: list[str] = []
        cur: BaseException | None = exc
        while cur is not None and len(chain) < 4:
            first = _ANSI.sub("", str(cur)).strip().splitlines()
            chain.append(f"{type(cur).__name__}: {first[0] if first else ''}")
            cur = cur.__cause__
        cause = " <- ".join(chain)
    ops = sorted(
        {
            str(getattr(n.target, "__name__", n.target))
            for n in frozen.graph.nodes
            if n.op in ("call_function", "call_method")
        }
    )
    named = [op for op in ops if op and op in cause]
    hint = f" Graph ops involved: {', '.join(named[:5])}." if named else ""
    return (
        f"torch.onnx.export could not translate the graph: {cause[:3000]}.{hint} Fix: avoid the op in the "
        "compiled region (run it outside torch.compile) or let the backend fall back for this graph."
    )
