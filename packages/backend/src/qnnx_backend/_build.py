"""The build stage: one static graph compiled for one QNN device, or its compiled context loaded from the cache
(private).

:func:`build_program` exports once (:mod:`qnnx_backend._export`), checks the operators (:mod:`qnnx_backend._check`)
and creates the session (:mod:`qnnx_backend._session`); :func:`build_quantized` does the same for the QDQ model and
checks it against float eager PyTorch. A device that cannot take the graph raises ``DeviceRejected`` with the cause.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from qnnx_backend import _scratch, _session
from qnnx_backend._calibrate import HOW_TO
from qnnx_backend._check import check_ops, check_share, fp16_range_refusal, minority, with_plan
from qnnx_backend._export import CompileContext, export_once, export_report
from qnnx_backend._parts import PartedModel, held_weight_bytes, stage_parts
from qnnx_backend._program import NoSessionProgram, Program, QnnProgram, SessionSource, Target, output_dtypes
from qnnx_backend._quantize import measure
from qnnx_backend._quantspec import QuantizeFailed
from qnnx_backend._report import ExportReport, QuantizationReport
from qnnx_backend._session import DeviceRejected, StagedModel
from qnnx_backend._split import CpuPlan, with_island
from qnnx_backend.errors import QnnFallbackWarning, QuantizationError

if TYPE_CHECKING:
    from qnnx_export import GraphSignature

logger = logging.getLogger(__name__)


def _timed(ctx: CompileContext, device: str, create: Callable[[Callable[[int, int], None]], Any]) -> Any:
    """Run ``create(on_part)`` (a session, or compiling the parts) as the session stage: timed, a failure of the EP
    raised as DeviceRejected, the part being built shown on the progress line."""
    import qnnx_detection

    def on_part(k: int, parts: int) -> None:  # the progress line reads these two while the session builds
        ctx.timings["building_part"], ctx.timings["parts"] = k + 1, parts

    t = time.perf_counter()
    try:
        return create(on_part)
    except qnnx_detection.errors.SessionCreationError as exc:
        raise DeviceRejected(exc.cause) from exc
    finally:
        ctx.timings.pop("building_part", None)
        ctx.timings.pop("parts", None)
        ctx.timings[f"session_{device}"] = time.perf_counter() - t


def _timed_session(
    model: StagedModel | PartedModel | str, device: str, kwargs: Mapping[str, Any], ctx: CompileContext
) -> Any:
    return _timed(ctx, device, lambda on_part: _session.create_for_device(model, device, kwargs, on_part))


_ISLAND_ROUNDS = 3
_QDQ_TYPES = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""How many finalize failures one graph may narrow: each round pins the op types of one failing run."""


