"""Compile one static graph for one QNN device: export once, check the operators, create the session, or load the
compiled context from the cache (private).

One :class:`CompileContext` carries everything the compile of a graph reads, for every device of the chain; its
:class:`ExportMemo` keeps what is computed once per graph whatever the device (the export, the fingerprint, the
quantized model). A device that cannot take the graph raises ``_session.DeviceRejected`` with the cause.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import torch

from qnnx_backend import _session
from qnnx_backend._options import OPCHECK_BACKEND, BackendOptions
from qnnx_backend._program import (
    NoSessionProgram,
    Program,
    QnnProgram,
    SessionSource,
    Target,
    output_dtypes,
    placement_counts,
)
from qnnx_backend._session import DeviceRejected, StagedModel
from qnnx_backend._split import CpuPlan, plan_cpu_nodes

if TYPE_CHECKING:
    import onnx

    from qnnx_backend._quantize import Calibration
    from qnnx_export import GraphAnalysis, GraphSignature

logger = logging.getLogger(__name__)


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
    traceback, and every later device of the chain is refused with the same cause without trying again.
    """

    exported: Any = None
    export_refusal: str | None = None
    fingerprint: str | None = None
    quantized: Any = None
    quantize_refusal: str | None = None
    range_checked: bool = False
    range_refusal: str | None = None


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


def _first_line(exc: BaseException, limit: int = 400) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _export_args(args: Sequence[object], fp16: bool) -> list[object]:
    if not fp16:
        return list(args)
    return [
        a.detach().half() if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float16 else a
        for a in args
    ]


def analyze(gm: torch.fx.GraphModule, args: Sequence[object], opts: BackendOptions) -> GraphAnalysis:
    """The graph's analysis as the compile (and ``explain``) uses it: with the options' exporter, in-place writes
    to inputs and buffers are lifted to outputs that the caller writes back after each run (the direct translator
    only: torch.onnx drops such writes)."""
    import qnnx_export

    analysis = qnnx_export.analyze(gm, args)
    if opts.exporter != "torch.onnx":
        analysis = qnnx_export.lift_mutations(analysis) or analysis
    return analysis


def export_once(ctx: CompileContext) -> CompilableModel:
    """The graph's ONNX model (quantized when ``ctx`` asks for it), exported once per graph.

    Raises DeviceRejected when the export failed (or torch.onnx's model failed its check), and
    ``_quantize.QuantizeFailed`` when quantizing it failed.
    """
    memo = ctx.memo
    if memo.export_refusal is not None:
        raise DeviceRejected(memo.export_refusal)
    if memo.exported is None:
        memo.exported = _export(ctx)
    if ctx.calibration is not None:
        from qnnx_backend._quantize import quantized_model

        return quantized_model(memo.exported, ctx)
    exported: CompilableModel = memo.exported
    return exported


def _export(ctx: CompileContext) -> Any:
    import qnnx_export

    opts, memo = ctx.options, ctx.memo
    t = time.perf_counter()
    export_args = _export_args(ctx.args, opts.fp16)
    try:
        passes = None
        if opts.disable_passes:
            default = qnnx_export.ExportOptions().resolved_passes()
            passes = tuple(p for p in default if p not in opts.disable_passes)
        export_options = qnnx_export.ExportOptions(
            passes=passes, exporter=opts.exporter, lift_mutations=bool(ctx.analysis.mutated_indices)
        )
        exported = qnnx_export.export(ctx.gm, export_args, options=export_options, analysis=ctx.analysis)
    except Exception as exc:
        memo.export_refusal = f"ONNX export failed: {_first_line(exc)}"
        raise DeviceRejected(memo.export_refusal) from exc
    finally:
        ctx.timings["export"] = time.perf_counter() - t
    if exported.exporter == "torch.onnx":
        # torch.onnx lowers some ops unfaithfully without an error: verify its model on the CPU EP first.
        from qnnx_backend._faithful import check_on_cpu

        t = time.perf_counter()
        problem = check_on_cpu(exported, ctx.gm, ctx.args, export_args)
        ctx.timings["verify_export"] = time.perf_counter() - t
        if problem is not None:
            memo.export_refusal = (
                "torch.onnx's ONNX model of this graph did not pass the check against PyTorch on ONNX Runtime's CPU "
                f"EP, before any QNN ({problem}); it is not compiled"
            )
            raise DeviceRejected(memo.export_refusal)
    return exported


