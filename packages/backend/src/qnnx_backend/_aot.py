"""Save a compiled graph, and load it in another process without Dynamo, export or opcheck (private).

``torch.compile(fn, backend="qnn", fullgraph=True).aot_compile(...)`` asks the backend's callable
(:class:`~qnnx_backend._compiled.QnnGraph`) for its bytes when the function is saved, and hands them back to
:func:`deserialize` in the loading process. The bytes are a payload of plain data, never pickled objects:

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

import contextlib
import hashlib
import json
import logging
import re
import shutil
import struct
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from qnnx_backend import _buckets, _report
from qnnx_backend._program import recreate_and_run
from qnnx_backend.errors import QnnDeviceError, QnnRuntimeError, SavedGraphError

if TYPE_CHECKING:
    from qnnx_backend._compiled import QnnGraph
    from qnnx_backend._program import Program, QnnProgram, Target

logger = logging.getLogger(__name__)

MAGIC = b"QNNXAOT\x00"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIQ32s")  # magic, format version, header length, SHA-256 of the header
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
_FIX_SAVE = "save the compiled function again with this qnnx-backend"


# -- payload format ----------------------------------------------------------------------------------------------


def pack_payload(header: Mapping[str, Any], blobs: Sequence[bytes]) -> bytes:
    """The payload bytes of ``header`` (JSON-able) and ``blobs``; :func:`unpack_payload` reads them back."""
    table = [{"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for b in blobs]
    text = json.dumps({**header, "format": FORMAT_VERSION, "blobs": table}, sort_keys=True, allow_nan=False)
    encoded = text.encode("utf-8")
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(encoded), hashlib.sha256(encoded).digest())
    return b"".join([prefix, encoded, *blobs])


def unpack_payload(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any], list[memoryview]]:
    """The header and blobs of a payload written by :func:`pack_payload`, every checksum verified.

    Raises:
        SavedGraphError: the data is not a qnnx payload, is damaged or truncated, or has a newer format.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SavedGraphError(f"a saved qnnx graph is bytes; got {type(data).__name__}")
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size or bytes(view[: len(MAGIC)]) != MAGIC:
        raise SavedGraphError(
            f"the saved graph does not start with {MAGIC!r} (it starts with {bytes(view[:8])!r}, {len(view)} bytes "
            f"in all): it was not written by qnnx-backend, or is damaged; {_FIX_SAVE}"
        )
    _magic, version, header_len, header_sha = _PREFIX.unpack_from(view)
    if version > FORMAT_VERSION:
        raise SavedGraphError(
            f"the saved graph has format {version}, newer than this qnnx-backend reads (format {FORMAT_VERSION} "
            "and older); upgrade qnnx-backend, or save it again with this version"
        )
    if version < 1:
        raise SavedGraphError(f"the saved graph has format {version}; accepted: 1 to {FORMAT_VERSION}; {_FIX_SAVE}")
    end = _PREFIX.size + header_len
    if end > len(view):
        raise SavedGraphError(
            f"the saved graph is truncated: its header needs {end} bytes, the data has {len(view)}; {_FIX_SAVE}"
        )
    raw = bytes(view[_PREFIX.size : end])
    if hashlib.sha256(raw).digest() != header_sha:
        raise SavedGraphError(f"the saved graph's header does not match its SHA-256 (damaged); {_FIX_SAVE}")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SavedGraphError(f"the saved graph's header is not JSON ({exc}); {_FIX_SAVE}") from exc
    if not isinstance(header, dict) or header.get("format") != version:
        raise SavedGraphError(f"the saved graph's header is not a dict saying format {version}; {_FIX_SAVE}")
    table = header.get("blobs")
    if not isinstance(table, list) or not all(_blob_entry(b) for b in table):
        raise SavedGraphError(f"the saved graph's blob table is malformed; {_FIX_SAVE}")
    total = sum(b["size"] for b in table)
    if end + total != len(view):
        raise SavedGraphError(
            f"the saved graph has {len(view) - end} bytes of data after its header, its table lists {total} "
            f"(truncated or padded); {_FIX_SAVE}"
        )
    blobs = []
    for k, entry in enumerate(table):
        blob = view[end : end + entry["size"]]
        end += entry["size"]
        if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
            raise SavedGraphError(f"blob {k} of the saved graph does not match its SHA-256 (damaged); {_FIX_SAVE}")
        blobs.append(blob)
    return header, blobs


