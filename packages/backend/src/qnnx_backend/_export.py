"""The export stage: one static graph becomes its ONNX model, once per graph whatever the device (private).

One :class:`CompileContext` carries everything the compile of a graph reads, for every device of the chain; its
:class:`ExportMemo` keeps what is computed once per graph (the export, the fingerprint, the quantized model, the
float16 range check). A failure is kept as its cause, and raised as ``_session.DeviceRejected`` (or
``_quantspec.QuantizeFailed``) for every device that asks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import torch

from qnnx_backend._calibrate import Calibration
from qnnx_backend._compare import EagerReference
from qnnx_backend._faithful import check_on_cpu
from qnnx_backend._options import BackendOptions
from qnnx_backend._quantize import QuantizedModel, failure, quantize_model
from qnnx_backend._quantspec import QuantizeFailed
from qnnx_backend._report import ExportReport
from qnnx_backend._session import DeviceRejected

if TYPE_CHECKING:
    import onnx

    from qnnx_export import GraphAnalysis, GraphSignature


class CompilableModel(Protocol):
    """An ONNX model ready for a QNN session: qnnx-export's ``ExportedGraph``, or its quantized form."""

    @property
    def signature(self) -> GraphSignature: ...
    @property
    def structure(self) -> onnx.ModelProto: ...
    @property
    def passes_applied(self) -> tuple[str, ...]: ...

    def save(self, path: str | Path, *, external_data: bool | None = None) -> Path: ...


@attrs.define(eq=False)
class ExportMemo:
    """What the compile of one graph computes once, for whichever device asks first.

    A failure is kept as its one-line cause, not as the exception: the device that met it raised it with its
    traceback, and every later device of the chain is refused with the same cause without trying again. ``eager``
    is the float16 range check's run of the graph in eager PyTorch, which the first call's accuracy guard reads
    instead of running the graph again.
    """

    exported: Any = None
    export_refusal: str | None = None
    export_report: ExportReport | None = None  # also when torch.onnx's model then failed its check on the CPU EP
    fingerprint: str | None = None
    quantized: Any = None
    quantize_refusal: str | None = None
    range_checked: bool = False
    range_refusal: str | None = None
    eager: EagerReference | None = None  # the range check's eager outputs, for the first call's accuracy guard


@attrs.frozen(eq=False)
class CompileContext:
    """The compile of one static graph: the graph, its example arguments, the options and the graph's analysis.

    ``timings`` is the compile report's own dict, filled in by each stage. ``calibration`` asks for the quantized
    graph; :meth:`in_float` gives the same compile without it (sharing the float export).
    """

    gm: torch.fx.GraphModule
    args: Sequence[object]
    options: BackendOptions
    analysis: GraphAnalysis
    timings: dict[str, float] = attrs.field(factory=dict)
    calibration: Calibration | None = None
    memo: ExportMemo = attrs.field(factory=ExportMemo)

    def in_float(self) -> CompileContext:
        return attrs.evolve(self, calibration=None)


def first_line(exc: BaseException, limit: int = 400) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _export_dtype(fp16: bool) -> torch.dtype:
    """The float dtype a bfloat16 graph is exported in: QNN has no bfloat16 (HTP computes floats in fp16)."""
    return torch.float16 if fp16 else torch.float32


def _export_args(args: Sequence[object], fp16: bool) -> list[object]:
    """The arguments the graph is exported with: with ``fp16`` every float tensor in float16; bfloat16 tensors
    in :func:`_export_dtype`. The program casts the caller's tensors the same way at each call."""
    want = _export_dtype(fp16)
    return [
        a.detach().to(want)
        if isinstance(a, torch.Tensor)
        and a.is_floating_point()
        and (a.dtype == torch.bfloat16 or (fp16 and a.dtype != want))
        else a
        for a in args
    ]


def _replace_bfloat16(value: Any, want: torch.dtype) -> Any:
    if value is torch.bfloat16:
        return want
    if isinstance(value, tuple | list):
        return type(value)(_replace_bfloat16(v, want) for v in value)
    if isinstance(value, dict):
        return {k: _replace_bfloat16(v, want) for k, v in value.items()}
    return value