def check_ops(model: CompilableModel, device: str, soc: int, ctx: CompileContext) -> CpuPlan:
    """opcheck's verdicts for ``device``, turned into the graph's CPU-EP part (empty: wholly on QNN).

    Raises DeviceRejected when the graph cannot be placed: a refused node under whole-graph placement, or, with
    ``partition="auto"``, a split that would leave half of the nodes or more on the CPU.
    """
    opts = ctx.options
    t = time.perf_counter()
    report = _session.opcheck(model.structure, device, soc)
    ctx.timings[f"opcheck_{device}"] = time.perf_counter() - t
    mode = opts.resolved_partition
    if mode == "whole":
        if report.supported:
            return CpuPlan()
        nodes = ", ".join(f"{v.op_type} ({v.node_name}): {v.reason}" for v in report.unsupported)
        err = DeviceRejected(
            f"{len(report.unsupported)} ONNX node(s) not supported by QNN {OPCHECK_BACKEND[device]}: {nodes}"
        )
        try:
            report.raise_for_unsupported()
        except Exception as exc:
            raise err from exc
        raise err
    plan = plan_cpu_nodes(model.structure, report)
    if plan and mode == "auto" and not plan.keeps_majority():
        raise DeviceRejected(_minority(plan.on_qnn, plan.on_cpu, plan))
    if plan:
        logger.info("qnn backend: partition=%r: %s", opts.partition, plan.describe())
    return plan


def _minority(on_qnn: int, on_cpu: int, plan: CpuPlan) -> str:
    return (
        f"QNN would keep only {on_qnn} of {on_qnn + on_cpu} ONNX nodes once the nodes qnnx-opcheck does not vouch "
        f"for are pinned to ONNX Runtime's CPU EP (by op type); with half or less on QNN the graph runs in "
        f"PyTorch, or pass partition='mixed' to split it anyway. {plan.describe()}"
    )


def with_plan(kwargs: Mapping[str, Any], plan: CpuPlan) -> dict[str, Any]:
    """Session arguments that pin ``plan`` to the CPU EP (create_for_device reads the two private keys; without
    them a split session plans itself again from opcheck)."""
    fallback = bool(plan) or bool(kwargs.get("allow_cpu_fallback"))
    return {**kwargs, "allow_cpu_fallback": fallback, "cpu_op_types": plan.op_types, "cpu_nodes": tuple(plan.nodes)}


def check_share(session: Any, plan: CpuPlan, opts: BackendOptions) -> None:
    """partition='auto': ORT's real placement must leave QNN more than half of the nodes too (the QNN EP may
    decline more than opcheck predicted)."""
    if not plan or opts.resolved_partition != "auto":
        return
    import qnnx_detection

    counts = placement_counts(session)
    on_qnn = counts.get(qnnx_detection.EP_NAME, 0)
    on_cpu = sum(counts.values()) - on_qnn
    if on_qnn <= on_cpu:
        raise DeviceRejected(_minority(on_qnn, on_cpu, plan).replace("would keep", "kept", 1))


def _timed_session(model: StagedModel | str, device: str, kwargs: Mapping[str, Any], ctx: CompileContext) -> Any:
    import qnnx_detection

    t = time.perf_counter()
    try:
        return _session.create_for_device(model, device, kwargs)
    except qnnx_detection.errors.SessionCreationError as exc:
        raise DeviceRejected(exc.cause) from exc
    finally:
        ctx.timings[f"session_{device}"] = time.perf_counter() - t


@attrs.frozen
class _DeviceSetup:
    """What the compile for one device adds to the context: the target, the QNN provider options and the session
    arguments."""

    target: Target
    provider_options: Mapping[str, str]
    session_kwargs: Mapping[str, Any]
    out_dtypes: tuple[torch.dtype | None, ...]


