"""``qnnx_backend.explain``: what would run where, and why, without (or with) a full compile (private)."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from qnnx_backend._options import CHAIN, BackendOptions, effective_device
from qnnx_backend._parts import held_weight_bytes, part_reports, plan_for
from qnnx_backend._report import DEVICE_LABELS, ExportReport, PartReport, QuantizationReport
from qnnx_backend._split import CpuPlan, opcheck, plan_cpu_nodes

logger = logging.getLogger(__name__)

_EP_LABEL = {"QNNExecutionProvider": "QNN", "CPUExecutionProvider": "ORT CPU"}


@attrs.frozen(kw_only=True)
class NodeExplanation:
    """One ONNX node of a graph: where it comes from, what opcheck says, and where it runs."""

    onnx_node: str
    """The node's name in the exported ONNX model."""
    op_type: str
    """Its ONNX operator, e.g. ``MatMul``."""
    fx_nodes: tuple[str, ...] = ()
    """Where it comes from in the PyTorch model (module path, class and ATen op), when the exporter recorded it."""
    verdict: str | None = None
    """opcheck's verdict for the device the graph runs on: supported / unsupported / hazard."""
    reason: str | None = None
    """opcheck's reason for that verdict: why the node is not plainly supported, or how it is supported (e.g. folded
    by ONNX Runtime); None when opcheck gave none."""
    placement: str | None = None
    """Where ONNX Runtime put it when a session was built: ``QNN``, ``ORT CPU``, or ``fused`` (ORT's graph
    optimizer folded it into a constant or fused it into another node before placement); None when predicted."""
    cpu_reason: str | None = None
    """Why the node is pinned to ONNX Runtime's CPU EP when the graph is split (opcheck's reason, or its op type
    being pinned for another node); None when it is meant for QNN."""


@attrs.frozen(kw_only=True)
class DeviceExplanation:
    """One device of the chain, as tried for one graph."""

    device: str
    accepted: bool
    reason: str | None = None
    unsupported: tuple[str, ...] = ()
    """``OpType (node)`` of every node opcheck rejects on this device."""


@attrs.frozen(kw_only=True)
class GraphExplanation:
    """One Dynamo graph: its devices in order, the final device, and its nodes."""

    index: int
    fx_nodes: int
    onnx_nodes: int
    devices: tuple[DeviceExplanation, ...]
    final_device: str
    reason: str | None = None
    """Why the graph runs on eager PyTorch, when it does."""
    passes_applied: tuple[str, ...] = ()
    nodes: tuple[NodeExplanation, ...] = ()
    compiled: bool = False
    """True when a real session was built and ``placement`` comes from ONNX Runtime itself."""
    quantization: QuantizationReport | None = None
    """With the ``quantize`` option: the graph quantized on the example inputs alone (its verdicts and placement are
    those of the QDQ model), with SQNR and cosine against eager PyTorch computed on ONNX Runtime's CPU EP."""
    cpu_op_types: tuple[str, ...] = ()
    """Op types pinned to ONNX Runtime's CPU EP when the graph is split between it and QNN (see ``partition``)."""
    parts: tuple[PartReport, ...] = ()
    """Where a graph whose weights exceed ``max_graph_bytes`` is cut: the parts it would run as, one QNN context
    each (empty: one context)."""
    max_graph_bytes: int | None = None
    weight_bytes: int | None = None
    """The bytes of the graph's weights as its device would hold them (float32 counted as float16 on the NPU,
    quantized weights at their width); one copy per compiled graph. None when it runs in eager PyTorch."""
    export: ExportReport | None = None
    """How the graph was exported (the exporter, why the direct translator declined, the op types of the model
    explained); None when it was not exported (device ``"cpu"``, refused by the analysis, or the export failed)."""
    host_outputs: tuple[int, ...] = ()
    """The positions of the graph's outputs that PyTorch would compute beside the QNN graph: light outputs beyond
    float16's range (see ``CompileReport.host_outputs``); the nodes listed are those of the graph without them."""

    def nodes_on_qnn(self) -> int:
        """Nodes placed (or predicted) on QNN."""
        if self.final_device == "eager":
            return 0
        if self.compiled:
            # Fused nodes were absorbed before placement: they count with QNN when nothing went to the CPU EP.
            on_cpu = any(n.placement == "ORT CPU" for n in self.nodes)
            return sum(1 for n in self.nodes if n.placement == "QNN" or (n.placement == "fused" and not on_cpu))
        return sum(1 for n in self.nodes if n.cpu_reason is None and n.verdict != "unsupported")


