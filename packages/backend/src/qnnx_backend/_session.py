"""Export, check, compile (or load from the context cache) and run one static graph on a QNN device (private)."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qnnx_backend._options import OPCHECK_BACKEND, BackendOptions
from qnnx_backend._split import NO_OPS, CpuPlan, context_cpu_types, misplaced, plan_cpu_nodes, write_affinity

logger = logging.getLogger(__name__)

CTX_FILE = "model_ctx.onnx"
# ORT type strings of session inputs -> numpy dtypes, for the few casts the call path may need.
_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class DeviceRejected(Exception):
    """A device cannot take the graph; ``cause`` says why in one sentence (internal to the backend)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class StagedModel:
    """An exported model written where ONNX Runtime reads it: ``model.onnx`` beside ``model.onnx.data``, which holds
    every initializer above 1 KiB.

    ORT memory-maps external data instead of parsing a copy of the weights, and no serialized copy of the model is
    held in memory: for a 96 MiB-weight MLP, session creation peaks about 100 MiB lower than from the model's bytes
    (whose copy the ``InferenceSession`` object also keeps for its whole life; onnxruntime 1.24). Pass it wherever a
    model path is accepted (``os.PathLike``). The temporary folder is removed when this object is garbage; a session
    created from it keeps its own mapping of the data (see :meth:`keep_for`).
    """

    def __init__(self, exported: Any) -> None:
        import shutil
        import tempfile
        import weakref

        folder = tempfile.mkdtemp(prefix="qnnx-model-")
        self._remove = weakref.finalize(self, shutil.rmtree, folder, True)
        self.path = Path(folder) / "model.onnx"
        try:
            # Streams each initializer from the frozen tensors to disk: no copy of the weights in memory.
            exported.save(self.path, external_data=True)
        except OSError as exc:
            self._remove()
            raise DeviceRejected(
                f"could not write the ONNX model for ONNX Runtime to {folder} ({exc}); free space there or point "
                f"TMPDIR to a folder with room for the model's weights"
            ) from exc

    def __fspath__(self) -> str:
        return str(self.path)

    def keep_for(self, session: object) -> None:
        """Keep the files until ``session`` is garbage (Windows cannot delete a file that is still mapped)."""
        import weakref

        weakref.finalize(session, self._delete)  # the bound method keeps this object, hence the folder, alive

    def _delete(self) -> None:
        self._remove()


class _NothingToCompile(Exception):
    def __init__(self, exported: Any) -> None:
        super().__init__("the graph has no ONNX outputs")
        self.exported = exported


class _NoSessionProgram:
    """A graph whose outputs are all inputs, constants or None: nothing to run on QNN."""

    def __init__(self, signature: Any, common: Mapping[str, Any]) -> None:
        self.signature = signature
        self.session = None
        self.cache = "bypass"
        self.onnx_nodes = 0
        self.passes_applied = ()
        self.placement: dict[str, int] = {}
        self.param_indices: tuple[int, ...]  # set with the others just below
        for key in ("param_indices", "device", "soc_model", "is_simulator"):
            setattr(self, key, common[key])
        self.param_indices = tuple(self.param_indices)

    def run(self, args: Sequence[object]) -> Any:
        return self.signature.assemble([], args)

    def recreate(self) -> _NoSessionProgram:
        return self


# One ONNX input fed as it is: (ORT input name, argument index, torch dtype, shape).
_DirectInput = tuple[str, int, torch.dtype, torch.Size]


def _direct_inputs(
    signature: Any, names: Sequence[str], numpy_types: Sequence[type | None]
) -> tuple[_DirectInput, ...] | None:
    """What each argument must be for the call to hand it to ORT without a cast or copy (the usual case), or None
    when some input always needs a conversion (int64 fed as int32, a dtype numpy lacks)."""
    if len(names) != len(signature.inputs):
        return None
    plan: list[_DirectInput] = []
    for name, want, spec in zip(names, numpy_types, signature.inputs):
        if spec.onnx_dtype != spec.dtype or want is None:
            return None
        dtype = getattr(torch, spec.dtype, None)
        if not isinstance(dtype, torch.dtype):
            return None
        try:
            same = torch.empty(0, dtype=dtype).numpy().dtype == want
        except TypeError:  # bfloat16 and friends have no numpy dtype
            return None
        if not same:
            return None
        plan.append((name, spec.arg_index, dtype, torch.Size(spec.shape)))
    return tuple(plan)