def _setup(ctx: CompileContext, device: str) -> _DeviceSetup:
    import qnnx_detection

    opts = ctx.options
    soc = opts.soc_model if opts.soc_model is not None else qnnx_detection.resolve_soc_model(None)
    status = qnnx_detection.probe(initialize=False).backend(device)
    extra = dict(opts.provider_options)
    if opts.fp16 and device == "npu":
        extra["enable_htp_fp16_precision"] = "1"
    return _DeviceSetup(
        target=Target(
            device=device,
            soc_model=soc,
            is_simulator=bool(status.is_simulator),
            param_indices=ctx.analysis.param_indices,
        ),
        provider_options=extra,
        session_kwargs={
            "soc_model": soc,
            "provider_options": extra,
            "allow_cpu_fallback": opts.resolved_partition == "mixed",
        },
        out_dtypes=output_dtypes(ctx.gm),
    )


FP16_MAX = 65504.0
"""The largest float16; HTP computes float graphs in float16 and saturates beyond it (no infinities)."""


def fp16_range_refusal(ctx: CompileContext) -> str | None:
    """Why HTP's float16 cannot hold the graph's result on the example inputs, or None.

    HTP computes a float graph in float16 and saturates silently at +-65504: an output that eager PyTorch computes
    beyond that (or as an infinity) would come back as a wrong finite number. The graph runs once in eager
    PyTorch on the example inputs to see (once per graph; under no_grad). Later inputs are not checked (the
    ``verify`` option compares a first call with eager). Graphs that write into their arguments are not run here,
    since the run would apply the writes.
    """
    memo = ctx.memo
    if memo.range_checked:
        return memo.range_refusal
    memo.range_checked = True
    if ctx.analysis.mutated_indices:
        return None
    t = time.perf_counter()
    with torch.no_grad():
        outputs = ctx.gm(*ctx.args)
    leaves = torch.utils._pytree.tree_leaves(outputs)
    for k, value in enumerate(leaves):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        beyond = value.detach().abs().nan_to_num(nan=0.0) > FP16_MAX
        if bool(beyond.any()):
            worst = float(value.detach().abs().nan_to_num(nan=0.0).max())
            memo.range_refusal = (
                f"output {k} reaches {worst:.4g} on the example inputs, beyond float16's +-65504, where HTP (which "
                "computes float graphs in float16) would saturate it to a wrong finite value"
            )
            break
    ctx.timings["range_check"] = time.perf_counter() - t
    return memo.range_refusal


def build_program(ctx: CompileContext, device: str) -> Program:
    """Compile the graph for ``device`` (or load its compiled context); raises DeviceRejected with the cause."""
    if device == "npu" and ctx.calibration is None:
        refusal = fp16_range_refusal(ctx)
        if refusal is not None:
            raise DeviceRejected(refusal)
    setup = _setup(ctx, device)
    if ctx.options.cache:
        return _build_cached(ctx, setup)
    model = export_once(ctx)
    if model.signature.num_onnx_outputs == 0:
        return NoSessionProgram(model.signature, setup.target)
    plan = check_ops(model, device, setup.target.soc_model, ctx)
    staged = StagedModel(model)  # recreate() reads it again: it lives as long as the program
    kwargs = with_plan(setup.session_kwargs, plan)
    session = _timed_session(staged, device, kwargs, ctx)
    check_share(session, plan, ctx.options)
    return QnnProgram(
        session=session,
        signature=model.signature,
        target=setup.target,
        source=SessionSource(staged, kwargs),
        cache="off",
        onnx_nodes=len(model.structure.graph.node),
        passes_applied=model.passes_applied,
        out_dtypes=setup.out_dtypes,
        fp16=ctx.options.fp16,
        cpu_nodes=dict(plan.nodes),
    )


class _NothingToCompile(Exception):
    def __init__(self, signature: GraphSignature) -> None:
        super().__init__("the graph has no ONNX outputs")
        self.signature = signature


_store_lock = threading.Lock()


