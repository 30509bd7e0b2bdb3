"""Save a compiled graph for loading in another process without Dynamo, export or opcheck: the saving side
(private; the payload format is :mod:`qnnx_backend._payload`, loading is :mod:`qnnx_backend._aot_load`).

``torch.compile(fn, backend="qnn", fullgraph=True).aot_compile(...)`` asks the backend's callable
(:class:`~qnnx_backend._compiled.QnnGraph`) for its bytes when the function is saved, and hands them back to
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
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from qnnx_backend import _buckets
from qnnx_backend._payload import (  # re-exported: the format's names, as before
    _SAFE_NAME,
    pack_payload,
)
from qnnx_backend.errors import SavedGraphError

if TYPE_CHECKING:
    from qnnx_backend._compiled import QnnGraph
    from qnnx_backend._program import QnnProgram

logger = logging.getLogger(__name__)

# -- saving ------------------------------------------------------------------------------------------------------


@attrs.frozen
class Examples:
    """Dynamo's example inputs, tensors held weakly, and the grad mode the graph was traced in (saving a graph that
    was never called compiles it from them, in that mode: Dynamo's guards run it only in that mode)."""

    values: tuple[object, ...]
    grad_enabled: bool


def remember(example_inputs: Sequence[object]) -> Examples:
    """See :class:`Examples`."""
    values = tuple(weakref.ref(a) if isinstance(a, torch.Tensor) else a for a in example_inputs)
    return Examples(values, torch.is_grad_enabled())


def _recall(examples: Examples) -> list[object]:
    values = [e() if isinstance(e, weakref.ref) else e for e in examples.values]
    if any(v is None and isinstance(e, weakref.ref) for v, e in zip(values, examples.values)):
        raise SavedGraphError(
            "the compiled function was never called and its example tensors (the model's weights among them) are "
            "gone, so its graph cannot be compiled for saving; call it once, or save while the model is alive"
        )
    return values


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


def serialize(graph: QnnGraph) -> bytes:
    """The payload of ``graph``: every static variant compiled for QNN (compiling the example inputs first when the
    graph was never called).

    Raises:
        SavedGraphError: a variant runs in PyTorch (a saved function has no PyTorch graph), or cannot be saved.
    """
    header, blobs = header_and_blobs(graph)
    data = pack_payload(header, blobs)
    logger.info("qnn backend: saved %d static graph(s), %d bytes", len(header["graph"]["variants"]), len(data))
    return data


def header_and_blobs(graph: QnnGraph) -> tuple[dict[str, Any], list[bytes]]:
    """The header and blobs of :func:`serialize`, before packing (:func:`qnnx_backend.save` adds to the header).

    Raises:
        SavedGraphError: a variant runs in PyTorch (a saved function has no PyTorch graph), or cannot be saved.
    """
    from qnnx_backend._compiled import _BUDGET, _Eager, _Specialized
    from qnnx_backend._session import runtime_versions
    from qnnx_backend._version import __version__

    if not graph._variants:
        args = _recall(graph._examples)
        key: tuple[object, ...] = ()
        if graph._sym_positions:
            if not all(type(args[i]) is int for i in graph._sym_positions):
                raise SavedGraphError(
                    "the graph has dynamic sizes and was never called: a saved function holds static QNN graphs "
                    "only; call the compiled function once with each size it must serve, then save it"
                )
            key = tuple(args[i] for i in graph._sym_positions)
        with torch.set_grad_enabled(graph._examples.grad_enabled):
            graph._compile_variant(key, args)
    records: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for key, variant in list(graph._variants.items()):
        inner = variant.inner if isinstance(variant, _Specialized) else variant
        while getattr(inner, "_fallback", None) is not None:  # it left its device at run time: save where it went
            inner = getattr(inner, "_fallback")  # noqa: B009 (a union member without the attribute)
        if isinstance(inner, _Eager):
            if inner.report.reason == _BUDGET:
                logger.info("qnn backend: size %s runs in PyTorch (past max_graphs); it is not saved", list(key))
                continue
            raise SavedGraphError(
                f"graph {inner.report.graph_id} runs in eager PyTorch ({inner.report.reason}), and a saved function "
                "holds only graphs compiled for QNN (no PyTorch graph): fix the cause (compile_reports() lists it; "
                "strict=True raises it at compile time), or save only functions that run wholly on QNN"
            )
        record = _variant_record(graph, inner, blobs)
        record["key"] = list(key)
        record["specialized"] = isinstance(variant, _Specialized)
        records.append(record)
    if not records:
        raise SavedGraphError("no static graph of this function is compiled for QNN: nothing to save")
    opts = graph._options
    plan = graph._plan
    header = {
        "producer": {"qnnx-backend": __version__, "torch": torch.__version__},
        "fingerprint": {**runtime_versions(), "options": opts.cache_material()},
        "options": _plain(opts),
        "graph": {
            "sym_positions": list(graph._sym_positions),
            "plan": _plain(plan) if isinstance(plan, _buckets.BucketPlan) else None,
            "variants": records,
        },
    }
    return header, blobs