def _direct_feed(plan: Sequence[_DirectInput], args: Sequence[object]) -> dict[str, Any] | None:
    """ORT's feed when every argument matches ``plan`` exactly (numpy views, no copy); None sends the call down the
    general path, which converts or names the mismatch."""
    feed = {}
    for name, index, dtype, shape in plan:
        t = args[index]
        if not (
            isinstance(t, torch.Tensor)
            and t.dtype is dtype
            and t.shape == shape
            and not t.requires_grad
            and t.is_cpu
            and t.layout is torch.strided
            and t.is_contiguous()
        ):
            return None
        feed[name] = t.numpy()
    return feed


def _direct_outputs(signature: Any, out_dtypes: Sequence[torch.dtype | None]) -> tuple[tuple[int, ...], str] | None:
    """(ONNX output index of each result, container) when the result is just the session's outputs: no argument or
    constant among them, no dtype to restore. None: assemble through the signature."""
    slots = signature.outputs
    if not slots or any(slot.kind != "onnx" for slot in slots):
        return None
    for k, slot in enumerate(slots):
        if slot.dtype != signature.onnx_output_dtypes[slot.index]:
            return None
        want = out_dtypes[k] if k < len(out_dtypes) else None
        if want is not None and str(want).removeprefix("torch.") != slot.dtype:
            return None
    return tuple(slot.index for slot in slots), signature.output_container


