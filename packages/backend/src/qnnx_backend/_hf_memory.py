"""What a model compiled for generation holds on the device: its graphs' weights and contexts, how many weight
copies they hold, and whether one weight-shared context could serve them here."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from qnnx_backend._options import BackendOptions
from qnnx_backend._report import CompileReport, size_text
from qnnx_backend.errors import InvalidOptionsError

__all__ = ["GenerationMemoryReport", "generation_memory", "weight_sharing"]

logger = logging.getLogger("qnnx_backend.hf")  # the generation helpers log under their public module, as before


def weight_sharing(opts: BackendOptions) -> Any:
    """Whether the prefill and decode graphs could share one weight copy in one context here, from qnnx-detection's
    probe (run in child processes once per machine and version: loading a shared context can kill a process).
    Each graph compiles a context with its own weights either way today (a weight-shared group would need every
    graph exported up front, and its load cannot be tried here); the INFO line and :func:`generation_memory` say
    which and why."""
    import qnnx_detection

    if opts.device not in ("auto", "npu") or not qnnx_detection.probe(initialize=False).backend("npu").available:
        return None
    # The SoC the graphs compile for (as the build resolves it): one probe, and one cached verdict, per SoC, whether
    # the caller named it or not.
    soc = opts.soc_model if opts.soc_model is not None else qnnx_detection.resolve_soc_model(None)
    report = qnnx_detection.probe_weight_sharing(soc_model=soc)
    if report.supported:
        logger.info(
            "compile_for_generation: this NPU can load weight-shared contexts; qnnx still compiles each graph "
            "(prefill buckets, decode) with its own weights"
        )
    else:
        logger.info(
            "compile_for_generation: each graph (prefill buckets, decode) holds its own weights: %s", report.reason
        )
    return report


@attrs.frozen(kw_only=True)
class GenerationMemoryReport:
    """What a model compiled by :func:`compile_for_generation` holds on the device: its weights, its contexts on
    disk, and how many copies of the weights those contexts hold (one per graph: each prefill bucket and the
    decode step compile a context with their own weights)."""

    graphs: tuple[CompileReport, ...]
    """The report of each graph compiled so far (prefill buckets and decode, in the order they compiled)."""
    weight_bytes: int | None
    """One copy of the model's weights as the device holds them (float32 counted as float16 on the NPU, quantized
    weights at their width); None before a graph compiled on QNN."""
    context_bytes: int | None
    """The compiled contexts' bytes on disk, summed over the graphs; None when some graph on QNN wrote none
    (``cache=False`` on an unsplit graph)."""
    weight_copies: int
    """How many copies of the weights the model's contexts hold: the graphs on QNN that hold weights."""
    weight_sharing: str
    """Whether one weight-shared context could serve the graphs on this target, from qnnx-detection's probe."""

    def summary(self) -> str:
        """One line, e.g. ``3 graphs on QNN: 12.0 MiB of weights, 3 weight copies, contexts 36.1 MiB on disk;
        weight sharing: not supported on this target (...)``."""
        on_qnn = sum(1 for g in self.graphs if g.on_qnn)
        weights = "weights unknown" if self.weight_bytes is None else f"{size_text(self.weight_bytes)} of weights"
        disk = "" if self.context_bytes is None else f", contexts {size_text(self.context_bytes)} on disk"
        copies = f"{self.weight_copies} weight cop{'y' if self.weight_copies == 1 else 'ies'}"
        return f"{on_qnn} of {len(self.graphs)} graphs on QNN: {weights}, {copies}{disk}; weight sharing: " + (
            self.weight_sharing
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the report."""
        return {
            "graphs": [g.to_dict() for g in self.graphs],
            "weight_bytes": self.weight_bytes,
            "context_bytes": self.context_bytes,
            "weight_copies": self.weight_copies,
            "weight_sharing": self.weight_sharing,
        }


def generation_memory(model: Any) -> GenerationMemoryReport:
    """The memory view of a model compiled by :func:`compile_for_generation`, over the graphs compiled so far.

    Raises:
        InvalidOptionsError: ``model`` was not compiled by :func:`compile_for_generation`.
    """
    graphs = getattr(model, "_qnnx_graphs", None)
    if graphs is None:
        raise InvalidOptionsError(
            f"generation_memory expects a model returned by compile_for_generation, got {type(model).__name__} "
            "that was not compiled by it; call qnnx_backend.hf.compile_for_generation(model, ...) first."
        )
    reports = tuple(graphs)
    holding = [g for g in reports if g.on_qnn and g.weight_copies]
    sizes = [g.weight_bytes for g in holding if g.weight_bytes is not None]
    disk = [g.context_bytes for g in holding]
    return GenerationMemoryReport(
        graphs=reports,
        weight_bytes=max(sizes) if sizes else None,
        context_bytes=None if not disk or any(d is None for d in disk) else sum(d for d in disk if d is not None),
        weight_copies=sum(g.weight_copies for g in holding),
        weight_sharing=_sharing_verdict(getattr(model, "_qnnx_weight_sharing", None)),
    )


def _sharing_verdict(report: Any) -> str:
    if report is None:
        return "not probed (the graphs do not compile for the NPU)"
    if report.supported:
        return "supported on this target; each graph still compiles a context with its own weights"
    return f"not supported on this target ({report.reason})"
