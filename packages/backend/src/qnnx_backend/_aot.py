"""Save a compiled graph for loading in another process without Dynamo, export or opcheck: the saving side
(private; the payload format is :mod:`qnnx_backend._payload`, loading is :mod:`qnnx_backend._aot_load`).

``torch.compile(fn, backend="qnn", fullgraph=True).aot_compile(...)`` asks the backend's callable
(``qnnx_backend._compiled.QnnGraph``, seen as a :class:`SavableGraph`) for its bytes when the function is saved, and hands them back to
:func:`qnnx_backend._aot_load.deserialize` in the loading process. The bytes are a payload of plain data, never
pickled objects:

- a fixed prefix: magic ``QNNXAOT\\0``, format version (uint32), header length (uint64), SHA-256 of the header;
- a JSON header: format, producer versions, the compatibility fingerprint (onnxruntime, onnxruntime-qnn, QAIRT,
  the options that change the compiled context), the saved options, and per static graph its call plan (the
  ``GraphSignature`` dict, output dtypes, fp16, frozen-weight positions, sizes or bucket), its device and SoC, and
  which blobs hold its files;
- the blobs, each listed in the header with its size and SHA-256: the compiled EPContext model and its binary, and
  the frozen ONNX model (with its external data) to rebuild from when the fingerprint does not match.

Weights are frozen into both models: a loaded function ignores the parameter values it is called with.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import torch

from qnnx_backend import _buckets, _scratch, _session
from qnnx_backend._export import CompileContext, analyze, export_once
from qnnx_backend._options import BackendOptions
from qnnx_backend._parts import PartedModel, stage_parts
from qnnx_backend._payload import SAFE_NAME, pack_payload
from qnnx_backend._program import QnnProgram
from qnnx_backend._session import CTX_FILE, DeviceRejected, StagedModel
from qnnx_backend._trace import Examples, recall
from qnnx_backend._variant import PAST_BUDGET, Eager, FrozenWeights, QnnVariant, Specialized
from qnnx_backend._version import __version__
from qnnx_backend.errors import SavedGraphError

logger = logging.getLogger(__name__)


class SavableGraph(Protocol):
    """What saving reads of a compiled graph (:class:`qnnx_backend._compiled.QnnGraph`)."""

    @property
    def options(self) -> BackendOptions: ...
    @property
    def sym_positions(self) -> tuple[int, ...]: ...
    @property
    def sym_dims(self) -> tuple[tuple[int, int], ...]: ...
    @property
    def scalar_positions(self) -> tuple[int, ...]: ...
    @property
    def plan(self) -> _buckets.BucketPlan | str | None: ...
    @property
    def examples(self) -> Examples: ...
    @property
    def variants(self) -> Mapping[tuple[object, ...], Eager | QnnVariant | Specialized]: ...

    def compile_variant(self, key: tuple[object, ...], args: Sequence[object]) -> Any: ...


def _plain(value: object) -> Any:
    """A JSON-able copy of an options value (attrs classes become dicts, paths strings)."""
    if attrs.has(type(value)):
        return {k: _plain(v) for k, v in attrs.asdict(value, recurse=False).items()}  # type: ignore[arg-type]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def serialize(graph: SavableGraph) -> bytes:
    """The payload of ``graph``: every static variant compiled for QNN (compiling the example inputs first when the
    graph was never called).

    Raises:
        SavedGraphError: a variant runs in PyTorch (a saved function has no PyTorch graph), or cannot be saved.
    """
    header, blobs = header_and_blobs(graph)
    data = pack_payload(header, blobs)
    logger.info("qnn backend: saved %d static graph(s), %d bytes", len(header["graph"]["variants"]), len(data))
    return data


def header_and_blobs(graph: SavableGraph, blobs: list[bytes] | None = None) -> tuple[dict[str, Any], list[bytes]]:
    """The header and blobs of :func:`serialize`, before packing (:func:`qnnx_backend.save` adds to the header).

    With ``blobs``, the graph's files are appended to that list (and the header's indices count from its start):
    one file can then hold several graphs' records over one blob table.

    Raises:
        SavedGraphError: a variant runs in PyTorch (a saved function has no PyTorch graph), or cannot be saved.
    """
    if graph.sym_dims:
        raise SavedGraphError(
            "the graph has tensors with dynamic dims that Dynamo passes no size argument for (a frame it met with two "
            "shapes), and a saved function serves sizes by its size arguments: compile with dynamic=False (or "
            "torch.compile(..., dynamic=False)) before saving"
        )
    if graph.scalar_positions:
        raise SavedGraphError(
            f"the graph takes {len(graph.scalar_positions)} Python number(s) that Dynamo passes as tensors (a "
            "module's eps or dropout p, a float argument: Dynamo does not specialize floats under dynamic=True), and "
            "a saved function serves calls by their sizes alone: compile with dynamic=False (torch.compile(..., "
            "dynamic=False)) before saving"
        )
    if not graph.variants:
        args = recall(graph.examples)
        key: tuple[object, ...] = ()
        if graph.sym_positions:
            if not all(type(args[i]) is int for i in graph.sym_positions):
                raise SavedGraphError(
                    "the graph has dynamic sizes and was never called: a saved function holds static QNN graphs "
                    "only; call the compiled function once with each size it must serve, then save it"
                )
            key = tuple(args[i] for i in graph.sym_positions)
        with torch.set_grad_enabled(graph.examples.grad_enabled):
            graph.compile_variant(key, args)
    records: list[dict[str, Any]] = []
    blobs = [] if blobs is None else blobs
    for key, variant in graph.variants.items():
        inner = variant.inner if isinstance(variant, Specialized) else variant
        if isinstance(inner, QnnVariant):
            inner = inner.settled()  # it left its device at run time: save where it went
        if isinstance(inner, Eager):
            if inner.report.reason == PAST_BUDGET:
                logger.info("qnn backend: size %s runs in PyTorch (past max_graphs); it is not saved", list(key))
                continue
            raise SavedGraphError(
                f"graph {inner.report.graph_id} runs in eager PyTorch ({inner.report.reason}), and a saved function "
                "holds only graphs compiled for QNN (no PyTorch graph): fix the cause (compile_reports() lists it; "
                "strict=True raises it at compile time), or save only functions that run wholly on QNN"
            )
        record = _variant_record(graph, inner, blobs)
        record["key"] = list(key)
        record["specialized"] = isinstance(variant, Specialized)
        records.append(record)
    if not records:
        raise SavedGraphError("no static graph of this function is compiled for QNN: nothing to save")
    opts = graph.options
    plan = graph.plan
    header = {
        "producer": {"qnnx-backend": __version__, "torch": torch.__version__},
        "fingerprint": {**_session.runtime_versions(), "options": opts.cache_material()},
        "options": _plain(opts),
        "graph": {
            "sym_positions": list(graph.sym_positions),
            "plan": _plain(plan) if isinstance(plan, _buckets.BucketPlan) else None,
            "variants": records,
        },
    }
    return header, blobs


def _variant_record(graph: SavableGraph, variant: QnnVariant, blobs: list[bytes]) -> dict[str, Any]:
    program = variant.program
    if not variant.frozen.current():
        raise SavedGraphError(
            f"the weights of graph {variant.report.graph_id} were updated in place after it was compiled (an "
            "optimizer step, load_state_dict): call the compiled function once, which compiles the new weights, "
            "then save it"
        )
    rep = variant.report
    if rep.host_outputs:
        raise SavedGraphError(
            f"graph {rep.graph_id} computes its output(s) {', '.join(map(str, rep.host_outputs))} in PyTorch (beyond "
            "float16's range: an attention mask for the next graph), and a saved function holds no PyTorch graph: "
            "save a function whose graphs return no such value (e.g. compile the whole model with fullgraph=True), "
            "or keep compiling it in the process that runs it"
        )
    record: dict[str, Any] = {
        "kind": "qnn" if isinstance(program, QnnProgram) else "none",
        "signature": program.signature.to_dict(),
        "param_indices": list(program.target.param_indices),
        "out_dtypes": [_dtype_name(d) for d in program.out_dtypes] if isinstance(program, QnnProgram) else [],
        "fp16": graph.options.fp16,
        "device": program.target.device,
        "soc_model": program.target.soc_model,
        "onnx_nodes": rep.onnx_nodes,
        "passes_applied": list(rep.passes_applied),
        "input_shapes": [list(s) for s in rep.input_shapes],
        "bucket": None if rep.bucket is None else list(rep.bucket),
        # Whether the loaded graph may clip a float input beyond float16's range to +-65504: only where a clipped
        # call was found equal to eager PyTorch here (the loading process may have no PyTorch graph to check with).
        "clip_inputs": variant.clip_state,
    }
    if not isinstance(program, QnnProgram):
        return record
    source, session_kwargs = program.source.model, program.source.kwargs
    record["session"] = {
        "provider_options": dict(session_kwargs.get("provider_options") or {}),
        "allow_cpu_fallback": bool(session_kwargs.get("allow_cpu_fallback")),
    }
    model = _onnx_model(graph, variant, program)
    parts = _parts_of(model, source, graph.options.max_graph_bytes, program)
    record["model"] = {"model_file": model.path.name, "files": _add_folder(model.path.parent, blobs)}
    ctx_files = [CTX_FILE] if parts is None else [f"part{k}_{CTX_FILE}" for k in range(len(parts.paths))]
    if parts is not None:  # the parts, each its own model file beside the one weight file
        record["model"]["parts"] = parts.metadata([Path(p).name for p in parts.paths])
    context: dict[str, bytes] | None = None
    cached = (
        [source]
        if isinstance(source, str)
        else list(source.paths)
        if isinstance(source, PartedModel) and _is_context(source)
        else []
    )
    if cached:  # contexts the cache holds: their files, if still there
        try:
            context = {name: data for path in cached for name, data in _context_files(Path(path)).items()}
        except OSError as exc:
            logger.info("qnn backend: cached context %s is gone (%s); compiling it again to save it", cached[0], exc)
    if context is None:
        context = _compile_context(model if parts is None else parts, program.target.device, session_kwargs, ctx_files)
    record["context"] = {"model_file": ctx_files[0], "files": _add(context, blobs)}
    if parts is not None:
        record["context"]["parts"] = parts.metadata(ctx_files)
    return record


def _is_context(source: object) -> bool:
    """True for parts loaded from compiled contexts (the cache's), False for staged ONNX parts."""
    return isinstance(source, PartedModel) and all(Path(p).name.endswith(CTX_FILE) for p in source.paths)


def _parts_of(model: StagedModel, source: object, max_bytes: int, program: QnnProgram) -> PartedModel | None:
    """The staged parts of a graph that runs as parts (planned again on ``model`` when it was exported anew to
    save it); None for a graph of one context."""
    if not isinstance(source, PartedModel):
        return None
    if not _is_context(source) and source.keep is model:
        return source
    parts, _line = stage_parts(
        model.path, max_bytes, device=program.target.device, cpu_nodes=tuple(program.cpu_nodes), keep=model
    )
    return parts


def _onnx_model(graph: SavableGraph, variant: QnnVariant, program: QnnProgram) -> Any:
    """The ONNX model ``program`` was compiled from; exported again when it came from the context cache."""
    staged = program.source_model
    source = program.source.model
    if isinstance(source, PartedModel) and isinstance(source.keep, StagedModel):
        source = source.keep  # the staged model its parts were cut from
    if staged is None and isinstance(source, StagedModel):
        staged = source
    if staged is not None:
        return staged
    opts = graph.options
    if opts.quantize is not None:
        raise SavedGraphError(
            f"graph {variant.report.graph_id} was loaded from the context cache and is quantized: its ONNX model "
            "cannot be rebuilt here without calibration; save it from a process that compiled it (cache=False)"
        )
    logger.info("qnn backend: graph %d came from the context cache; exporting it to save it", variant.report.graph_id)
    gm = variant.gm
    args = _example_args(gm, frozen=variant.frozen, param_indices=program.target.param_indices)
    with torch.set_grad_enabled(graph.examples.grad_enabled):
        analysis = analyze(gm, args, opts)
        try:
            return StagedModel(export_once(CompileContext(gm=gm, args=args, options=opts, analysis=analysis)))
        except DeviceRejected as exc:
            raise SavedGraphError(
                f"graph {variant.report.graph_id} came from the context cache, and exporting it again to save its "
                f"ONNX model failed ({exc.cause}); save it with cache=False"
            ) from exc


def _example_args(gm: torch.fx.GraphModule, *, frozen: FrozenWeights, param_indices: Sequence[int]) -> list[object]:
    """Arguments for exporting ``gm`` again: its frozen weights, and zeros shaped like each other tensor input."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    tensor_params = [i for i in param_indices if isinstance(examples[i], torch.Tensor)]
    weights = dict(zip(tensor_params, frozen.tensors, strict=True))
    args: list[object] = []
    for i, ex in enumerate(examples):
        if i in weights:
            args.append(weights[i])
        elif isinstance(ex, torch.Tensor):
            args.append(torch.zeros(tuple(int(s) for s in ex.shape), dtype=ex.dtype))
        else:
            args.append(ex)
    return args


def _context_files(ctx_model: Path) -> dict[str, bytes]:
    """The compiled context model and every file it references (its context binaries, external data)."""
    import onnx

    proto = onnx.load(str(ctx_model), load_external_data=False)
    names = {ctx_model.name}
    for node in proto.graph.node:
        if node.op_type != "EPContext":
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        # A graph split with the CPU EP has one EPContext node per QNN partition; only the main one names the
        # binary, the others (main_context=0) live inside it (onnxruntime-qnn 2.7.0).
        if attributes.get("embed_mode", 1) == 0 and "ep_cache_context" in attributes:
            value = attributes["ep_cache_context"]
            names.add(value.decode("utf-8") if isinstance(value, bytes) else str(value))
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            names.add({e.key: e.value for e in tensor.external_data}.get("location", ""))
    bad = sorted(n for n in names if not SAFE_NAME.fullmatch(n))
    if bad:
        raise OSError(f"the context references files outside its folder: {bad}")
    return {name: (ctx_model.parent / name).read_bytes() for name in sorted(names)}


def _compile_context(
    model: Any, device: str, session_kwargs: Mapping[str, Any], ctx_files: Sequence[str] = (CTX_FILE,)
) -> dict[str, bytes]:
    """Compile ``model`` for ``device`` once more, writing its context (one per part), and read the files."""
    import qnnx_detection

    folder = _scratch.make_dir("aot-ctx")
    try:
        kwargs = {**session_kwargs, "session_config": _session.context_config(folder)}
        try:
            session = _session.create_for_device(model, device, kwargs)
        except qnnx_detection.errors.SessionCreationError as exc:
            raise SavedGraphError(f"compiling the graph's context for saving failed on {device}: {exc.cause}") from exc
        del session
        return {name: data for ctx in ctx_files for name, data in _context_files(folder / ctx).items()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _add(files: Mapping[str, bytes], blobs: list[bytes]) -> dict[str, int]:
    index = {}
    for name, data in files.items():
        index[name] = len(blobs)
        blobs.append(data)
    return index


def _add_folder(folder: Path, blobs: list[bytes]) -> dict[str, int]:
    return _add({p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}, blobs)