def _session_with_islands(
    staged: StagedModel,
    structure: Any,
    device: str,
    ctx: CompileContext,
    plan: CpuPlan,
    kwargs_for: Callable[[CpuPlan], Mapping[str, Any]],
    provider_options: Mapping[str, Any],
) -> tuple[Any, CpuPlan, Mapping[str, Any]]:
    """The session of ``staged`` with ``plan``; when QNN fails to finalize the graph (and the partition allows a
    split), the smallest failing run of nodes is found by qnnx-opcheck's ``narrow_failure`` (sessions of parts of
    the graph built in child processes), its op types that compute are pinned to the CPU EP beside ``plan``'s and the
    session is built again, up to ``_ISLAND_ROUNDS`` times. Returns the session, the plan it keeps and its kwargs."""
    import qnnx_opcheck

    kwargs = kwargs_for(plan)
    for round_ in range(_ISLAND_ROUNDS + 1):
        try:
            return _timed_session(staged, device, kwargs, ctx), plan, kwargs
        except DeviceRejected as exc:
            mode = ctx.options.resolved_partition
            if "finalize" not in exc.cause or device != "npu":
                raise
            if mode == "whole":
                how = "strict=True keeps" if ctx.options.strict else "partition='whole' keeps"
                raise DeviceRejected(
                    f"{exc.cause}; {how} the graph wholly on QNN, so the failing part is not moved to the CPU EP "
                    "(partition='auto' narrows the failure and runs that part on ONNX Runtime's CPU EP)"
                ) from exc
            if round_ == _ISLAND_ROUNDS:
                raise DeviceRejected(f"{exc.cause}, still after {_ISLAND_ROUNDS} islands on the CPU EP") from exc
            t = time.perf_counter()

            def on_trial(k: int, what: str) -> None:
                ctx.timings["narrow_trial"] = k
                logger.info("qnn backend: narrowing the finalize failure, trial %d: %s", k, what)

            try:
                narrowed = qnnx_opcheck.narrow_failure(
                    staged.path,  # with its weights: a part's session needs them
                    soc_model=int(kwargs["soc_model"]),
                    provider_options=provider_options,
                    cpu_op_types=plan.op_types,
                    error=exc.cause,
                    on_trial=on_trial,
                )
            finally:
                ctx.timings.pop("narrow_trial", None)
                ctx.timings[f"narrow_{device}"] = ctx.timings.get(f"narrow_{device}", 0.0) + time.perf_counter() - t
            # A Q/DQ type is not pinned: the QNN EP moves a QDQ unit with its op, and pinning the type would move
            # every unit of the graph (see _split's unit members).
            pinned = [op for op in narrowed.computing_op_types if op not in plan.op_types and op not in _QDQ_TYPES]
            if not narrowed.found or not pinned:
                raise DeviceRejected(f"{exc.cause}; {narrowed.describe()}") from exc
            plan = with_island(plan, structure, narrowed, pinned)
            logger.info("qnn backend: %s; pinning %s to the CPU EP", narrowed.describe(), ", ".join(pinned))
            if mode == "auto" and not plan.keeps_majority():
                raise DeviceRejected(minority(plan.on_qnn, plan.on_cpu, plan)) from exc
            kwargs = kwargs_for(plan)
    raise AssertionError("unreachable")


def _timed_compile_parts(parts: PartedModel, device: str, kwargs: Mapping[str, Any], ctx: CompileContext) -> Any:
    """Each part compiled in turn into its context, one compiling session alive at a time; ORT's placement."""
    return _timed(ctx, device, lambda on_part: _session.compile_parts(parts, device, kwargs, on_part))


@attrs.frozen
class _DeviceSetup:
    """What the compile for one device adds to the context: the target, the QNN provider options and the session
    arguments."""

    target: Target
    provider_options: Mapping[str, str]
    session_kwargs: Mapping[str, Any]
    out_dtypes: tuple[torch.dtype | None, ...]


def device_setup(ctx: CompileContext, device: str) -> _DeviceSetup:
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


def crashed_compile(ctx: CompileContext, structure: Any, device: str, plan: CpuPlan) -> str | None:
    """Why the compile of ``structure`` with ``plan`` is refused on this machine (a process died compiling it), or
    None: the record :func:`build_program` reads, for ``explain()``."""
    kwargs = with_plan(device_setup(ctx, device).session_kwargs, plan)
    opts = ctx.options
    return _session.compile_crashed(structure, device, kwargs, str(opts.cache_dir) if opts.cache_dir else None)