def _blob_entry(value: object) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("size"), int)
        and not isinstance(value.get("size"), bool)
        and value["size"] >= 0
        and isinstance(value.get("sha256"), str)
        and re.fullmatch(r"[0-9a-f]{64}", value["sha256"]) is not None
    )


def fingerprint_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Each key whose saved value differs from the current one, as ``name saved (here: current)``."""
    return [
        f"{name} {saved.get(name)!r} (here: {current.get(name)!r})"
        for name in sorted(set(saved) | set(current))
        if saved.get(name) != current.get(name)
    ]


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
    data = pack_payload(header, blobs)
    logger.info("qnn backend: saved %d static graph(s), %d bytes", len(records), len(data))
    return data


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


def deserialize(data: bytes) -> LoadedGraph:
    """The callable saved by :func:`serialize`; its sessions are created here, from the compiled contexts.

    Raises:
        SavedGraphError: the payload is damaged, truncated, of a newer format, or malformed.
        QnnDeviceError: the graph cannot run here (``strict`` and another configuration, or no usable device).
    """
    header, blobs = unpack_payload(data)
    try:
        return LoadedGraph(header, blobs)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        if isinstance(exc, SavedGraphError):
            raise
        raise SavedGraphError(
            f"the saved graph's header is malformed ({type(exc).__name__}: {exc}); {_FIX_SAVE}"
        ) from exc


class _LoadedVariant:
    """One static graph of a loaded function: its program, and one session re-creation on a run-time failure."""

    def __init__(self, program: Program, sym_positions: tuple[int, ...], report: _report.CompileReport) -> None:
        self._program = program
        self._sym_positions = sym_positions
        self.report = report

    def __call__(self, args: Sequence[object]) -> Any:
        if self._sym_positions:
            args = [a for i, a in enumerate(args) if i not in self._sym_positions]
        try:
            return self._program.run(args)
        except Exception as exc:  # a run-time failure of the EP (e.g. an NPU subsystem restart)
            try:
                label = f"loaded graph {self.report.graph_id}"
                self._program, out = recreate_and_run(self._program, args, label, exc)
                return out
            except Exception as again:
                raise QnnRuntimeError(
                    f"qnn backend: loaded graph {self.report.graph_id} failed twice on {self.report.device}: {again}"
                ) from again


class LoadedGraph(SerializableCallable):
    """A compiled graph loaded from a saved function: QNN sessions over frozen weights, and the call plan.

    It runs only the static sizes that were compiled before saving (a dynamic size picks its saved bucket); the
    parameter values it is called with are ignored, since the weights are frozen into the saved models.
    """

    def __init__(self, header: Mapping[str, Any], blobs: Sequence[memoryview]) -> None:
        import qnnx_detection
        from qnnx_backend._session import runtime_versions

        self._folder = Path(tempfile.mkdtemp(prefix="qnnx-aot-"))
        # The context files stay while the graph lives: a session re-created after a run-time failure reads them.
        weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        options = header["options"]
        graph = header["graph"]
        self._strict = bool(options["strict"])
        self._requested = str(options["device"])
        ladder = options.get("buckets")
        self._ladder = tuple(ladder) if isinstance(ladder, list) else ladder
        self._sym_positions = tuple(int(i) for i in graph["sym_positions"])
        plan = graph.get("plan")
        self._plan = None if plan is None else _plan_from_dict(plan)
        saved_soc = options.get("soc_model")
        self._target_soc = int(saved_soc) if saved_soc is not None else qnnx_detection.resolve_soc_model(None)
        self._blob_sha256 = [str(entry["sha256"]) for entry in header["blobs"]]
        saved = {k: v for k, v in header["fingerprint"].items() if k != "options"}
        self._version_differences = fingerprint_differences(saved, runtime_versions())
        self._variants: dict[tuple[object, ...], _LoadedVariant] = {}
        for n, record in enumerate(graph["variants"]):
            key = tuple(record["key"])
            positions = self._sym_positions if record.get("specialized") else ()
            self._variants[key] = self._load(n, record, blobs, positions)

    def __call__(self, *args: object) -> Any:
        key: tuple[object, ...] = ()
        if self._sym_positions:
            key = tuple(int(args[i]) for i in self._sym_positions)  # type: ignore[call-overload]
        variant = self._variants.get(key)
        if variant is not None:
            return variant(args)
        if self._plan is not None and self._ladder is not None:
            bucket = _buckets.choose(key, self._plan, self._ladder)  # type: ignore[arg-type]
            served = self._variants.get(("bucket", *bucket)) if bucket is not None else None
            if served is not None:
                padded = _buckets.pad(args, self._plan, bucket)  # type: ignore[arg-type]
                return _buckets.slice_outputs(served(padded), self._plan, key)  # type: ignore[arg-type]
        saved = ", ".join(str(list(k)) for k in self._variants) or "none"
        raise QnnRuntimeError(
            f"qnn backend: a loaded function was called with dynamic sizes {list(key)}, which were not compiled "
            f"before it was saved (saved: {saved}); a loaded function cannot compile new sizes. Call the compiled "
            "function with every size it must serve (or a bucket that covers it) before save_compiled_function"
        )

    @classmethod
    def serialize_compile_artifacts(cls, fn: LoadedGraph) -> bytes:
        """Refused: a loaded function is saved already (copy its file instead)."""
        raise SavedGraphError(
            "a function loaded with torch.compiler.load_compiled_function cannot be saved again: copy the file it "
            "was loaded from, or save it from the process that compiled it"
        )

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        """See :func:`deserialize`."""
        return deserialize(data)

    @property
    def reports(self) -> tuple[_report.CompileReport, ...]:
        """The report of each loaded static graph."""
        return tuple(v.report for v in self._variants.values())

    # -- loading one static graph --------------------------------------------------------------------------------

    def _load(
        self, n: int, record: Mapping[str, Any], blobs: Sequence[memoryview], sym_positions: tuple[int, ...]
    ) -> _LoadedVariant:
        import qnnx_detection
        import qnnx_export
        from qnnx_backend._program import NoSessionProgram, Target

        start = time.perf_counter()
        device = str(record["device"])
        status = qnnx_detection.probe(initialize=False).backend(device)
        target = Target(
            device=device,
            soc_model=self._target_soc,
            is_simulator=bool(status.is_simulator),
            param_indices=tuple(int(i) for i in record["param_indices"]),
        )
        signature = qnnx_export.GraphSignature.from_dict(record["signature"])
        cache = "aot"
        reason = None
        program: Program
        if record["kind"] == "none":
            program = NoSessionProgram(signature, target)
        elif not status.available:
            # No PyTorch graph to fall back to, but the saved ONNX model runs on ONNX Runtime's CPU EP.
            reason = f"the saved graph was compiled for {device}, which is not usable here ({status.reason})"
            program = self._on_cpu_ep(n, record, blobs, target, reason)
            cache = "aot-cpu"
        else:
            program, cache = self._session(n, record, blobs, target)
        bucket = record.get("bucket")
        report = _report.CompileReport(
            graph_id=_report.next_graph_id(),
            device="ort-cpu" if cache == "aot-cpu" else device,
            reason=reason,
            requested_device=self._requested,
            strict=self._strict,
            is_simulator=target.is_simulator,
            soc_model=self._target_soc,
            soc_name=qnnx_detection.soc_name(self._target_soc),
            cache=cache,
            onnx_nodes=record.get("onnx_nodes"),
            passes_applied=tuple(record.get("passes_applied") or ()),
            placement=dict(program.placement),
            input_shapes=tuple(tuple(s) for s in record.get("input_shapes") or ()),
            bucket=None if bucket is None else tuple(bucket),
            timings={"total": time.perf_counter() - start},
        )
        _report.record(report)
        logger.info("%s", report.summary())
        return _LoadedVariant(program, sym_positions, report)

    def _session(
        self,
        n: int,
        record: Mapping[str, Any],
        blobs: Sequence[memoryview],
        target: Target,
    ) -> tuple[QnnProgram, str]:
        """The program of one saved QNN graph: from its context, or rebuilt from its ONNX model on a mismatch."""
        import qnnx_detection
        from qnnx_backend._program import QnnProgram, SessionSource
        from qnnx_backend._session import create_for_device

        device = target.device
        kwargs = {
            "soc_model": self._target_soc,
            "provider_options": {str(k): str(v) for k, v in record["session"]["provider_options"].items()},
            "allow_cpu_fallback": bool(record["session"]["allow_cpu_fallback"]),
        }
        differences = list(self._version_differences)
        if int(record["soc_model"]) != self._target_soc:
            differences.append(f"soc_model {record['soc_model']!r} (here: {self._target_soc!r})")
        session = None
        cache = "aot"
        if not differences:
            ctx = self._write(f"graph{n}-context", record["context"], blobs)
            store, name = _crash_guard(record["context"], self._blob_sha256)
            if store is not None and store.load_crashed(name):
                differences.append(
                    "a process died while loading its compiled context on this machine (a crash in ONNX Runtime "
                    "or QNN), so it is not loaded again"
                )
            else:
                try:
                    # Marked while ORT reads it: if the process dies here, the next one rebuilds instead.
                    with store.guard_load(name) if store is not None else contextlib.nullcontext():
                        session = create_for_device(str(ctx), device, kwargs)
                except qnnx_detection.errors.SessionCreationError as exc:
                    differences.append(f"its compiled context did not load ({exc.cause})")
            source = str(ctx)
        if session is None:
            cause = "; ".join(differences)
            if self._strict:
                raise QnnDeviceError(
                    device,
                    f"the saved graph does not match this machine: {cause}. Save it again with this configuration "
                    "(or for this SoC with the soc_model option), or load it with strict=False in the saved "
                    "options to rebuild it here from its saved ONNX model",
                )
            logger.warning(
                "qnn backend: saved graph does not match this machine (%s); rebuilding it from its saved ONNX model",
                cause,
            )
            model = self._write(f"graph{n}-model", record["model"], blobs)
            self._check_ops(model, device, bool(kwargs["allow_cpu_fallback"]))
            try:
                session = create_for_device(str(model), device, kwargs)
            except qnnx_detection.errors.SessionCreationError as exc:
                raise QnnDeviceError(
                    device, f"rebuilding the saved graph from its ONNX model failed: {exc.cause}"
                ) from exc
            source, cache = str(model), "aot-rebuilt"
        program = QnnProgram(
            session=session, target=target, source=SessionSource(source, kwargs), cache=cache, **_call_plan(record)
        )
        return program, cache

    def _on_cpu_ep(
        self,
        n: int,
        record: Mapping[str, Any],
        blobs: Sequence[memoryview],
        target: Target,
        reason: str,
    ) -> Program:
        """The saved ONNX model of one graph on ONNX Runtime's CPU EP (its QNN device is not usable here); raises
        QnnDeviceError under strict, or when the CPU EP cannot run it either."""
        import warnings

        from qnnx_backend._program import CpuEpProgram, SessionSource
        from qnnx_backend._session import DeviceRejected, create_on_cpu_ep
        from qnnx_backend.errors import QnnFallbackWarning

        device = target.device
        if self._strict:
            raise QnnDeviceError(
                device,
                f"{reason}. Load it where onnxruntime-qnn reaches that device, compile the model here, or save it "
                "with strict=False to let a loaded function run its saved ONNX model on ONNX Runtime's CPU EP",
            )
        model = self._write(f"graph{n}-model", record["model"], blobs)
        try:
            session = create_on_cpu_ep(str(model))
        except DeviceRejected as exc:
            raise QnnDeviceError(device, f"{reason}, and {exc.cause}") from exc
        message = f"qnn backend: {reason}; it runs its saved ONNX model on ONNX Runtime's CPU EP"
        warnings.warn(message, QnnFallbackWarning, stacklevel=2)
        logger.warning("%s", message)
        return CpuEpProgram(
            session=session, target=target, source=SessionSource(str(model), {}), cache="aot-cpu", **_call_plan(record)
        )

    def _check_ops(self, model: Path, device: str, mixed: bool) -> None:
        """The operator check a fresh compile runs, against the tables of the onnxruntime-qnn installed here."""
        import onnx

        import qnnx_opcheck
        from qnnx_backend._options import OPCHECK_BACKEND

        structure = onnx.load(str(model), load_external_data=False)
        report = qnnx_opcheck.check_model(structure, OPCHECK_BACKEND[device], soc_model=self._target_soc)
        if not report.supported and not mixed:
            nodes = ", ".join(f"{v.op_type} ({v.node_name}): {v.reason}" for v in report.unsupported)
            raise QnnDeviceError(device, f"the saved graph cannot be rebuilt here: unsupported node(s) {nodes}")

    def _write(self, name: str, files: Mapping[str, Any], blobs: Sequence[memoryview]) -> Path:
        """Write one saved model's files into a folder of their own; the path of its model file."""
        folder = self._folder / name
        folder.mkdir()
        for file_name, index in files["files"].items():
            if not _SAFE_NAME.fullmatch(file_name) or not isinstance(index, int) or not 0 <= index < len(blobs):
                raise SavedGraphError(f"the saved graph lists a bad file entry {file_name!r}: {index!r}; {_FIX_SAVE}")
            (folder / file_name).write_bytes(blobs[index])
        model_file = str(files["model_file"])
        if model_file not in files["files"]:
            raise SavedGraphError(f"the saved graph's model file {model_file!r} is not among its files; {_FIX_SAVE}")
        return folder / model_file