@attrs.frozen(kw_only=True)
class ExplainReport:
    """What :func:`explain` found: the graphs and graph breaks Dynamo made and where each graph runs."""

    graphs: tuple[GraphExplanation, ...]
    graph_breaks: tuple[str, ...]
    is_simulator: bool | None
    soc_model: int | None
    soc_name: str | None
    options: Mapping[str, Any] = attrs.field(factory=dict)

    def summary(self) -> str:
        """One line, e.g. ``3 graphs, 412/412 nodes on QNN HTP (simulator, SC8380XP)``."""
        total = sum(g.onnx_nodes for g in self.graphs)
        on_qnn = sum(g.nodes_on_qnn() for g in self.graphs)
        devices = Counter(g.final_device for g in self.graphs)
        where = ", ".join(f"{DEVICE_LABELS.get(d, d)} x{c}" for d, c in devices.items()) or "nothing"
        kind = "simulator" if self.is_simulator else "silicon"
        soc = self.soc_name or (str(self.soc_model) if self.soc_model is not None else "unknown SoC")
        graphs = f"{len(self.graphs)} graph{'s' if len(self.graphs) != 1 else ''}"
        breaks = f", {len(self.graph_breaks)} graph break(s)" if self.graph_breaks else ""
        return f"{graphs}{breaks}, {on_qnn}/{total} ONNX nodes on QNN ({kind}, {soc}); graphs run on: {where}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return attrs.asdict(
            self, recurse=True, value_serializer=lambda _i, _a, v: dict(v) if isinstance(v, Mapping) else v
        )

    def to_json(self, **kwargs: Any) -> str:
        """The report as JSON text (``json.dumps`` keyword arguments are passed through)."""
        return json.dumps(self.to_dict(), **{"indent": 2, **kwargs})

    def __str__(self) -> str:
        lines = [self.summary()]
        for reason in self.graph_breaks:
            lines.append(f"  graph break: {reason}")
        for g in self.graphs:
            lines.append("")
            head = f"graph {g.index}: {g.fx_nodes} FX nodes -> {g.onnx_nodes} ONNX nodes; runs on {DEVICE_LABELS.get(g.final_device, g.final_device)}"
            lines.append(head + (f" ({g.reason})" if g.reason else ""))
            if g.export is not None:
                lines.append(f"  {g.export.summary()}")
            if g.passes_applied:
                lines.append(f"  rewrite passes: {', '.join(g.passes_applied)}")
            if g.host_outputs and g.final_device != "eager":
                where = ", ".join(map(str, g.host_outputs))
                lines.append(f"  output(s) {where} computed in PyTorch beside QNN (beyond float16's range)")
            if g.quantization is not None:
                lines.append(f"  quantized: {g.quantization.summary()} (example inputs, ORT CPU EP)")
            if g.weight_bytes is not None:
                lines.append(f"  weights: {g.weight_bytes / 2**20:.1f} MiB as the device holds them (one copy)")
            if g.parts:
                cuts = ", ".join(f"{p.first_node} ({p.weight_bytes / 2**20:.1f} MiB)" for p in g.parts)
                lines.append(f"  {len(g.parts)} parts (max_graph_bytes={g.max_graph_bytes}), beginning at: {cuts}")
            for d in g.devices:
                state = "takes the graph" if d.accepted else f"rejected: {d.reason}"
                lines.append(f"  {d.device}: {state}")
            pinned = [n for n in g.nodes if n.cpu_reason is not None]
            if g.final_device != "eager" and g.cpu_op_types:
                on_cpu = (
                    len(g.nodes) - g.nodes_on_qnn()
                    if not g.compiled
                    else sum(n.placement == "ORT CPU" for n in g.nodes)
                )
                lines.append(
                    f"  split: {g.nodes_on_qnn()} ONNX nodes on QNN, {on_cpu} on the ORT CPU EP (pinned op types: "
                    f"{', '.join(g.cpu_op_types)})"
                )
            if g.nodes:
                width = max(len(n.onnx_node) for n in g.nodes)
                lines.append(f"  {'ONNX node':<{width}}  {'op':<20} {'verdict':<11} {'placed':<8} from PyTorch")
                for n in g.nodes:
                    placed = n.placement or _predicted(n, g)
                    lines.append(
                        f"  {n.onnx_node:<{width}}  {n.op_type:<20} {n.verdict or '-':<11} {placed:<8} {', '.join(n.fx_nodes) or '-'}"
                    )
            if g.final_device != "eager" and pinned:
                lines.append("  on the ORT CPU EP, because:")
                lines.extend(f"    {n.onnx_node} ({n.op_type}): {n.cpu_reason}" for n in pinned)
        return "\n".join(lines)