def build_program(ctx: CompileContext, device: str) -> Program:
    """Compile the graph for ``device`` (or load its compiled context); raises DeviceRejected with the cause."""
    if device == "npu" and ctx.calibration is None:
        refusal = fp16_range_refusal(ctx)
        if refusal is not None:
            raise DeviceRejected(refusal)
    setup = device_setup(ctx, device)
    if ctx.options.cache:
        return _build_cached(ctx, setup)
    model = export_once(ctx)
    if model.signature.num_onnx_outputs == 0:
        return NoSessionProgram(model.signature, setup.target, export_report(ctx, model))
    plan = check_ops(model, device, setup.target.soc_model, ctx)
    staged = StagedModel(model)  # recreate() reads it again: it lives as long as the program
    source: StagedModel | PartedModel | str = _in_parts(staged, ctx, device, plan.nodes)
    kwargs: Mapping[str, Any] = with_plan(setup.session_kwargs, plan)
    written = None  # one context compiled from the ONNX model in memory: nothing on disk
    held = held_weight_bytes(model.structure, device)
    with _session.guarded_compile(model.structure, device, kwargs, None):
        if isinstance(source, PartedModel) or (isinstance(source, StagedModel) and held > RELOAD_ABOVE_BYTES):
            session, source, kwargs = _from_contexts(source, staged, device, kwargs, setup, plan, ctx)
            written = _session.context_bytes(source.paths if isinstance(source, PartedModel) else [source])
        else:
            session, plan, kwargs = _session_with_islands(
                staged,
                model.structure,
                device,
                ctx,
                plan,
                lambda p: with_plan(setup.session_kwargs, p),
                setup.provider_options,
            )
            check_share(session, plan, ctx.options)
    return QnnProgram(
        session=session,
        signature=model.signature,
        target=setup.target,
        source=SessionSource(source, kwargs),
        cache="off",
        onnx_nodes=len(model.structure.graph.node),
        passes_applied=model.passes_applied,
        out_dtypes=setup.out_dtypes,
        fp16=ctx.options.fp16,
        cpu_nodes=dict(plan.nodes),
        weight_bytes=held,
        context_bytes=written,
        export=export_report(ctx, model),
    )


def _from_contexts(
    source: StagedModel | PartedModel,
    staged: StagedModel,
    device: str,
    kwargs: Mapping[str, Any],
    setup: _DeviceSetup,
    plan: Any,
    ctx: CompileContext,
) -> tuple[Any, PartedModel | str, Mapping[str, Any]]:
    """Compile a large graph (or each of its parts) writing its context, then run it from that context.

    A session built from an ONNX model keeps what QNN compiled it from beside the compiled graph: measured on the
    simulator, about twice the weights of a session loaded from the same compiled context. So each compiling
    session is dropped once its context is written (one alive at a time), and the program loads the contexts
    (kept in a folder that lives as long as the staged model)."""
    import shutil
    import weakref

    folder = _scratch.make_dir("contexts")
    weakref.finalize(staged, shutil.rmtree, str(folder), True)
    writing = {**kwargs, "session_config": _session.context_config(folder)}
    compiled: PartedModel | str
    if isinstance(source, PartedModel):
        check_share(_timed_compile_parts(source, device, writing, ctx), plan, ctx.options)
        compiled = attrs.evolve(
            source, paths=tuple(str(folder / f"part{k}_{_session.CTX_FILE}") for k in range(len(source.paths)))
        )
    else:
        check_share(_timed_session(source, device, writing, ctx), plan, ctx.options)  # the session goes here
        compiled = str(folder / _session.CTX_FILE)
        _session.release_memory()  # what it compiled from, before its context is loaded
    load_kwargs = {**setup.session_kwargs, "allow_cpu_fallback": True} if plan.nodes else setup.session_kwargs
    t = time.perf_counter()
    try:
        loaded = _session.create_for_device(compiled, device, load_kwargs)
    except Exception as exc:
        import qnnx_detection

        if isinstance(exc, qnnx_detection.errors.SessionCreationError):
            raise DeviceRejected(exc.cause) from exc
        raise
    ctx.timings[f"load_{device}"] = time.perf_counter() - t
    return loaded, compiled, load_kwargs


def _in_parts(
    staged: StagedModel, ctx: CompileContext, device: str, cpu_nodes: Mapping[str, str]
) -> StagedModel | PartedModel:
    """The staged model, or its parts when its weights exceed ``max_graph_bytes`` (written beside it)."""
    t = time.perf_counter()
    parts, _line = stage_parts(
        staged.path, ctx.options.max_graph_bytes, device=device, cpu_nodes=tuple(cpu_nodes), keep=staged
    )
    ctx.timings["plan_parts"] = time.perf_counter() - t
    return staged if parts is None else parts