def _first_line(exc: BaseException, limit: int = 400) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def output_dtypes(gm: torch.fx.GraphModule) -> tuple[torch.dtype | None, ...]:
    """The dtype of each element of the graph's output tuple, as eager PyTorch would return it."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], tuple | list) else (out.args[0],)
    dtypes: list[torch.dtype | None] = []
    for v in values:
        ex = v.meta.get("example_value", v.meta.get("val")) if isinstance(v, torch.fx.Node) else None
        dtypes.append(ex.dtype if isinstance(ex, torch.Tensor) else None)
    return tuple(dtypes)


class QnnProgram:
    """An ORT session on a QNN device plus what is needed to call it with Dynamo's arguments."""

    source_model: StagedModel | None = None
    cpu_nodes: Mapping[str, str] = {}
    """The nodes pinned to ONNX Runtime's CPU EP, with qnnx-opcheck's reason (empty: the graph is wholly on QNN)."""
    """The ONNX model the session was compiled from, when this process exported it (saving a compiled function
    stores it); None on a context-cache hit."""

    def __init__(
        self,
        *,
        session: Any,
        signature: Any,
        param_indices: Sequence[int],
        device: str,
        soc_model: int,
        is_simulator: bool,
        cache: str,
        onnx_nodes: int | None,
        passes_applied: Sequence[str],
        out_dtypes: Sequence[torch.dtype | None],
        recreate_from: tuple[Any, Mapping[str, Any]],
        fp16: bool = False,
    ) -> None:
        self.session = session
        self.signature = signature
        self.param_indices = tuple(param_indices)
        self.device = device
        self.soc_model = soc_model
        self.is_simulator = is_simulator
        self.cache = cache
        self.onnx_nodes = onnx_nodes
        self.passes_applied = tuple(passes_applied)
        self._out_dtypes = tuple(out_dtypes)
        self._recreate_from = recreate_from
        self._input_names = [i.name for i in session.get_inputs()]
        self._input_types = [_ORT_TO_NUMPY.get(i.type) for i in session.get_inputs()]
        self._output_names = [o.name for o in session.get_outputs()]
        self.placement = placement_counts(session)
        # fp16=True: the graph was exported with float16 inputs; cast the caller's float inputs at the boundary.
        self._to_half = tuple(spec.arg_index for spec in signature.inputs if spec.dtype == "float16") if fp16 else ()
        self._direct_in = _direct_inputs(signature, self._input_names, self._input_types)
        self._direct_out = None if fp16 else _direct_outputs(signature, self._out_dtypes)
        self._writebacks = tuple(signature.writebacks)
        self._row_writebacks = tuple(signature.row_writebacks)
        if signature.writes:  # the general call path, then the writes: never the shortcuts below
            self._direct_in = None

    def run(self, args: Sequence[object]) -> Any:
        """Run on QNN; torch tensors in, torch tensors out, in the graph's output structure."""
        feed = _direct_feed(self._direct_in, args) if self._direct_in is not None else None
        if feed is None:
            return self._run_converting(args)
        outs = self.session.run(self._output_names, feed)
        if self._direct_out is None:
            result = self.signature.assemble([torch.from_numpy(o) for o in outs], args)
            return self._restore_dtypes(result)
        order, container = self._direct_out
        tensors = list(map(torch.from_numpy, outs))
        if container == "single":
            return tensors[order[0]]
        picked = [tensors[i] for i in order]
        return tuple(picked) if container == "tuple" else picked

    def _run_converting(self, args: Sequence[object]) -> Any:
        """The general call: casts, copies of non-contiguous inputs, and errors that name a mismatched argument."""
        callers = args  # the caller's own tensors: writes go there, not into converted copies
        if self._to_half:
            args = list(args)
            for i in self._to_half:
                if isinstance(args[i], torch.Tensor) and args[i].dtype != torch.float16:
                    args[i] = args[i].detach().half()
        feed = {}
        for name, want, tensor in zip(self._input_names, self._input_types, self.signature.onnx_inputs(args)):
            array = tensor.detach().numpy()  # shares memory with the contiguous CPU tensor: no copy
            if want is not None and array.dtype != want:
                array = array.astype(want)
            feed[name] = array
        outs = self.session.run(self._output_names, feed)
        # The graph wrote inputs or buffers in place: the caller's tensors end as eager leaves them. Written before
        # the outputs are assembled, since an output may be that same argument; rows first, since their positions
        # may be an argument that a whole-tensor write then updates.
        for row in self._row_writebacks:
            target = callers[row.arg_index]
            assert isinstance(target, torch.Tensor)
            row.apply(target, outs, callers)
        for out_index, arg_index in self._writebacks:
            # copy_ casts back, e.g. an int64 counter that ran as int32.
            target = callers[arg_index]
            assert isinstance(target, torch.Tensor)
            target.copy_(torch.from_numpy(outs[out_index]))
        result = self.signature.assemble([torch.from_numpy(o) for o in outs], args)
        return self._restore_dtypes(result)

    def _restore_dtypes(self, result: Any) -> Any:
        if not isinstance(result, tuple | list):
            return result
        fixed = [
            r.to(d) if isinstance(r, torch.Tensor) and d is not None and r.dtype != d else r
            for r, d in zip(result, self._out_dtypes)
        ]
        return type(result)(fixed) if isinstance(result, tuple) else fixed

    def recreate(self) -> QnnProgram:
        """A new session from the same model (after a run-time failure of the EP)."""
        model, kwargs = self._recreate_from
        session = create_for_device(model, self.device, kwargs)  # the same split, pinned again
        clone = object.__new__(QnnProgram)
        clone.__dict__.update(self.__dict__)
        clone.session = session
        clone.placement = placement_counts(session)
        return clone


def recreate_and_run(program: Any, args: Sequence[object], label: str, exc: Exception) -> tuple[Any, Any]:
    """After a run-time failure of the EP (e.g. an NPU subsystem restart): one new session and one more run.

    Returns (the new program, its outputs); raises whatever the second attempt raises.
    """
    logger.warning("qnn backend: %s failed at run time (%s); recreating the session once", label, exc)
    fresh = program.recreate()
    return fresh, fresh.run(args)


@functools.cache
def _store(root: str | None, max_bytes: int | None) -> Any:
    import qnnx_ctxcache

    if max_bytes is None:
        return qnnx_ctxcache.ContextStore(root)
    return qnnx_ctxcache.ContextStore(root, options=qnnx_ctxcache.StoreOptions(max_size_bytes=max_bytes))