def _call_plan(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a program of one saved graph needs beside its session: the call plan saved with it."""
    import qnnx_export

    return {
        "signature": qnnx_export.GraphSignature.from_dict(record["signature"]),
        "onnx_nodes": record.get("onnx_nodes"),
        "passes_applied": tuple(record.get("passes_applied") or ()),
        "out_dtypes": tuple(None if d is None else getattr(torch, d) for d in record["out_dtypes"]),
        "fp16": bool(record["fp16"]),
    }


def _crash_guard(files: Mapping[str, Any], blob_sha256: Sequence[str]) -> tuple[Any, str]:
    """The context store that records crashed loads on this machine (the default one: a saved function does not
    carry the saving machine's cache folder) and the name of one saved context in it; (None, name) when no store
    can be opened."""
    digests = sorted(blob_sha256[i] for i in files["files"].values())
    name = "qnnx-aot-context:" + hashlib.sha256("+".join(digests).encode()).hexdigest()
    try:
        from qnnx_backend._session import store

        return store(None, None), name
    except Exception as exc:  # a crash record is best effort: never a reason not to load
        logger.debug("qnn backend: no context store to record crashed loads (%s)", exc)
        return None, name


def _plan_from_dict(plan: Mapping[str, Any]) -> _buckets.BucketPlan:
    return _buckets.BucketPlan(
        sym_positions=tuple(int(i) for i in plan["sym_positions"]),
        padded=tuple((int(a), int(b), int(c)) for a, b, c in plan["padded"]),
        sliced=tuple((int(a), int(b), int(c)) for a, b, c in plan["sliced"]),
        upper=tuple(None if u is None else int(u) for u in plan["upper"]),
    )