def _variant_record(graph: QnnGraph, variant: Any, blobs: list[bytes]) -> dict[str, Any]:
    from qnnx_backend._program import QnnProgram

    program = variant._program
    frozen = variant._frozen
    if [t._version for t in frozen._tensors] != frozen._versions:
        raise SavedGraphError(
            f"the weights of graph {variant.report.graph_id} were updated in place after it was compiled (an "
            "optimizer step, load_state_dict): call the compiled function once, which compiles the new weights, "
            "then save it"
        )
    rep = variant.report
    record: dict[str, Any] = {
        "kind": "qnn" if isinstance(program, QnnProgram) else "none",
        "signature": program.signature.to_dict(),
        "param_indices": list(program.target.param_indices),
        "out_dtypes": [_dtype_name(d) for d in program.out_dtypes] if isinstance(program, QnnProgram) else [],
        "fp16": graph._options.fp16,
        "device": program.target.device,
        "soc_model": program.target.soc_model,
        "onnx_nodes": rep.onnx_nodes,
        "passes_applied": list(rep.passes_applied),
        "input_shapes": [list(s) for s in rep.input_shapes],
        "bucket": None if rep.bucket is None else list(rep.bucket),
    }
    if not isinstance(program, QnnProgram):
        return record
    source, session_kwargs = program.source.model, program.source.kwargs
    record["session"] = {
        "provider_options": dict(session_kwargs.get("provider_options") or {}),
        "allow_cpu_fallback": bool(session_kwargs.get("allow_cpu_fallback")),
    }
    model = _onnx_model(graph, variant, program)
    record["model"] = {"model_file": model.path.name, "files": _add_folder(model.path.parent, blobs)}
    context: dict[str, bytes] | None = None
    if isinstance(source, str):  # a context the cache holds: its files, if still there
        try:
            context = _context_files(Path(source))
        except OSError as exc:
            logger.info("qnn backend: cached context %s is gone (%s); compiling it again to save it", source, exc)
    if context is None:
        context = _compile_context(model, program.target.device, session_kwargs)
    record["context"] = {"model_file": _ctx_name(), "files": _add(context, blobs)}
    return record


def _ctx_name() -> str:
    from qnnx_backend._session import CTX_FILE

    return CTX_FILE


def _onnx_model(graph: QnnGraph, variant: Any, program: QnnProgram) -> Any:
    """The ONNX model ``program`` was compiled from; exported again when it came from the context cache."""
    import qnnx_export
    from qnnx_backend._build import CompileContext, export_once
    from qnnx_backend._session import DeviceRejected, StagedModel

    staged = program.source_model
    if staged is None and isinstance(program.source.model, StagedModel):
        staged = program.source.model
    if staged is not None:
        return staged
    opts = graph._options
    if getattr(opts, "quantize", None) is not None:
        raise SavedGraphError(
            f"graph {variant.report.graph_id} was loaded from the context cache and is quantized: its ONNX model "
            "cannot be rebuilt here without calibration; save it from a process that compiled it (cache=False)"
        )
    logger.info("qnn backend: graph %d came from the context cache; exporting it to save it", variant.report.graph_id)
    args = _example_args(variant._gm, frozen=variant._frozen, param_indices=program.target.param_indices)
    with torch.set_grad_enabled(graph._examples.grad_enabled):
        analysis = qnnx_export.analyze(variant._gm, args)
        if opts.exporter != "torch.onnx":
            analysis = qnnx_export.lift_mutations(analysis) or analysis
        try:
            return StagedModel(export_once(CompileContext(gm=variant._gm, args=args, options=opts, analysis=analysis)))
        except DeviceRejected as exc:
            raise SavedGraphError(
                f"graph {variant.report.graph_id} came from the context cache, and exporting it again to save its "
                f"ONNX model failed ({exc.cause}); save it with cache=False"
            ) from exc


def _example_args(gm: torch.fx.GraphModule, *, frozen: Any, param_indices: Sequence[int]) -> list[object]:
    """Arguments for exporting ``gm`` again: its frozen weights, and zeros shaped like each other tensor input."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    examples = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    tensor_params = [i for i in param_indices if isinstance(examples[i], torch.Tensor)]
    weights = dict(zip(tensor_params, frozen._tensors, strict=True))
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
    bad = sorted(n for n in names if not _SAFE_NAME.fullmatch(n))
    if bad:
        raise OSError(f"the context references files outside its folder: {bad}")
    return {name: (ctx_model.parent / name).read_bytes() for name in sorted(names)}


def _compile_context(model: Any, device: str, session_kwargs: Mapping[str, Any]) -> dict[str, bytes]:
    """Compile ``model`` for ``device`` once more, writing its context, and read the context's files."""
    import qnnx_detection
    from qnnx_backend._session import CTX_FILE, context_config, create_for_device

    folder = Path(tempfile.mkdtemp(prefix="qnnx-aot-ctx-"))
    try:
        kwargs = {**session_kwargs, "session_config": context_config(folder)}
        try:
            session = create_for_device(model, device, kwargs)
        except qnnx_detection.errors.SessionCreationError as exc:
            raise SavedGraphError(f"compiling the graph's context for saving failed on {device}: {exc.cause}") from exc
        del session
        return _context_files(folder / CTX_FILE)
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


# -- loading -----------------------------------------------------------------------------------------------------