def _build_cached(ctx: CompileContext, setup: _DeviceSetup) -> Program:
    """The cached path: one call of the store's ``load_or_rebuild``, so every load of an entry is pinned against a
    concurrent prune and marked, and an entry whose load fails (or crashed a process) is quarantined and rebuilt."""
    import qnnx_ctxcache
    import qnnx_detection
    import qnnx_export

    opts, timings, target = ctx.options, ctx.timings, setup.target
    device = target.device
    t = time.perf_counter()
    if ctx.memo.fingerprint is None:
        # fp16 is part of the key material below, so the fingerprint can hash the caller's weights as they are.
        ctx.memo.fingerprint = qnnx_export.fingerprint(ctx.gm, ctx.args, ctx.analysis)
    timings["fingerprint"] = time.perf_counter() - t
    with _store_lock:
        store = _session.store(str(opts.cache_dir) if opts.cache_dir is not None else None, opts.cache_max_bytes)
    key = qnnx_ctxcache.make_key(
        model_digest=ctx.memo.fingerprint,
        ep_name=qnnx_detection.EP_NAME,
        ep_options={"device": device, "soc_model": str(target.soc_model), **setup.provider_options},
        # A quantized graph also depends on the quantization settings and the calibration data.
        session_config={
            **opts.cache_material(),
            **(ctx.calibration.cache_material() if ctx.calibration is not None else {}),
        },
        versions=_session.versions(),
        target={"device": device, "soc_model": target.soc_model},
    )
    built: dict[str, Any] = {}  # what a build in this call made: its live session and the model it compiled

    def build(staging: Path) -> qnnx_ctxcache.BuildResult:
        model = export_once(ctx)
        if model.signature.num_onnx_outputs == 0:
            raise _NothingToCompile(model.signature)
        plan = check_ops(model, device, target.soc_model, ctx)
        staged = StagedModel(model)
        kwargs = with_plan(setup.session_kwargs, plan)
        session = _timed_session(staged, device, {**kwargs, "session_config": _session.context_config(staging)}, ctx)
        staged.keep_for(session)
        check_share(session, plan, opts)
        built["session"], built["staged"] = session, staged
        return qnnx_ctxcache.BuildResult(
            model_file=_session.CTX_FILE,
            metadata={
                "signature": model.signature.to_dict(),
                "onnx_nodes": len(model.structure.graph.node),
                "passes_applied": list(model.passes_applied),
                # The nodes compiled onto the CPU EP, with opcheck's reason (the report of a later hit shows them).
                "cpu_nodes": dict(plan.nodes),
            },
        )

    def load(entry: qnnx_ctxcache.Entry) -> QnnProgram:
        # A fresh build hands back the session it created while compiling (no second load of the same context);
        # a hit creates its session from the entry. The store pins and marks the entry while this runs.
        # The store's own time (lookup, checks, publish), without the build's export, opcheck and compile.
        building = ("export", "verify_export", f"opcheck_{device}", f"session_{device}") if not entry.hit else ()
        timings["cache_lookup"] = max(0.0, time.perf_counter() - t - sum(timings.get(k, 0.0) for k in building))
        session = built.pop("session", None) if not entry.hit else None
        cpu_nodes = dict(entry.metadata.get("cpu_nodes") or {})
        # A split context holds plain nodes for the CPU EP beside its EPContext nodes: load it with the fallback
        # on (create_for_device keeps those nodes off QNN).
        kwargs = {**setup.session_kwargs, "allow_cpu_fallback": True} if cpu_nodes else setup.session_kwargs
        if session is None:
            started = time.perf_counter()
            session = _session.create_for_device(str(entry.model_path), device, kwargs)
            timings[f"session_{device}"] = time.perf_counter() - started
        return QnnProgram(
            session=session,
            signature=qnnx_export.GraphSignature.from_dict(entry.metadata["signature"]),
            target=target,
            source=SessionSource(str(entry.model_path), kwargs),
            cache="hit" if entry.hit else "miss",
            onnx_nodes=entry.metadata.get("onnx_nodes"),
            passes_applied=tuple(entry.metadata.get("passes_applied", ())),
            out_dtypes=setup.out_dtypes,
            fp16=opts.fp16,
            cpu_nodes=cpu_nodes,
            source_model=built.get("staged"),  # the ONNX model it was compiled from (none on a hit)
        )

    t = time.perf_counter()
    try:
        _entry, program = store.load_or_rebuild(key, build, load)
    except _NothingToCompile as nothing:
        return NoSessionProgram(nothing.signature, target)
    except qnnx_detection.errors.SessionCreationError as exc:  # the context did not load, even rebuilt once
        raise DeviceRejected(exc.cause) from exc
    program_: Program = program
    return program_