def _predicted(node: NodeExplanation, graph: GraphExplanation) -> str:
    """The placement column of a node no session placed: ``QNN?``/``CPU?`` (predicted from opcheck), ``-``."""
    if graph.final_device == "eager":
        return "-"
    return "CPU?" if node.cpu_reason is not None else "QNN?"


def _capture(model: Any, example_inputs: Sequence[object]) -> tuple[list[tuple[Any, list[object]]], list[str]]:
    import torch

    graphs: list[tuple[Any, list[object]]] = []

    def capture(gm: Any, inputs: Sequence[object]) -> Any:
        graphs.append((gm, list(inputs)))
        return gm.forward

    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(model)(*example_inputs)
        breaks = [str(getattr(r, "reason", r)).strip() for r in explained.break_reasons]
        torch._dynamo.reset()
        torch.compile(model, backend=capture)(*example_inputs)
    finally:
        torch._dynamo.reset()
    return graphs, breaks


def explain(model: Any, *example_inputs: object, compile: bool = False, **options: Any) -> ExplainReport:
    """Explain where ``model`` would run with ``torch.compile(model, backend="qnn", options=options)``.

    Dynamo traces the model on ``example_inputs`` (graph breaks and their reasons are kept); each graph is analysed,
    exported and checked by opcheck for each device of the chain. With ``compile=True`` a real session is built for
    the device that takes the graph, and each node's placement comes from ONNX Runtime's own assignment record.
    Call it the way you call the model (e.g. under ``torch.no_grad()``).

    Returns:
        An :class:`ExplainReport`; ``print(report)`` shows a table, ``report.to_json()`` the same as JSON.
    """
    import qnnx_detection
    from qnnx_backend._build import crashed_compile
    from qnnx_backend._check import fp16_range_refusal
    from qnnx_backend._export import (
        NOTHING_TO_COMPUTE,
        CompileContext,
        analyze,
        computes_nothing,
        export_once,
        export_report,
    )
    from qnnx_backend._host_outputs import separate
    from qnnx_backend._quantize import explain_quantized
    from qnnx_backend._session import DeviceRejected, StagedModel
    from qnnx_backend._trace import compiling, static_variant

    opts = BackendOptions.from_mapping(options)
    probe = qnnx_detection.probe()
    soc = opts.soc_model if opts.soc_model is not None else qnnx_detection.resolve_soc_model(None)
    graphs, breaks = _capture(model, example_inputs)
    device = effective_device(opts.device, probe.overrides.device)
    chain = CHAIN if device == "auto" else (() if device == "cpu" else (device,))

    explained: list[GraphExplanation] = []
    for index, (gm, inputs) in enumerate(graphs):
        fx_count = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        base: dict[str, Any] = {"index": index, "fx_nodes": fx_count}
        if device == "cpu":
            explained.append(
                GraphExplanation(onnx_nodes=0, devices=(), final_device="eager", reason="device='cpu'", **base)
            )
            continue
        # The compile's own analysis and export (write lifting, the exporter, disable_passes, fp16), so that the
        # explanation is of the graph the compile would run: a graph with dynamic sizes as its static variant for
        # these inputs.
        gm, inputs = static_variant(gm, inputs)
        analysis = analyze(gm, inputs, opts)
        if analysis.problems:
            reason: str | None = (
                NOTHING_TO_COMPUTE
                if computes_nothing(gm, inputs, analysis)
                else "; ".join(p.detail for p in analysis.problems)
            )
            explained.append(GraphExplanation(onnx_nodes=0, devices=(), final_device="eager", reason=reason, **base))
            continue
        range_ctx = CompileContext(gm=gm, args=list(inputs), options=opts, analysis=analysis)
        host = None
        if "npu" in chain and probe.backend("npu").available:  # the compile's own split (_chain.place)
            range_ctx, host = separate(range_ctx)
        try:
            with compiling():  # export traces with process-global side effects: serialize with Dynamo
                exported: Any = export_once(range_ctx)  # the float export: an ExportedGraph
        except DeviceRejected as exc:
            # torch.onnx's model may have failed its check on the CPU EP: how it was exported is still known
            base["export"] = export_report(range_ctx)
            explained.append(GraphExplanation(onnx_nodes=0, devices=(), final_device="eager", reason=str(exc), **base))
            continue
        quantization = None
        if opts.quantize is not None:
            exported, quantization = explain_quantized(exported, gm, inputs, opts.quantize, analysis)
        origins = {name: (origin,) for name, origin in exported.node_origins.items()}

        def fp16_range(dev: str, ctx: CompileContext = range_ctx) -> str | None:
            # The compile's own check: the NPU computes in float16 (the GPU is not refused for it).
            return fp16_range_refusal(ctx) if dev == "npu" else None

        devices: list[DeviceExplanation] = []
        final, final_report, placement, final_plan = "eager", None, None, CpuPlan()
        parts: tuple[PartReport, ...] = ()
        held: int | None = None
        for dev in chain:
            status = probe.backend(dev)
            report = opcheck(exported.structure, dev, soc)
            bad = tuple(f"{v.op_type} ({v.node_name})" for v in report.unsupported)
            if not status.available:
                devices.append(
                    DeviceExplanation(
                        device=dev, accepted=False, reason=f"unavailable: {status.reason}", unsupported=bad
                    )
                )
                continue
            mode = opts.resolved_partition
            if bad and mode == "whole":
                devices.append(
                    DeviceExplanation(
                        device=dev, accepted=False, reason=f"{len(bad)} unsupported node(s)", unsupported=bad
                    )
                )
                continue
            range_refusal = fp16_range(dev) if quantization is None or not quantization.used else None
            if range_refusal is not None:
                devices.append(DeviceExplanation(device=dev, accepted=False, reason=range_refusal, unsupported=bad))
                continue
            plan = plan_cpu_nodes(exported.structure, report) if mode != "whole" else CpuPlan()
            if plan and mode == "auto" and not plan.keeps_majority():
                reason = f"split refused, QNN would keep half of the nodes or fewer: {plan.describe(limit=3)}"
                devices.append(DeviceExplanation(device=dev, accepted=False, reason=reason, unsupported=bad))
                continue
            crashed = crashed_compile(range_ctx, exported.structure, dev, plan)
            if crashed is not None:  # the compile's own record: it would not compile the graph here either
                devices.append(DeviceExplanation(device=dev, accepted=False, reason=crashed, unsupported=bad))
                continue
            if compile:
                try:
                    placement = _placement(StagedModel(exported), dev, soc, opts, plan)
                except Exception as exc:
                    devices.append(
                        DeviceExplanation(device=dev, accepted=False, reason=f"session failed: {exc}", unsupported=bad)
                    )
                    continue
            devices.append(DeviceExplanation(device=dev, accepted=True, unsupported=bad))
            final, final_report, final_plan = dev, report, plan
            held = held_weight_bytes(exported.structure, dev)
            planned = plan_for(exported.structure, opts.max_graph_bytes, dev)
            if planned is not None and len(planned[1].parts) > 1:
                parts = part_reports(planned[1])
            break
        verdicts = {v.node_name: v for v in final_report.verdicts} if final_report is not None else {}
        nodes = tuple(
            NodeExplanation(
                onnx_node=n.name,
                op_type=n.op_type,
                fx_nodes=origins.get(n.name, ()),
                verdict=verdicts[n.name].status if n.name in verdicts else None,
                reason=verdicts[n.name].reason if n.name in verdicts else None,
                placement=placement.get(n.name, "fused") if placement is not None else None,
                cpu_reason=_cpu_reason(n, final_plan),
            )
            for n in exported.structure.graph.node
        )
        reason = None if final != "eager" else "; ".join(f"{d.device}: {d.reason}" for d in devices) or "no QNN device"
        explained.append(
            GraphExplanation(
                onnx_nodes=len(exported.structure.graph.node),
                devices=tuple(devices),
                final_device=final,
                reason=reason,
                passes_applied=tuple(exported.passes_applied),
                nodes=nodes,
                compiled=placement is not None,
                quantization=quantization,
                cpu_op_types=final_plan.op_types,
                parts=parts,
                max_graph_bytes=opts.max_graph_bytes if parts else None,
                weight_bytes=held,
                export=export_report(range_ctx, exported),
                host_outputs=host.host_positions if host is not None and final != "eager" else (),
                **base,
            )
        )
    npu = probe.backend("npu")
    return ExplainReport(
        graphs=tuple(explained),
        graph_breaks=tuple(breaks),
        is_simulator=npu.is_simulator if npu.available else None,
        soc_model=soc,
        soc_name=qnnx_detection.soc_name(soc),
        options={k: str(v) for k, v in attrs.asdict(opts).items()},
    )


