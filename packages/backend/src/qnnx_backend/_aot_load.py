"""Load a saved compiled function: QNN sessions straight from its compiled contexts, no Dynamo, export or opcheck
(private; the payload's format is :mod:`qnnx_backend._payload`, the saving side :mod:`qnnx_backend._aot`).

Each saved static graph gets its session from its saved context; where that context cannot serve (another
onnxruntime-qnn or SoC, a context QNN refuses, or one that killed an earlier process here) the graph is rebuilt
from its saved ONNX model, and where its QNN device is not usable at all the saved model runs on ONNX Runtime's
CPU EP; ``strict`` in the saved options turns each of these into a ``QnnDeviceError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from qnnx_backend import _buckets, _report, _scratch, _session
from qnnx_backend._options import BackendOptions
from qnnx_backend._parts import PartedModel
from qnnx_backend._payload import FIX_SAVE, SAFE_NAME, fingerprint_differences, unpack_payload
from qnnx_backend._program import (
    CpuEpProgram,
    NoSessionProgram,
    Program,
    QnnProgram,
    SessionSource,
    Target,
    recreate_and_run,
)
from qnnx_backend._session import DeviceRejected
from qnnx_backend._split import opcheck
from qnnx_backend._untrusted import UntrustedRun
from qnnx_backend.errors import QnnDeviceError, QnnFallbackWarning, QnnRuntimeError, SavedGraphError

logger = logging.getLogger(__name__)

_OPTION = attrs.fields(BackendOptions)


def deserialize(data: bytes) -> LoadedGraph:
    """The callable saved by :func:`serialize`; its sessions are created here, from the compiled contexts.

    Raises:
        SavedGraphError: the payload is damaged, truncated, of a newer format, or malformed.
        QnnDeviceError: the graph cannot run here (``strict`` and another configuration, or no usable device).
    """
    header, blobs = unpack_payload(data)
    return deserialize_parts(header, blobs)


def deserialize_parts(header: Mapping[str, Any], blobs: Sequence[memoryview]) -> LoadedGraph:
    """:func:`deserialize` of a payload already unpacked (:func:`qnnx_backend.load` reads its own section first)."""
    try:
        return LoadedGraph(header, blobs)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        if isinstance(exc, SavedGraphError):
            raise
        raise SavedGraphError(
            f"the saved graph's header is malformed ({type(exc).__name__}: {exc}); {FIX_SAVE}"
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
        except UntrustedRun as untrusted:
            raise QnnRuntimeError(
                f"qnn backend: loaded graph {self.report.graph_id} on {self.report.device}: {untrusted}; "
                f"{untrusted.why}, so this call's results cannot be trusted. The arguments are unchanged. Fix: "
                "compute this input with the compiled function (device='auto' computes such calls in PyTorch), or "
                "keep the graph's values finite and within +-65504."
            ) from untrusted
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

        self._folder = _scratch.make_dir("aot")
        # The context files stay while the graph lives: a session re-created after a run-time failure reads them.
        weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        options = header["options"]
        graph = header["graph"]
        # The saved options are read by their fields' names: a renamed option fails here, not with a KeyError.
        self._strict = bool(options[_OPTION.strict.name])
        self._requested = str(options[_OPTION.device.name])
        ladder = options.get(_OPTION.buckets.name)
        self._ladder = tuple(ladder) if isinstance(ladder, list) else ladder
        self._sym_positions = tuple(int(i) for i in graph["sym_positions"])
        plan = graph.get("plan")
        self._plan = None if plan is None else _plan_from_dict(plan)
        saved_soc = options.get(_OPTION.soc_model.name)
        self._target_soc = int(saved_soc) if saved_soc is not None else qnnx_detection.resolve_soc_model(None)
        self._blob_sha256 = [str(entry["sha256"]) for entry in header["blobs"]]
        saved = {k: v for k, v in header["fingerprint"].items() if k != "options"}
        self._version_differences = fingerprint_differences(saved, _session.runtime_versions())
        self._variants: dict[tuple[object, ...], _LoadedVariant] = {}
        for n, record in enumerate(graph["variants"]):
            key = tuple(record["key"])
            positions = self._sym_positions if record.get("specialized") else ()
            self._variants[key] = self._load(_SavedGraph(n, record, blobs), positions)

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

    def _load(self, saved: _SavedGraph, sym_positions: tuple[int, ...]) -> _LoadedVariant:
        import qnnx_detection
        import qnnx_export

        record = saved.record
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
            program = self._on_cpu_ep(saved, target, _call_plan(record, signature), reason)
            cache = "aot-cpu"
        else:
            program, cache = self._session(saved, target, _call_plan(record, signature))
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
            parts=program.parts,
            input_shapes=tuple(tuple(s) for s in record.get("input_shapes") or ()),
            bucket=None if bucket is None else tuple(bucket),
            timings={"total": time.perf_counter() - start},
        )
        _report.record(report)
        logger.info("%s", report.summary())
        return _LoadedVariant(program, sym_positions, report)

    def _session(self, saved: _SavedGraph, target: Target, plan: Mapping[str, Any]) -> tuple[QnnProgram, str]:
        """The program of one saved QNN graph: from its context, or rebuilt from its ONNX model on a mismatch."""
        import qnnx_detection

        record = saved.record
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
            ctx = self._write(saved, "context")
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
                        session = _session.create_for_device(_model_of(ctx, record["context"]), device, kwargs)
                except qnnx_detection.errors.SessionCreationError as exc:
                    differences.append(f"its compiled context did not load ({exc.cause})")
            source = _model_of(ctx, record["context"])
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
            model = self._write(saved, "model")
            self._check_ops(model, device, bool(kwargs["allow_cpu_fallback"]))
            try:
                session = _session.create_for_device(_model_of(model, record["model"]), device, kwargs)
            except qnnx_detection.errors.SessionCreationError as exc:
                raise QnnDeviceError(
                    device, f"rebuilding the saved graph from its ONNX model failed: {exc.cause}"
                ) from exc
            source, cache = _model_of(model, record["model"]), "aot-rebuilt"
        program = QnnProgram(session=session, target=target, source=SessionSource(source, kwargs), cache=cache, **plan)
        return program, cache

    def _on_cpu_ep(self, saved: _SavedGraph, target: Target, plan: Mapping[str, Any], reason: str) -> Program:
        """The saved ONNX model of one graph on ONNX Runtime's CPU EP (its QNN device is not usable here); raises
        QnnDeviceError under strict, or when the CPU EP cannot run it either."""
        device = target.device
        if self._strict:
            raise QnnDeviceError(
                device,
                f"{reason}. Load it where onnxruntime-qnn reaches that device, compile the model here, or save it "
                "with strict=False to let a loaded function run its saved ONNX model on ONNX Runtime's CPU EP",
            )
        model = self._write(saved, "model")
        try:
            session = _session.create_on_cpu_ep(str(model))
        except DeviceRejected as exc:
            raise QnnDeviceError(device, f"{reason}, and {exc.cause}") from exc
        message = f"qnn backend: {reason}; it runs its saved ONNX model on ONNX Runtime's CPU EP"
        warnings.warn(message, QnnFallbackWarning, stacklevel=2)
        logger.warning("%s", message)
        return CpuEpProgram(
            session=session, target=target, source=SessionSource(str(model), {}), cache="aot-cpu", **plan
        )

    def _check_ops(self, model: Path, device: str, mixed: bool) -> None:
        """The operator check a fresh compile runs, against the tables of the onnxruntime-qnn installed here."""
        import onnx

        structure = onnx.load(str(model), load_external_data=False)
        report = opcheck(structure, device, self._target_soc)
        if not report.supported and not mixed:
            nodes = ", ".join(f"{v.op_type} ({v.node_name}): {v.reason}" for v in report.unsupported)
            raise QnnDeviceError(device, f"the saved graph cannot be rebuilt here: unsupported node(s) {nodes}")

    def _write(self, saved: _SavedGraph, kind: str) -> Path:
        """Write the files of a saved graph's ``kind`` (``context`` or ``model``) into a folder of their own; the path
        of its model file."""
        files, blobs = saved.record[kind], saved.blobs
        folder = self._folder / f"graph{saved.n}-{kind}"
        folder.mkdir()
        for file_name, index in files["files"].items():
            if not SAFE_NAME.fullmatch(file_name) or not isinstance(index, int) or not 0 <= index < len(blobs):
                raise SavedGraphError(f"the saved graph lists a bad file entry {file_name!r}: {index!r}; {FIX_SAVE}")
            (folder / file_name).write_bytes(blobs[index])
        model_file = str(files["model_file"])
        if model_file not in files["files"]:
            raise SavedGraphError(f"the saved graph's model file {model_file!r} is not among its files; {FIX_SAVE}")
        return folder / model_file


@attrs.frozen
class _SavedGraph:
    """One saved static graph while it loads: its number in the payload, its record and the payload's files."""

    n: int
    record: Mapping[str, Any]
    blobs: Sequence[memoryview]