_store_lock = threading.Lock()


def runtime_versions() -> dict[str, str]:
    """The versions of the runtime that compiles and loads QNN contexts, as loaded in this process."""
    import qnnx_detection

    v = qnnx_detection.probe(initialize=False).versions
    return {"onnxruntime": str(v.onnxruntime), "onnxruntime-qnn": str(v.onnxruntime_qnn), "qairt": str(v.qairt)}


@functools.cache
def _opcheck_version() -> str:
    """qnnx-opcheck's version, read from its distribution's metadata: a cache hit then imports neither qnnx-opcheck
    nor onnx (about 50 ms of a warm first call); the module's own when it is not installed as a distribution."""
    import importlib.metadata

    try:
        return importlib.metadata.version("qnnx-opcheck")
    except importlib.metadata.PackageNotFoundError:
        import qnnx_opcheck

        return str(qnnx_opcheck.__version__)


def _versions() -> dict[str, str]:
    import qnnx_export
    from qnnx_backend._version import __version__

    return {
        **runtime_versions(),
        "torch": torch.__version__,
        "qnnx-export": qnnx_export.__version__,
        # A cached context skips opcheck: a table that now refuses a node must not be bypassed by an old entry.
        "qnnx-opcheck": _opcheck_version(),
        "qnnx-backend": __version__,
    }


def _export_args(args: Sequence[object], fp16: bool) -> list[object]:
    if not fp16:
        return list(args)
    return [
        a.detach().half() if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float16 else a
        for a in args
    ]


def _exported(
    gm: torch.fx.GraphModule,
    args: Sequence[object],
    opts: BackendOptions,
    analysis: Any,
    shared: dict[str, Any],
    timings: dict[str, float],
) -> Any:
    """Export once per chain (the result does not depend on the device); remember a failure too."""
    import qnnx_export

    if "exported" not in shared:
        t = time.perf_counter()
        try:
            passes = None
            if opts.disable_passes:
                default = qnnx_export.ExportOptions().resolved_passes()
                passes = tuple(p for p in default if p not in opts.disable_passes)
            export_options = qnnx_export.ExportOptions(
                passes=passes, exporter=opts.exporter, lift_mutations=bool(analysis.mutated_indices)
            )
            export_args = _export_args(args, opts.fp16)
            shared["exported"] = qnnx_export.export(gm, export_args, options=export_options, analysis=analysis)
        except Exception as exc:
            shared["exported"] = DeviceRejected(f"ONNX export failed: {_first_line(exc)}")
            shared["exported"].__cause__ = exc
        timings["export"] = time.perf_counter() - t
        exported = shared["exported"]
        if not isinstance(exported, DeviceRejected) and exported.exporter == "torch.onnx":
            # torch.onnx lowers some ops unfaithfully without an error: verify its model on the CPU EP first.
            from qnnx_backend._faithful import check_on_cpu

            t = time.perf_counter()
            problem = check_on_cpu(exported, gm, args, export_args)
            timings["verify_export"] = time.perf_counter() - t
            if problem is not None:
                shared["exported"] = DeviceRejected(
                    "torch.onnx's ONNX model of this graph did not pass the check against PyTorch on ONNX "
                    f"Runtime's CPU EP, before any QNN ({problem}); it is not compiled"
                )
    result = shared["exported"]
    if isinstance(result, DeviceRejected):
        raise result
    if "calibration" in shared:  # quantize=...: the QDQ model of the float export (raises _quantize.QuantizeFailed)
        from qnnx_backend._quantize import quantized_model

        return quantized_model(result, args, shared, timings)
    return result


def _check_ops(exported: Any, device: str, soc: int, opts: BackendOptions, timings: dict[str, float]) -> CpuPlan:
    """opcheck's verdicts for ``device``, turned into the graph's CPU-EP part (empty: wholly on QNN).

    Raises DeviceRejected when the graph cannot be placed: a refused node under whole-graph placement, or, with
    ``partition="auto"``, a split that would leave half of the nodes or more on the CPU.
    """
    t = time.perf_counter()
    report = _opcheck(exported.structure, device, soc)
    timings[f"opcheck_{device}"] = time.perf_counter() - t
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
    plan = plan_cpu_nodes(exported.structure, report)
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


