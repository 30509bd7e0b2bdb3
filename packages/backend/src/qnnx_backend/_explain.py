"""``qnnx_backend.explain``: what would run where, and why, without (or with) a full compile (private)."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from qnnx_backend._options import CHAIN, OPCHECK_BACKEND, BackendOptions, effective_device
from qnnx_backend._report import DEVICE_LABELS

logger = logging.getLogger(__name__)

_EP_LABEL = {"QNNExecutionProvider": "QNN", "CPUExecutionProvider": "ORT CPU"}


@attrs.frozen(kw_only=True)
class NodeExplanation:
    """One ONNX node of a graph: where it comes from, what opcheck says, and where it runs."""

    onnx_node: str
    op_type: str
    fx_nodes: tuple[str, ...] = ()
    """Where it comes from in the PyTorch model (module path, class and ATen op), when the exporter recorded it."""
    verdict: str | None = None
    """opcheck's verdict for the device the graph runs on: supported / unsupported / hazard."""
    reason: str | None = None
    placement: str | None = None
    """Where ONNX Runtime put it when a session was built: ``QNN``, ``ORT CPU``, or ``fused`` (ORT's graph
    optimizer folded it into a constant or fused it into another node before placement); None when predicted."""


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

    def nodes_on_qnn(self) -> int:
        """Nodes placed (or predicted) on QNN."""
        if self.final_device == "eager":
            return 0
        if self.compiled:
            # Fused nodes were absorbed before placement: they count with QNN when nothing went to the CPU EP.
            on_cpu = any(n.placement == "ORT CPU" for n in self.nodes)
            return sum(1 for n in self.nodes if n.placement == "QNN" or (n.placement == "fused" and not on_cpu))
        return sum(1 for n in self.nodes if n.verdict != "unsupported")


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
            if g.passes_applied:
                lines.append(f"  rewrite passes: {', '.join(g.passes_applied)}")
            for d in g.devices:
                state = "takes the graph" if d.accepted else f"rejected: {d.reason}"
                lines.append(f"  {d.device}: {state}")
            if g.nodes:
                width = max(len(n.onnx_node) for n in g.nodes)
                lines.append(f"  {'ONNX node':<{width}}  {'op':<20} {'verdict':<11} {'placed':<8} from PyTorch")
                for n in g.nodes:
                    placed = n.placement or ("(pred.)" if g.final_device != "eager" else "-")
                    lines.append(
                        f"  {n.onnx_node:<{width}}  {n.op_type:<20} {n.verdict or '-':<11} {placed:<8} {', '.join(n.fx_nodes) or '-'}"
                    )
        return "\n".join(lines)


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
    import qnnx_export
    import qnnx_opcheck
    from qnnx_backend._session import StagedModel

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
        analysis = qnnx_export.analyze(gm, inputs)
        if analysis.problems:
            reason: str | None = "; ".join(p.detail for p in analysis.problems)
            explained.append(GraphExplanation(onnx_nodes=0, devices=(), final_device="eager", reason=reason, **base))
            continue
        from qnnx_backend._compiled import _compiling

        try:
            with _compiling():  # export traces with process-global side effects: serialize with Dynamo
                exported = qnnx_export.export(gm, inputs, analysis=analysis)
        except Exception as exc:
            explained.append(
                GraphExplanation(
                    onnx_nodes=0, devices=(), final_device="eager", reason=f"ONNX export failed: {exc}", **base
                )
            )
            continue
        origins = {name: (origin,) for name, origin in exported.node_origins.items()}
        devices: list[DeviceExplanation] = []
        final, final_report, placement = "eager", None, None
        for dev in chain:
            status = probe.backend(dev)
            report = qnnx_opcheck.check_model(exported.structure, OPCHECK_BACKEND[dev], soc_model=soc)
            bad = tuple(f"{v.op_type} ({v.node_name})" for v in report.unsupported)
            if not status.available:
                devices.append(
                    DeviceExplanation(
                        device=dev, accepted=False, reason=f"unavailable: {status.reason}", unsupported=bad
                    )
                )
                continue
            if bad and opts.partition == "whole":
                devices.append(
                    DeviceExplanation(
                        device=dev, accepted=False, reason=f"{len(bad)} unsupported node(s)", unsupported=bad
                    )
                )
                continue
            if compile:
                try:
                    placement = _placement(StagedModel(exported), dev, soc, opts)
                except Exception as exc:
                    devices.append(
                        DeviceExplanation(device=dev, accepted=False, reason=f"session failed: {exc}", unsupported=bad)
                    )
                    continue
            devices.append(DeviceExplanation(device=dev, accepted=True, unsupported=bad))
            final, final_report = dev, report
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


def _placement(model: bytes | str | os.PathLike[str], device: str, soc: int, opts: BackendOptions) -> dict[str, str]:
    """Build the session the backend would build (same options, same mixed-partition retries) and read ORT's
    placement of each node."""
    from qnnx_backend._session import create_for_device

    session = create_for_device(
        model,
        device,
        {
            "soc_model": soc,
            "provider_options": dict(opts.provider_options),
            "allow_cpu_fallback": opts.partition == "mixed",
        },
    )
    import qnnx_detection

    placed = qnnx_detection.node_placement(session) or {}
    return {name: _EP_LABEL.get(ep, ep) for ep, names in placed.items() for name in names}