def _model_of(path: Path, files: Mapping[str, Any]) -> str | PartedModel:
    """What a session is created from: the saved model file, or the parts it lists beside it."""
    parts = files.get("parts")
    return str(path) if parts is None else PartedModel.from_metadata(path.parent, parts)


def _call_plan(record: Mapping[str, Any], signature: Any) -> dict[str, Any]:
    """What a program of one saved graph needs beside its session: the call plan saved with it."""
    return {
        "signature": signature,
        "onnx_nodes": record.get("onnx_nodes"),
        "passes_applied": tuple(record.get("passes_applied") or ()),
        "out_dtypes": tuple(None if d is None else getattr(torch, d) for d in record["out_dtypes"]),
        "fp16": bool(record["fp16"]),
        # A file saved before the decision was recorded clipped always: it keeps doing so (its saved generation
        # graphs take a float32-min mask on every call).
        "clip_inputs": record.get("clip_inputs", "trusted") in ("verified", "trusted"),
    }


def _crash_guard(files: Mapping[str, Any], blob_sha256: Sequence[str]) -> tuple[Any, str]:
    """The context store that records crashed loads on this machine (the default one: a saved function does not
    carry the saving machine's cache folder) and the name of one saved context in it; (None, name) when no store
    can be opened."""
    digests = sorted(blob_sha256[i] for i in files["files"].values())
    name = "qnnx-aot-context:" + hashlib.sha256("+".join(digests).encode()).hexdigest()
    try:
        return _session.store(None, None), name
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