def _with_plan(kwargs: Mapping[str, Any], plan: CpuPlan) -> dict[str, Any]:
    """Session arguments that pin ``plan`` to the CPU EP (create_for_device reads the two private keys; without
    them a split session plans itself again from opcheck)."""
    fallback = bool(plan) or bool(kwargs.get("allow_cpu_fallback"))
    return {**kwargs, "allow_cpu_fallback": fallback, "cpu_op_types": plan.op_types, "cpu_nodes": tuple(plan.nodes)}


def _check_share(session: Any, plan: CpuPlan, opts: BackendOptions) -> None:
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


_MIXED_RETRIES = 4


def create_for_device(model: Any, device: str, kwargs: Mapping[str, Any]) -> Any:
    """A QNN session that records ORT's node placement; with CPU fallback, split as described in _create_mixed.

    Raises qnnx_detection.errors.SessionCreationError with the cause.
    """
    import qnnx_detection

    kwargs = dict(kwargs)
    cpu_types = kwargs.pop("cpu_op_types", None)
    cpu_nodes = tuple(kwargs.pop("cpu_nodes", ()))
    kwargs["session_config"] = {**kwargs.get("session_config", {}), "session.record_ep_graph_assignment_info": "1"}
    if kwargs.get("allow_cpu_fallback"):
        return _create_mixed(model, device, kwargs, cpu_types, cpu_nodes)
    return qnnx_detection.create_session(model, device, **kwargs)


def _create(model: Any, device: str, kwargs: Mapping[str, Any], timings: dict[str, float]) -> Any:
    import qnnx_detection

    t = time.perf_counter()
    try:
        return create_for_device(model, device, kwargs)
    except qnnx_detection.errors.SessionCreationError as exc:
        raise DeviceRejected(exc.cause) from exc
    finally:
        timings[f"session_{device}"] = time.perf_counter() - t