class _NothingToCompile(Exception):
    def __init__(self, signature: GraphSignature, export: ExportReport | None) -> None:
        super().__init__("the graph has no ONNX outputs")
        self.signature = signature
        self.export = export


_store_lock = threading.Lock()

# A session built from an ONNX model keeps what QNN compiled it from beside the compiled graph: about twice the
# weights of a session loaded from its written context (measured on the simulator). Above this many weight bytes a
# compile drops its compiling session and loads the context it wrote (into the cache, or a temporary folder); a
# small graph keeps its compiling session (no second load).
RELOAD_ABOVE_BYTES = 64 * 2**20


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
            raise _NothingToCompile(model.signature, export_report(ctx, model))
        plan = check_ops(model, device, target.soc_model, ctx)
        staged = StagedModel(model)
        held = held_weight_bytes(model.structure, device)
        source = _in_parts(staged, ctx, device, plan.nodes)
        kwargs = with_plan(setup.session_kwargs, plan)
        writing = {**kwargs, "session_config": _session.context_config(staging)}
        cache_dir = str(opts.cache_dir) if opts.cache_dir is not None else None
        with _session.guarded_compile(model.structure, device, kwargs, cache_dir):
            if isinstance(source, PartedModel):  # a large graph: one compiling session at a time, loaded below
                check_share(_timed_compile_parts(source, device, writing, ctx), plan, opts)
            else:
                session, plan, _kwargs = _session_with_islands(
                    staged,
                    model.structure,
                    device,
                    ctx,
                    plan,
                    lambda p: {
                        **with_plan(setup.session_kwargs, p),
                        "session_config": _session.context_config(staging),
                    },
                    setup.provider_options,
                )
                staged.keep_for(session)
                check_share(session, plan, opts)
                if held <= RELOAD_ABOVE_BYTES:
                    built["session"] = session
            # else the compiling session goes with this call and load() runs the graph from its written context
        built["staged"] = staged
        metadata = {
            "signature": model.signature.to_dict(),
            "onnx_nodes": len(model.structure.graph.node),
            "passes_applied": list(model.passes_applied),
            # The nodes compiled onto the CPU EP, with opcheck's reason (the report of a later hit shows them).
            "cpu_nodes": dict(plan.nodes),
            "weight_bytes": held,
        }
        exported = export_report(ctx, model)
        if exported is not None:  # how it was exported, for the report of a later hit (which exports nothing)
            metadata["export"] = attrs.asdict(exported)
        files = (
            [f"part{k}_{_session.CTX_FILE}" for k in range(len(source.paths))]
            if isinstance(source, PartedModel)
            else [_session.CTX_FILE]
        )
        # Measured here, where onnx is already imported: a later hit reads it without parsing its contexts.
        metadata["context_bytes"] = _session.context_bytes([staging / f for f in files])
        if isinstance(source, PartedModel):  # one context per part, in the order they run
            metadata["parts"] = source.metadata(files)
        return qnnx_ctxcache.BuildResult(model_file=files[0], metadata=metadata)

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
        parts = entry.metadata.get("parts")
        model: str | PartedModel = (
            str(entry.model_path) if parts is None else PartedModel.from_metadata(entry.model_path.parent, parts)
        )
        if session is None:
            if not entry.hit:  # the compiling session was dropped: its memory goes before the context is loaded
                _session.release_memory()
            started = time.perf_counter()
            session = _session.create_for_device(model, device, kwargs)
            # a fresh build's compile time stays the session time; loading its contexts is timed apart
            timings[f"{'load' if not entry.hit else 'session'}_{device}"] = time.perf_counter() - started
        return QnnProgram(
            session=session,
            signature=qnnx_export.GraphSignature.from_dict(entry.metadata["signature"]),
            target=target,
            source=SessionSource(model, kwargs),
            cache="hit" if entry.hit else "miss",
            onnx_nodes=entry.metadata.get("onnx_nodes"),
            passes_applied=tuple(entry.metadata.get("passes_applied", ())),
            out_dtypes=setup.out_dtypes,
            fp16=opts.fp16,
            cpu_nodes=cpu_nodes,
            source_model=built.get("staged"),  # the ONNX model it was compiled from (none on a hit)
            weight_bytes=entry.metadata.get("weight_bytes"),  # None in entries written before it was recorded
            context_bytes=entry.metadata.get("context_bytes"),  # None in entries written before it was recorded
            export=_export_from(entry.metadata.get("export")),  # None in entries written before it was recorded
        )

    t = time.perf_counter()
    try:
        _entry, program = store.load_or_rebuild(key, build, load)
    except _NothingToCompile as nothing:
        return NoSessionProgram(nothing.signature, target, nothing.export)
    except qnnx_detection.errors.SessionCreationError as exc:  # the context did not load, even rebuilt once
        raise DeviceRejected(exc.cause) from exc
    program_: Program = program
    return program_


