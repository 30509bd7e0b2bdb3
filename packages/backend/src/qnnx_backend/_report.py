"""Where a compiled graph runs, and why (private; public as :class:`qnnx_backend.CompileReport`)."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

DEVICE_LABELS = {
    "npu": "QNN HTP (NPU)",
    "gpu": "QNN GPU",
    "eager": "PyTorch eager (CPU)",
    "ort-cpu": "ONNX Runtime CPU EP",
}


FINALIZE_ISLAND = "QNN graph finalize failed: "
"""How the reason of a node pinned for a QNN graph finalize failure begins (see ``CompileReport.cpu_nodes``)."""


@attrs.frozen(kw_only=True)
class Attempt:
    """One device the chain tried for a graph."""

    device: str
    """``"npu"`` or ``"gpu"``."""
    ok: bool
    """True when the graph was compiled for this device."""
    reason: str | None = None
    """Why the device was skipped or failed; None when ok."""
    seconds: float = 0.0
    """Time spent on this device (export, checks, session creation)."""


@attrs.frozen(kw_only=True)
class QuantizationReport:
    """How one graph compiled with ``quantize`` was quantized, and how close it stays to float eager PyTorch.

    The figures compare the quantized graph as compiled (on QNN) with the original graph in eager PyTorch, on the
    calibration inputs; over several outputs, the worst one.
    """

    scheme: str
    """The scheme, e.g. ``a16w8`` or ``a8w8 (per-tensor, percentile)``."""
    activation_type: str
    weight_type: str
    samples: int
    """How many calibration inputs were recorded."""
    calibration_sha256: str
    """Digest of the calibration inputs (part of the context-cache key)."""
    used: bool
    """True when the graph runs quantized; False when it fell back to float (see ``reason``)."""
    sqnr_db: float | None = None
    """Signal-to-quantization-noise ratio in dB, ``10 log10(sum ref^2 / sum (out - ref)^2)``; inf when exact."""
    cosine: float | None = None
    """Cosine similarity of the quantized and eager outputs."""
    max_abs_error: float | None = None
    min_sqnr: float | None = None
    """The floor that applied (the ``min_sqnr`` setting)."""
    reason: str | None = None
    """Why the graph does not run quantized, when it does not."""
    weights: tuple[str, ...] = ()
    """The quantized model's weights by type, op and module (layer numbers as ``*``), e.g.
    ``"int4 per-channel: 2 MatMul in model.layers.*.mlp.up_proj"``: the scheme per layer."""

    def summary(self) -> str:
        """E.g. ``a16w8, SQNR 32.5 dB, cosine 0.99972 on 16 samples``."""
        if self.sqnr_db is None:
            figures = "not measured"
        else:
            figures = f"SQNR {self.sqnr_db:.1f} dB, cosine {self.cosine:.5f}, max |err| {self.max_abs_error:.3g}"
        text = f"{self.scheme}, {figures} on {self.samples} calibration sample(s)"
        return text if self.used else f"{text}; runs in float: {self.reason}"


def size_text(n: int) -> str:
    """Bytes as one line says them: KiB below 1 MiB (a tiny graph's weights are not "0.0 MiB"), else MiB."""
    return f"{n / 2**10:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


@attrs.frozen(kw_only=True)
class PartReport:
    """One part of a graph split under ``max_graph_bytes``: one QNN context of its own."""

    first_node: str
    """The ONNX node it begins with."""
    weight_bytes: int
    """The bytes of the weights it holds (float32 counted as float16 on the NPU)."""
    onnx_nodes: int


@attrs.frozen(kw_only=True)
class ExportReport:
    """How a graph became its ONNX model: which exporter made it, why the direct translator declined it (when it
    did), and the model's op types."""

    exporter: str
    """``"fast"`` (qnnx-export's direct ATen-to-ONNX translator), ``"torch.onnx"``, or ``"none"`` (a graph whose
    outputs are all inputs or constants: nothing to export)."""
    fast_path_declined: str | None = None
    """Why the direct translator declined the graph, when ``exporter="auto"`` then used torch.onnx; None otherwise."""
    op_types: Mapping[str, int] = attrs.field(factory=dict)
    """The nodes of the ONNX model's main graph by op type, e.g. ``{"MatMul": 2, "Add": 1}``: the model that was
    compiled (the QDQ model when the graph runs quantized), or the float model when the graph fell back to PyTorch
    after its export. Their sum is ``onnx_nodes`` when the graph runs on QNN."""

    def summary(self) -> str:
        """E.g. ``exported by torch.onnx (the direct translator declined: no translation for aten.sort.default)``."""
        by = "qnnx-export's direct translator" if self.exporter == "fast" else self.exporter
        if self.fast_path_declined:
            return f"exported by {by} (the direct translator declined: {self.fast_path_declined})"
        return f"exported by {by}"


@attrs.frozen(kw_only=True)
class CompileReport:
    """What happened to one Dynamo graph (one static shape): where it runs and why.

    ``device`` is ``"npu"``, ``"gpu"`` or ``"eager"`` (the original PyTorch graph on the CPU); a loaded saved
    function whose QNN device is not usable where it is loaded runs its saved ONNX model on ``"ort-cpu"`` (ONNX
    Runtime's CPU EP).
    """

    graph_id: int
    """This report's number in the process: 0, 1, 2, ... in the order the reports were made."""
    device: str
    requested_device: str
    """The ``device`` option it was compiled with, e.g. ``"auto"``."""
    strict: bool
    """The ``strict`` option it was compiled with: when True, a failure on the chosen device raises (naming the
    device and the cause) instead of falling back."""
    attempts: tuple[Attempt, ...] = ()
    """The QNN devices the chain tried, in order, each with its outcome and the time spent on it."""
    reason: str | None = None
    """Why the graph runs on eager PyTorch (or, loaded from a saved function, on ONNX Runtime's CPU EP), when it does."""
    is_simulator: bool | None = None
    """True when QNN HTP is the host simulator (x86_64), False on Snapdragon silicon, None for eager."""
    soc_model: int | None = None
    soc_name: str | None = None
    cache: str = "off"
    """``"off"``, ``"hit"`` (context loaded, no export), ``"miss"`` (compiled and stored), ``"bypass"``, or for a
    loaded saved function ``"aot"`` (its saved context), ``"aot-rebuilt"`` (rebuilt from its saved ONNX model) or
    ``"aot-cpu"`` (its saved ONNX model on ONNX Runtime's CPU EP)."""
    onnx_nodes: int | None = None
    passes_applied: tuple[str, ...] = ()
    placement: Mapping[str, int] = attrs.field(factory=dict)
    """ONNX nodes per ONNX Runtime execution provider, from ORT's own assignment record (e.g. ``{"QNNExecutionProvider": 12}``)."""
    cpu_nodes: Mapping[str, str] = attrs.field(factory=dict)
    """The nodes pinned to ONNX Runtime's CPU EP (by op type, so other nodes of those types run there too), each
    with its reason: qnnx-opcheck's, or the QNN graph finalize failure they were narrowed to (``"QNN graph finalize
    failed: ...; narrowed to N node(s) (...) by K trials; ..."``); empty when the graph runs wholly on QNN."""
    input_shapes: tuple[tuple[int, ...], ...] = ()
    bucket: tuple[int, ...] | None = None
    """The padded sizes this static graph was compiled for, when it serves a length bucket (see the ``buckets``
    option); calls with smaller sizes are padded to it and their outputs sliced back."""
    timings: Mapping[str, float] = attrs.field(factory=dict)
    """Seconds per stage: analyze, fingerprint, export, opcheck, session, cache_lookup, total."""
    quantization: QuantizationReport | None = None
    """For a graph compiled with the ``quantize`` option: scheme, SQNR and cosine against float eager PyTorch."""
    parts: tuple[PartReport, ...] = ()
    """For a graph whose weights exceed ``max_graph_bytes``: the parts it runs as, one QNN context each, in order
    (empty: one context)."""
    weight_bytes: int | None = None
    """The bytes of the graph's weights as the device holds them: float32 counted as float16 on the NPU (which
    computes floats in float16), quantized weights at their width, and a tensor QNN stores twice counted twice (a
    tied embedding table: as the embedding's table and as the output head's weight); None when unknown (eager, a
    saved function)."""
    context_bytes: int | None = None
    """The bytes on disk of the compiled QNN context(s) the graph runs from (every part; the ``_ctx.onnx`` files and
    the binaries they reference); None when no context was written or loaded (``cache=False`` on one context)."""
    weight_copies: int = 0
    """How many copies of the graph's weights its contexts hold: 1 on QNN (each part holds its own slice), 0 in
    eager PyTorch or for a graph without weights."""
    fx_ops: Mapping[str, int] = attrs.field(factory=dict)
    """The graph's operations as Dynamo traced them, with their counts: ``torch.tan``, ``F.layer_norm``
    (``torch.nn.functional``), ``operator.add``, ``.sum`` (a Tensor method), ``aten.sort`` (an ATen op). Empty for a
    loaded saved function."""
    problem_kinds: tuple[str, ...] = ()
    """The kinds of the problems qnnx-export's graph analysis found (``GraphProblem.kind``, e.g.
    ``"input_mutation"``, ``"empty_tensor"``), sorted: any of them keeps the graph in PyTorch (see ``reason``)."""
    host_outputs: tuple[int, ...] = ()
    """The positions in the graph's output tuple computed in PyTorch beside the QNN graph, each beyond float16's
    range on the example inputs and computed without a matmul or convolution (an attention mask handed to the next
    graph); every other output comes from QNN. Empty: QNN computes every output."""
    export: ExportReport | None = None
    """How the graph was exported to ONNX (the exporter, why the direct translator declined, the op types); None
    when it was not exported (device ``"cpu"``, refused by the analysis or before the export, the export failed,
    a loaded saved function, or a context-cache entry written before this was recorded)."""

    @property
    def on_qnn(self) -> bool:
        """True when the graph runs on a QNN backend."""
        return self.device in ("npu", "gpu")

    def summary(self) -> str:
        """One line, e.g. ``graph 0: QNN HTP (NPU) (simulator, soc 60 SC8380XP), 12 ONNX nodes, 0.81 s``."""
        where = DEVICE_LABELS.get(self.device, self.device)
        if self.on_qnn:
            kind = "simulator" if self.is_simulator else "silicon"
            soc = f"soc {self.soc_model}" + (f" {self.soc_name}" if self.soc_name else "")
            on_cpu = self.placement.get("CPUExecutionProvider", 0)
            split = f" ({on_cpu} of them on the ORT CPU EP)" if on_cpu else ""
            if self.cpu_nodes:
                pinned = ", ".join(list(self.cpu_nodes)[:4])
                more = f" and {len(self.cpu_nodes) - 4} more" if len(self.cpu_nodes) > 4 else ""
                finalize = sum(why.startswith(FINALIZE_ISLAND) for why in self.cpu_nodes.values())
                why = "pinned for qnnx-opcheck" if not finalize else "pinned for qnnx-opcheck or a QNN finalize failure"
                if finalize == len(self.cpu_nodes):
                    why = "pinned for a QNN finalize failure"
                split = f" ({on_cpu} of them on the ORT CPU EP; {why}: {pinned}{more})"
            detail = f"{where} ({kind}, {soc}), {self.onnx_nodes} ONNX nodes{split}, cache {self.cache}"
        else:
            detail = f"{where}: {self.reason}"
        if self.export is not None and self.export.exporter == "torch.onnx":
            detail += f", {self.export.summary()}"  # the fast path is the usual one: only the other is named
        if self.parts:
            sizes = ", ".join(f"{p.weight_bytes / 2**20:.1f}" for p in self.parts)
            detail += f", in {len(self.parts)} parts ({sizes} MiB of weights)"
        if self.on_qnn and self.weight_bytes is not None:
            detail += f", {size_text(self.weight_bytes)} of weights ({self.weight_copies} cop"
            detail += "y)" if self.weight_copies == 1 else "ies)"
            if self.context_bytes is not None:
                detail += f", contexts {size_text(self.context_bytes)} on disk"
        if self.host_outputs:
            where = ", ".join(map(str, self.host_outputs))
            detail += f", output(s) {where} computed in PyTorch (beyond float16's range)"
        if self.bucket is not None:
            detail += f", bucket {list(self.bucket)}"
        if self.quantization is not None:
            detail += f", quantized {self.quantization.summary()}"
        total = self.timings.get("total")
        return f"graph {self.graph_id}: {detail}" + (f", {total:.2f} s" if total is not None else "")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the report."""
        return attrs.asdict(
            self, recurse=True, value_serializer=lambda _i, _a, v: dict(v) if isinstance(v, Mapping) else v
        )


_REPORTS: deque[CompileReport] = deque(maxlen=256)
_LOCK = threading.Lock()
_NEXT_ID = [0]
# The lists that also receive the reports recorded in this context (a model's graphs, for its memory report):
# compiles happen in the caller's thread, on the first call of each graph.
_COLLECTORS: contextvars.ContextVar[tuple[list[CompileReport], ...]] = contextvars.ContextVar(
    "qnnx_report_collectors", default=()
)


def next_graph_id() -> int:
    with _LOCK:
        value = _NEXT_ID[0]
        _NEXT_ID[0] += 1
        return value


def record(report: CompileReport) -> None:
    with _LOCK:
        _REPORTS.append(report)
        for into in _COLLECTORS.get():
            into.append(report)


@contextlib.contextmanager
def collecting(into: list[CompileReport]) -> Iterator[list[CompileReport]]:
    """Also append to ``into`` every report recorded in this context until the block ends."""
    token = _COLLECTORS.set((*_COLLECTORS.get(), into))
    try:
        yield into
    finally:
        _COLLECTORS.reset(token)


def compile_reports() -> tuple[CompileReport, ...]:
    """Reports of the graphs compiled in this process (the most recent 256), oldest first."""
    with _LOCK:
        return tuple(_REPORTS)


def clear_compile_reports() -> None:
    """Forget the recorded reports (graph ids keep counting)."""
    with _LOCK:
        _REPORTS.clear()