def _export_graph(gm: torch.fx.GraphModule, args: Sequence[object], fp16: bool) -> torch.fx.GraphModule:
    """The graph the export reads: ``gm`` itself, or, when it computes in bfloat16 (a model loaded with
    ``torch_dtype=torch.bfloat16``), a copy whose bfloat16 casts and factories make :func:`_export_dtype` instead,
    so that the whole graph computes in one float dtype QNN has. The caller's graph is not changed."""
    import copy

    casts = any(
        (n.op == "call_method" and n.target == "bfloat16")
        or any(v is torch.bfloat16 for v in (*n.args, *n.kwargs.values()))
        for n in gm.graph.nodes
    )
    inputs = any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args)
    if not casts and not inputs:
        return gm
    want = _export_dtype(fp16)
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        node.args = _replace_bfloat16(node.args, want)
        node.kwargs = _replace_bfloat16(node.kwargs, want)
        if node.op == "call_method" and node.target == "bfloat16":
            node.target = "half" if want == torch.float16 else "float"
    converted = torch.fx.GraphModule(gm, graph)
    for name, value in list(converted.named_buffers()) + list(converted.named_parameters()):
        if value.dtype != torch.bfloat16:
            continue
        if "." in name:  # a submodule's tensor: the copy shares the submodule with the caller's graph
            raise NotImplementedError(f"the graph holds a bfloat16 tensor of a submodule ({name}), not an argument")
        delattr(converted, name)
        converted.register_buffer(name, value.detach().to(want))  # a constant of the graph (``_tensor_constant0``)
    return converted


def analyze(gm: torch.fx.GraphModule, args: Sequence[object], opts: BackendOptions) -> GraphAnalysis:
    """The graph's analysis as the compile (and ``explain``) uses it: with the options' exporter, in-place writes
    to inputs and buffers are lifted to outputs that the caller writes back after each run (the direct translator
    only: torch.onnx drops such writes)."""
    import qnnx_export

    analysis = qnnx_export.analyze(gm, args)
    if opts.exporter != "torch.onnx":
        analysis = qnnx_export.lift_mutations(analysis) or analysis
    return analysis


NOTHING_TO_COMPUTE = (
    "nothing to compute: every output of the graph has zero elements and it writes no argument, so PyTorch returns "
    "them (QNN cannot hold an empty tensor)"
)


def computes_nothing(gm: torch.fx.GraphModule, args: Sequence[object], analysis: GraphAnalysis) -> bool:
    """Whether the only thing that keeps ``gm`` off QNN is empty tensors, and nothing it returns or writes holds an
    element: its tensor outputs all have zero elements, and any argument it writes in place has none either.

    Such a graph (an empty batch, a zero-length sequence) has no result to compute: it runs in PyTorch, which makes
    its empty outputs, without a fallback warning and under ``strict`` too. A graph with an empty tensor whose
    outputs hold elements (the sum over an empty axis) is computed, and stays a fallback."""
    from torch.utils._pytree import tree_leaves

    import qnnx_export

    if not analysis.problems or any(p.kind != "empty_tensor" for p in analysis.problems):
        return False
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = [
        leaf.meta.get("example_value", leaf.meta.get("val"))
        for leaf in tree_leaves(output.args)
        if isinstance(leaf, torch.fx.Node)
    ]
    tensors = [v for v in returned if isinstance(v, torch.Tensor)]
    if not tensors or len(tensors) != len(returned):
        return False
    try:
        if any(int(v.numel()) != 0 for v in tensors):
            return False
    except Exception:  # a symbolic size: not known to be empty
        return False
    written = qnnx_export.written_arguments(gm)
    written_values = [args[i] for i in written]
    return all(isinstance(v, torch.Tensor) and v.numel() == 0 for v in written_values)


def export_once(ctx: CompileContext) -> CompilableModel:
    """The graph's ONNX model (quantized when ``ctx`` asks for it), exported once per graph.

    Raises DeviceRejected when the export failed (or torch.onnx's model failed its check), and
    ``QuantizeFailed`` when quantizing it failed.
    """
    memo = ctx.memo
    if memo.export_refusal is not None:
        raise DeviceRejected(memo.export_refusal)
    if memo.exported is None:
        memo.exported = _export(ctx)
    if ctx.calibration is not None:
        return _quantized_once(memo.exported, ctx)
    exported: CompilableModel = memo.exported
    return exported