def _create_mixed(
    model: Any, device: str, kwargs: dict[str, Any], cpu_types: Sequence[str] | None, cpu_nodes: Sequence[str]
) -> Any:
    """A session split between QNN and ORT's CPU EP (see _split): the op types of the nodes qnnx-opcheck does not
    vouch for are pinned to the CPU with the EP's op_affinity file, so the QNN EP's own capability check never
    decides for them; nodes QNN declines by itself also run on the CPU. A compiled context keeps its plain nodes
    on the CPU. A failure at QNN graph finalize is not rescued by ORT's fallback (onnxruntime-qnn 2.7.0), so the
    session is built again with half of the remaining op types pinned as well (at most 4 retries). The placement
    ORT records is then checked: a node meant for the CPU found on QNN, or fused away before placement, fails the
    session."""
    import onnx

    import qnnx_detection

    proto = (
        onnx.load_from_string(model)
        if isinstance(model, bytes)
        else onnx.load(os.fspath(model), load_external_data=False)
    )
    context_types = context_cpu_types(proto)
    if context_types is not None:
        cpu_types = context_types
    elif cpu_types is None:  # a model no compile planned here (a saved graph rebuilt): plan it now
        plan = plan_cpu_nodes(proto, _opcheck(proto, device, int(kwargs["soc_model"])))
        cpu_types, cpu_nodes = plan.op_types, tuple(plan.nodes)
    excluded = list(cpu_types)
    candidates = sorted({n.op_type for n in proto.graph.node if n.domain in ("", "ai.onnx")} - set(excluded))
    for attempt in range(_MIXED_RETRIES + 1):
        extra = dict(kwargs.get("provider_options") or {})
        path = write_affinity(excluded) if excluded else None
        if path is not None:
            extra["op_affinity"] = path
        try:
            session = qnnx_detection.create_session(model, device, **{**kwargs, "provider_options": extra})
            break
        except qnnx_detection.errors.SessionCreationError:
            if attempt == _MIXED_RETRIES or not candidates:
                raise
            half = candidates[: max(1, len(candidates) // 2)]
            candidates = candidates[len(half) :]
            excluded.extend(half)
            logger.info("qnn backend: QNN failed to build the split graph; also pinning %s to the CPU EP", half)
        finally:
            if path is not None:
                os.unlink(path)
    placement = qnnx_detection.node_placement(session) or {}
    if context_types is not None:
        contexts = {n.name for n in proto.graph.node if n.op_type == "EPContext"}
        stray = [n for n in placement.get(qnnx_detection.EP_NAME, ()) if n not in contexts]
        problem = f"QNN took plain node(s) of the compiled context: {', '.join(stray[:8])}" if stray else None
    else:
        no_ops = [n.name for n in proto.graph.node if n.op_type in NO_OPS]
        problem = misplaced(placement, [n for n in cpu_nodes if n], qnnx_detection.EP_NAME, no_ops)
    if problem is not None:
        raise qnnx_detection.errors.SessionCreationError(device, problem)
    return session


def _opcheck(structure: Any, device: str, soc: int) -> Any:
    import qnnx_opcheck

    return qnnx_opcheck.check_model(structure, OPCHECK_BACKEND[device], soc_model=soc)


def placement_counts(session: Any) -> dict[str, int]:
    """How many ONNX nodes each execution provider took (ORT's own assignment record; empty when not recorded)."""
    import qnnx_detection

    return {ep: len(nodes) for ep, nodes in (qnnx_detection.node_placement(session) or {}).items()}


def build_program(
    gm: torch.fx.GraphModule,
    args: Sequence[object],
    device: str,
    opts: BackendOptions,
    analysis: Any,
    shared: dict[str, Any],
    timings: dict[str, float],
) -> QnnProgram:
    """Compile ``gm`` for ``device`` (or load its compiled context); raises DeviceRejected with the cause."""
    import qnnx_detection

    soc = opts.soc_model if opts.soc_model is not None else qnnx_detection.resolve_soc_model(None)
    status = qnnx_detection.probe(initialize=False).backend(device)
    extra = dict(opts.provider_options)
    if opts.fp16 and device == "npu":
        extra["enable_htp_fp16_precision"] = "1"
    session_kwargs: dict[str, Any] = {
        "soc_model": soc,
        "provider_options": extra,
        "allow_cpu_fallback": opts.resolved_partition == "mixed",
    }
    common = {
        "param_indices": analysis.param_indices,
        "device": device,
        "soc_model": soc,
        "is_simulator": bool(status.is_simulator),
        "out_dtypes": output_dtypes(gm),
        "fp16": opts.fp16,
    }

    if not opts.cache:
        exported = _exported(gm, args, opts, analysis, shared, timings)
        if exported.signature.num_onnx_outputs == 0:
            return _NoSessionProgram(exported.signature, common)  # type: ignore[return-value]
        plan = _check_ops(exported, device, soc, opts, timings)
        model = StagedModel(exported)  # recreate() reads it again: it lives as long as the program
        kwargs = _with_plan(session_kwargs, plan)
        session = _create(model, device, kwargs, timings)
        _check_share(session, plan, opts)
        program = QnnProgram(
            session=session,
            signature=exported.signature,
            cache="off",
            onnx_nodes=len(exported.structure.graph.node),
            passes_applied=exported.passes_applied,
            recreate_from=(model, kwargs),
            **common,
        )
        program.cpu_nodes = dict(plan.nodes)
        return program
    return _build_cached(gm, args, device, opts, analysis, shared, timings, soc, extra, session_kwargs, common)


def context_config(directory: Path) -> dict[str, str]:
    """Session config that makes ORT write the compiled context (``model_ctx.onnx`` plus its binary) into
    ``directory`` while it creates the session."""
    return {
        "ep.context_enable": "1",
        "ep.context_file_path": str(directory / CTX_FILE),
        "ep.context_embed_mode": "0",
    }


def _build_cached(gm, args, device, opts, analysis, shared, timings, soc, extra, session_kwargs, common) -> QnnProgram:
    """The cached path: one call of the store's ``load_or_rebuild``, so every load of an entry is pinned against a
    concurrent prune and marked, and an entry whose load fails (or crashed a process) is quarantined and rebuilt."""
    import qnnx_ctxcache
    import qnnx_detection
    import qnnx_export

    t = time.perf_counter()
    if "fingerprint" not in shared:
        # fp16 is part of the key material below, so the fingerprint can hash the caller's weights as they are.
        shared["fingerprint"] = qnnx_export.fingerprint(gm, args, analysis)
    timings["fingerprint"] = time.perf_counter() - t
    with _store_lock:
        store = _store(str(opts.cache_dir) if opts.cache_dir is not None else None, opts.cache_max_bytes)
    key = qnnx_ctxcache.make_key(
        model_digest=shared["fingerprint"],
        ep_name=qnnx_detection.EP_NAME,
        ep_options={"device": device, "soc_model": str(soc), **extra},
        # A quantized graph also depends on the quantization settings and the calibration data.
        session_config={
            **opts.cache_material(),
            **(shared["calibration"].cache_material() if "calibration" in shared else {}),
        },
        versions=_versions(),
        target={"device": device, "soc_model": soc},
    )
    built: dict[str, Any] = {}

    def build(staging: Path) -> Any:
        exported = _exported(gm, args, opts, analysis, shared, timings)
        if exported.signature.num_onnx_outputs == 0:
            raise _NothingToCompile(exported)
        plan = _check_ops(exported, device, soc, opts, timings)
        staged = StagedModel(exported)
        kwargs = _with_plan(session_kwargs, plan)
        session = _create(staged, device, {**kwargs, "session_config": context_config(staging)}, timings)
        staged.keep_for(session)
        _check_share(session, plan, opts)
        built["session"], built["staged"] = session, staged
        return qnnx_ctxcache.BuildResult(
            model_file=CTX_FILE,
            metadata={
                "signature": exported.signature.to_dict(),
                "onnx_nodes": len(exported.structure.graph.node),
                "passes_applied": list(exported.passes_applied),
                # The nodes compiled onto the CPU EP, with opcheck's reason (the report of a later hit shows them).
                "cpu_nodes": dict(plan.nodes),
            },
        )

    def load(entry: Any) -> QnnProgram:
        # A fresh build hands back the session it created while compiling (no second load of the same context);
        # a hit creates its session from the entry. The store pins and marks the entry while this runs.
        # The store's own time (lookup, checks, publish), without the build's export, opcheck and compile.
        building = ("export", "verify_export", f"opcheck_{device}", f"session_{device}") if not entry.hit else ()
        timings["cache_lookup"] = max(0.0, time.perf_counter() - t - sum(timings.get(k, 0.0) for k in building))
        session = built.pop("session", None) if not entry.hit else None
        cpu_nodes = dict(entry.metadata.get("cpu_nodes") or {})
        # A split context holds plain nodes for the CPU EP beside its EPContext nodes: load it with the fallback
        # on (create_for_device keeps those nodes off QNN).
        kwargs = {**session_kwargs, "allow_cpu_fallback": True} if cpu_nodes else session_kwargs
        if session is None:
            started = time.perf_counter()
            session = create_for_device(str(entry.model_path), device, kwargs)
            timings[f"session_{device}"] = time.perf_counter() - started
        program = QnnProgram(
            session=session,
            signature=qnnx_export.GraphSignature.from_dict(entry.metadata["signature"]),
            cache="hit" if entry.hit else "miss",
            onnx_nodes=entry.metadata.get("onnx_nodes"),
            passes_applied=tuple(entry.metadata.get("passes_applied", ())),
            recreate_from=(str(entry.model_path), kwargs),
            **common,
        )
        program.cpu_nodes = cpu_nodes
        program.source_model = built.get("staged")  # the ONNX model it was compiled from (none on a hit)
        return program

    t = time.perf_counter()
    try:
        _entry, program = store.load_or_rebuild(key, build, load)
    except _NothingToCompile as nothing:
        return _NoSessionProgram(nothing.exported.signature, common)  # type: ignore[return-value]
    except qnnx_detection.errors.SessionCreationError as exc:  # the context did not load, even rebuilt once
        raise DeviceRejected(exc.cause) from exc
    return program