def _export_from(recorded: Any) -> ExportReport | None:
    """The export report a cache entry's metadata holds; None when it holds none (or one this version cannot read)."""
    if not isinstance(recorded, Mapping):
        return None
    try:
        return ExportReport(**recorded)
    except TypeError:
        return None


def build_quantized(ctx: CompileContext, device: str, graph_id: int) -> tuple[Program, QuantizationReport]:
    """Compile the quantized graph for ``device`` and check it against eager PyTorch on the calibration inputs;
    a graph that cannot run quantized is compiled in float (raises QuantizationError under strict).

    Raises DeviceRejected (from the float build) when the device cannot take the graph at all.
    """
    calibration = ctx.calibration
    assert calibration is not None, "the quantized build needs the graph's calibration"
    gm, args, opts, timings = ctx.gm, ctx.args, ctx.options, ctx.timings
    spec = calibration.spec
    base: dict[str, Any] = {
        "scheme": spec.label,
        "activation_type": spec.activation_type,
        "weight_type": spec.weight_type,
        "samples": len(calibration.samples),
        "calibration_sha256": calibration.digest,
        "min_sqnr": spec.min_sqnr,
    }
    figures: dict[str, Any] = {}
    if not calibration.samples:
        reason = f"it was not calibrated. {HOW_TO}"
    else:
        try:
            program = build_program(ctx, device)
        except (QuantizeFailed, DeviceRejected) as exc:
            reason = f"the quantized graph was not compiled ({exc})"
        else:
            t = time.perf_counter()
            figures = measure(program, gm, args, calibration, ctx.analysis.mutated_indices)
            timings["quantize_check"] = time.perf_counter() - t
            sqnr = figures.get("sqnr_db")
            weights = getattr(ctx.memo.quantized, "weight_groups", ())
            if spec.min_sqnr is None or sqnr is None or sqnr >= spec.min_sqnr:
                return program, QuantizationReport(used=True, weights=weights, **figures, **base)
            reason = (
                f"its SQNR against float eager PyTorch is {sqnr:.1f} dB (cosine {figures['cosine']:.5f}), below "
                f"min_sqnr={spec.min_sqnr:g} dB"
            )
    if opts.strict:
        fix = (
            "Calibrate first"
            if not calibration.samples
            else "Use a wider scheme ('a16w8', per_channel), keep "
            "sensitive ops in float (keep_float_ops), lower min_sqnr, or pass strict=False to run it in float"
        )
        raise QuantizationError(f"qnn backend: graph {graph_id} cannot run quantized: {reason}. {fix}.")
    warnings.warn(
        f"qnn backend: graph {graph_id} runs in float on {device}: {reason}", QnnFallbackWarning, stacklevel=6
    )
    program = build_program(ctx.in_float(), device)
    attempted = getattr(ctx.memo.quantized, "weight_groups", ())
    return program, QuantizationReport(used=False, reason=reason, weights=attempted, **figures, **base)