def op_type_counts(structure: onnx.ModelProto) -> dict[str, int]:
    """The nodes of the model's main graph by op type, sorted by name."""
    counts: dict[str, int] = {}
    for node in structure.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def export_report(ctx: CompileContext, compiled: CompilableModel | None = None) -> ExportReport | None:
    """What the graph's export made, from what the export has in hand (no ONNX parsing): the exporter, why the
    direct translator declined, and the op types of ``compiled`` (the model compiled, e.g. the QDQ model; by default
    the float export). None when the graph was not exported (or its export failed)."""
    report = ctx.memo.export_report
    if report is None or compiled is None or compiled is ctx.memo.exported:
        return report
    return attrs.evolve(report, op_types=op_type_counts(compiled.structure))


def _quantized_once(exported: Any, ctx: CompileContext) -> QuantizedModel:
    """The QDQ model of ``exported`` for ``ctx.calibration``, made once per graph (``ctx.memo``); raises
    QuantizeFailed, with the same cause for every device once it failed."""
    memo = ctx.memo
    if memo.quantize_refusal is not None:
        raise QuantizeFailed(memo.quantize_refusal)
    if memo.quantized is None:
        assert ctx.calibration is not None
        t = time.perf_counter()
        try:
            memo.quantized = quantize_model(exported, ctx.args, ctx.calibration)
        except Exception as exc:
            memo.quantize_refusal = failure(exc)
            raise QuantizeFailed(memo.quantize_refusal) from exc
        finally:
            ctx.timings["quantize"] = time.perf_counter() - t
    quantized: QuantizedModel = memo.quantized
    return quantized


# The passes that write eager's NaN and infinities into a float graph (HTP's Log and Div give finite numbers there,
# which the per-call range check then sees). A quantized graph holds no infinity: its tensors have finite ranges and
# a calibrated inf would give an infinite scale, so its graphs are exported without them.
_NONFINITE_EDGE_PASSES = {"log_domain_edges", "div_by_zero_edges"}
# And the floor of softmax inputs (a float-graph fix of fp16 saturation), not measured on calibrated QDQ graphs,
# whose ranges it would change; and GELU and Sigmoid written out in float16-precise ops, which a QDQ graph would
# quantize op by op (8-25 quantization steps where one Gelu or Sigmoid has one).
_FLOAT_ONLY_PASSES = _NONFINITE_EDGE_PASSES | {"softmax_input_floor", "gelu_written_out", "sigmoid_written_out"}


def _export(ctx: CompileContext) -> Any:
    import qnnx_export

    opts, memo = ctx.options, ctx.memo
    t = time.perf_counter()
    export_args = _export_args(ctx.args, opts.fp16)
    export_gm = ctx.gm
    try:
        export_gm = _export_graph(ctx.gm, ctx.args, opts.fp16)
        passes = None
        skipped = set(opts.disable_passes) | (_FLOAT_ONLY_PASSES if opts.quantize is not None else set())
        if skipped:
            default = qnnx_export.ExportOptions().resolved_passes()
            passes = tuple(p for p in default if p not in skipped)
        export_options = qnnx_export.ExportOptions(
            passes=passes,
            exporter=opts.exporter,
            lift_mutations=bool(ctx.analysis.mutated_indices),
            max_dense_experts=opts.max_dense_experts,
            max_gathered_expert_bytes=opts.max_gathered_expert_bytes,
        )
        exported = qnnx_export.export(export_gm, export_args, options=export_options, analysis=ctx.analysis)
    except Exception as exc:
        memo.export_refusal = f"ONNX export failed: {first_line(exc)}"
        raise DeviceRejected(memo.export_refusal) from exc
    finally:
        ctx.timings["export"] = time.perf_counter() - t
    memo.export_report = ExportReport(
        exporter=exported.exporter,
        fast_path_declined=exported.fast_path_declined,
        op_types=op_type_counts(exported.structure),
    )
    if exported.exporter == "torch.onnx":
        # torch.onnx lowers some ops unfaithfully without an error: verify its model on the CPU EP first.
        t = time.perf_counter()
        if export_gm is ctx.gm:
            problem = check_on_cpu(exported, ctx.gm, ctx.args, export_args)
        else:  # a bfloat16 graph: the reference is its float copy on the arguments in float32
            problem = check_on_cpu(exported, export_gm, _export_args(ctx.args, False), export_args)
        ctx.timings["verify_export"] = time.perf_counter() - t
        if problem is not None:
            memo.export_refusal = (
                "torch.onnx's ONNX model of this graph did not pass the check against PyTorch on ONNX Runtime's CPU "
                f"EP, before any QNN ({problem}); it is not compiled"
            )
            raise DeviceRejected(memo.export_refusal)
    return exported