def _cpu_reason(node: Any, plan: CpuPlan) -> str | None:
    if node.name in plan.nodes:
        return plan.nodes[node.name]
    if node.op_type in plan.op_types:
        return f"its op type {node.op_type} is pinned for another node (onnxruntime-qnn pins op types, not nodes)"
    return None


def _placement(
    model: bytes | str | os.PathLike[str], device: str, soc: int, opts: BackendOptions, plan: CpuPlan
) -> dict[str, str]:
    """Build the session the backend would build (same options, same split, same retries and placement checks) and
    read ORT's placement of each node."""
    import qnnx_detection
    from qnnx_backend import _session
    from qnnx_backend._check import check_share, with_plan
    from qnnx_backend._session import StagedModel

    kwargs = {
        "soc_model": soc,
        "provider_options": dict(opts.provider_options),
        "allow_cpu_fallback": opts.resolved_partition == "mixed",
    }
    staged: Any = model
    if isinstance(model, StagedModel):  # the parts the compile would build, when the weights exceed the budget
        from qnnx_backend._parts import stage_parts

        parts, _line = stage_parts(
            model.path, opts.max_graph_bytes, device=device, cpu_nodes=tuple(plan.nodes), keep=model
        )
        staged = model if parts is None else parts
    session = _session.create_for_device(staged, device, with_plan(kwargs, plan))
    check_share(session, plan, opts)
    placed = qnnx_detection.node_placement(session) or {}
    return {name: _EP_LABEL.get(ep, ep) for ep, names in placed.items() for name in names}
