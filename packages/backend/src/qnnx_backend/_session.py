"""The build stage's sessions: the staged ONNX model ORT reads, session creation (whole or split with the CPU EP) and
the placement ORT records, the context cache store and the runtime versions its keys hold (private).

Callers look ``create_for_device`` and ``runtime_versions`` up on this module at each call: tests that stand in
for a crash in the EP, or another onnxruntime-qnn, replace them here."""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from qnnx_backend import _scratch
from qnnx_backend._parts import PartedModel, PartedSession, RecordedPlacement, open_parts
from qnnx_backend._split import NO_OPS, context_cpu_types, misplaced, opcheck, plan_cpu_nodes, write_affinity
from qnnx_backend._version import __version__

logger = logging.getLogger(__name__)

CTX_FILE = "model_ctx.onnx"


class DeviceRejected(Exception):
    """A device cannot take the graph; ``cause`` says why in one sentence (internal to the backend)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class StagedModel:
    """An exported model written where ONNX Runtime reads it: ``model.onnx`` beside ``model.onnx.data``, which holds
    every initializer above 1 KiB.

    ORT memory-maps external data instead of parsing a copy of the weights, and no serialized copy of the model is
    held in memory, so session creation peaks lower than from the model's bytes (whose copy the ``InferenceSession``
    object also keeps for its whole life; onnxruntime 1.24; figures in docs/benchmarks.md). Pass it wherever a
    model path is accepted (``os.PathLike``). The temporary folder is removed when this object is garbage; a session
    created from it keeps its own mapping of the data (see :meth:`keep_for`).
    """

    def __init__(self, exported: Any) -> None:
        import shutil
        import weakref

        folder = str(_scratch.make_dir("model"))
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


@functools.cache
def store(root: str | None, max_bytes: int | None) -> Any:
    import qnnx_ctxcache

    if max_bytes is None:
        return qnnx_ctxcache.ContextStore(root)
    return qnnx_ctxcache.ContextStore(root, options=qnnx_ctxcache.StoreOptions(max_size_bytes=max_bytes))


def runtime_versions() -> dict[str, str]:
    """The versions of the runtime that compiles and loads QNN contexts, as loaded in this process."""
    import qnnx_detection

    v = qnnx_detection.probe(initialize=False).versions
    return {"onnxruntime": str(v.onnxruntime), "onnxruntime-qnn": str(v.onnxruntime_qnn), "qairt": str(v.qairt)}


@functools.cache
def _opcheck_version() -> str:
    """qnnx-opcheck's version, read from its distribution's metadata: a cache hit then imports neither qnnx-opcheck
    nor onnx (imports a warm first call does not need); the module's own when it is not installed as a
    distribution."""
    import importlib.metadata

    try:
        return importlib.metadata.version("qnnx-opcheck")
    except importlib.metadata.PackageNotFoundError:
        import qnnx_opcheck

        return str(qnnx_opcheck.__version__)


# What a cache entry's metadata must hold, bumped when a released version's entries would miss a field the call path
# relies on (2: the integer inputs' bounds in the signature), so that no older entry is served without it.
_ENTRY_FORMAT = "2"


def versions() -> dict[str, str]:
    """The versions a compiled context depends on (part of its cache key)."""
    import qnnx_export

    return {
        **runtime_versions(),
        "entry-format": _ENTRY_FORMAT,
        "torch": torch.__version__,
        "qnnx-export": qnnx_export.__version__,
        # A cached context skips opcheck: a table that now refuses a node must not be bypassed by an old entry.
        "qnnx-opcheck": _opcheck_version(),
        "qnnx-backend": __version__,
    }


def _compile_record(structure: Any, device: str, material: Mapping[str, Any]) -> str:
    """The crash record's name of one compile: the graph without its weight bytes (what a crash at compile depends
    on), the device, the session's options and the runtime versions."""
    digest = hashlib.sha256(structure.SerializeToString(deterministic=True))
    digest.update(json.dumps([device, runtime_versions(), material], sort_keys=True, default=str).encode())
    return "qnnx-compile:" + digest.hexdigest()


def compile_crashed(structure: Any, device: str, material: Mapping[str, Any], cache_dir: str | None) -> str | None:
    """Why the compile of this graph is refused here (a process on this machine died compiling it), or None."""
    return _crash_refusal(_compile_record(structure, device, material), device, cache_dir)


def _crash_refusal(record: str, device: str, cache_dir: str | None) -> str | None:
    try:
        crashes = store(cache_dir, None)
        crashed = crashes.load_crashed(record)
    except Exception as exc:  # a crash record is best effort: never a reason not to compile
        logger.debug("qnn backend: no context store to read crashed compiles from (%s)", exc)
        return None
    if not crashed:
        return None
    return (
        f"a process on this machine died while QNN compiled this graph for the {device.upper()} (a native crash "
        f"inside ONNX Runtime or the QNN EP, recorded under {crashes.root}), so it is not compiled again with this "
        "onnxruntime-qnn; another onnxruntime-qnn version tries again, and `qnnx-ctxcache clear` forgets the record"
    )


@contextlib.contextmanager
def guarded_compile(structure: Any, device: str, material: Mapping[str, Any], cache_dir: str | None) -> Iterator[None]:
    """Compile inside this block: if the process dies in it (a native crash in ONNX Runtime or the QNN EP), every
    later process on this machine that compiles the same graph for the same device, options and runtime versions
    is refused here (DeviceRejected, reason from :func:`compile_crashed`) instead of dying again, so the graph goes
    down the device chain.

    ``material`` is the session's options; the record lives in the context store's crash records (qnnx-ctxcache's
    ``guard_load``/``load_crashed``, the default store unless ``cache_dir``). Best effort: without a store, none."""
    record = _compile_record(structure, device, material)  # hashed once: the graph's structure can be megabytes
    refusal = _crash_refusal(record, device, cache_dir)
    if refusal is not None:
        raise DeviceRejected(refusal)
    try:
        crashes = store(cache_dir, None)
    except Exception:  # _crash_refusal logged it
        yield
        return
    with crashes.guard_load(record):
        yield


def create_on_cpu_ep(model: StagedModel | str) -> Any:
    """An ONNX Runtime session on the CPU EP alone (a saved graph whose QNN device is not usable here).

    Raises DeviceRejected with ORT's message when the CPU EP cannot run the model (an op or dtype it lacks).
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    try:
        return onnxruntime.InferenceSession(os.fspath(model), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own exception types (Fail, NotImplemented, InvalidGraph)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeviceRejected(f"ONNX Runtime's CPU EP cannot run it ({first[:300]})") from exc


_MIXED_RETRIES = 4


def create_for_device(
    model: Any, device: str, kwargs: Mapping[str, Any], on_part: Callable[[int, int], None] | None = None
) -> Any:
    """A QNN session that records ORT's node placement; with CPU fallback, split as described in _create_mixed.

    Raises qnnx_detection.errors.SessionCreationError with the cause.
    """
    import qnnx_detection

    if isinstance(model, PartedModel):
        return _create_parts(model, device, kwargs, on_part)
    kwargs = dict(kwargs)
    cpu_types = kwargs.pop("cpu_op_types", None)
    cpu_nodes = tuple(kwargs.pop("cpu_nodes", ()))
    kwargs["session_config"] = {**kwargs.get("session_config", {}), "session.record_ep_graph_assignment_info": "1"}
    if kwargs.get("allow_cpu_fallback"):
        return _create_mixed(model, device, kwargs, cpu_types, cpu_nodes)
    return qnnx_detection.create_session(model, device, **kwargs)


def compile_parts(
    model: PartedModel, device: str, kwargs: Mapping[str, Any], on_part: Callable[[int, int], None] | None = None
) -> RecordedPlacement:
    """Compile each part in turn, writing its context (``kwargs`` carry the context path), and drop its session
    before the next part is built: at most one compiling session is alive. Returns ORT's placement of all parts.

    Raises qnnx_detection.errors.SessionCreationError with the cause."""
    import qnnx_detection

    placement: dict[str, list[str]] = {}

    def create(k: int, path: str) -> None:
        session = _part_session(model, k, path, device, kwargs, on_part)
        for ep, names in (qnnx_detection.node_placement(session) or {}).items():
            placement.setdefault(ep, []).extend(names)
        del session
        release_memory()  # the compiled graph's host memory goes before the next part is built

    for k, path in enumerate(model.paths):
        create(k, path)
    return RecordedPlacement(placement)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_memory() -> None:
    """Collect Python's garbage, then hand the C heap's free pages back to the system (glibc's ``malloc_trim``).

    A compiling session that is dropped frees its memory into the heap, and glibc keeps most of it resident: measured
    on the simulator, about 170 MiB after each part of a 0.5B-width decoder, which the next part's compile (and the
    loaded contexts) then stacked on. Called after a compiling session goes, before the next build or load."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _part_session(
    model: PartedModel,
    k: int,
    path: str,
    device: str,
    kwargs: Mapping[str, Any],
    on_part: Callable[[int, int], None] | None,
) -> Any:
    if on_part is not None:
        on_part(k, len(model.paths))
    part_kwargs = dict(kwargs)
    config = dict(part_kwargs.get("session_config") or {})
    if "ep.context_file_path" in config:
        ctx = Path(config["ep.context_file_path"])
        config["ep.context_file_path"] = str(ctx.with_name(f"part{k}_{ctx.name}"))
        part_kwargs["session_config"] = config
    if "cpu_nodes" in part_kwargs:
        part_kwargs["cpu_nodes"] = model.cpu_nodes[k] if k < len(model.cpu_nodes) else ()
    session = create_for_device(path, device, part_kwargs)
    written = config.get("ep.context_file_path")
    if written is not None and not Path(written).is_file():  # a context with a part missing cannot be loaded
        import qnnx_detection

        raise qnnx_detection.errors.SessionCreationError(
            device, f"part {k} of {len(model.paths)} wrote no compiled context (QNN took none of its nodes)"
        )
    return session


def _create_parts(
    model: PartedModel, device: str, kwargs: Mapping[str, Any], on_part: Callable[[int, int], None] | None
) -> PartedSession:
    """One session per part (a compiled context of its own, written as ``part<k>_<name>`` when contexts are
    written), chained; each part keeps the CPU-EP nodes planned for it. ``on_part(k, parts)`` is told before part
    ``k`` is built (the progress line shows it)."""

    def create(k: int, path: str) -> Any:
        return _part_session(model, k, path, device, kwargs, on_part)

    return open_parts(model, create)


def _create_mixed(
    model: Any, device: str, kwargs: dict[str, Any], cpu_types: Sequence[str] | None, cpu_nodes: Sequence[str]
) -> Any:
    """A session split between QNN and ORT's CPU EP (see _split): the op types of the nodes qnnx-opcheck does not
    vouch for are pinned to the CPU with the EP's op_affinity file, so the QNN EP's own capability check never
    decides for them; nodes QNN declines by itself also run on the CPU. A compiled context keeps its plain nodes
    on the CPU. A failure at QNN graph finalize is not rescued by ORT's fallback (onnxruntime-qnn 2.7.0): a compile
    (which hands its plan in ``cpu_types``) narrows it to the failing nodes itself (``_build``); a model planned here
    (a saved graph rebuilt) is built again with half of the remaining op types pinned as well (at most 4
    retries, op types chosen blindly, which the compile's narrowing replaces). The placement
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
    retries = 0 if cpu_types is not None and context_types is None else _MIXED_RETRIES
    if context_types is not None:
        cpu_types = context_types
    elif cpu_types is None:  # a model no compile planned here (a saved graph rebuilt): plan it now
        plan = plan_cpu_nodes(proto, opcheck(proto, device, int(kwargs["soc_model"])))
        cpu_types, cpu_nodes = plan.op_types, tuple(plan.nodes)
    excluded = list(cpu_types)
    candidates = sorted({n.op_type for n in proto.graph.node if n.domain in ("", "ai.onnx")} - set(excluded))
    for attempt in range(retries + 1):
        extra = dict(kwargs.get("provider_options") or {})
        path = write_affinity(excluded) if excluded else None
        if path is not None:
            extra["op_affinity"] = path
        try:
            session = qnnx_detection.create_session(model, device, **{**kwargs, "provider_options": extra})
            break
        except qnnx_detection.errors.SessionCreationError:
            if attempt == retries or not candidates:
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


def placement_counts(session: Any) -> dict[str, int]:
    """How many ONNX nodes each execution provider took (ORT's own assignment record; empty when not recorded)."""
    import qnnx_detection

    return {ep: len(nodes) for ep, nodes in (qnnx_detection.node_placement(session) or {}).items()}


def context_bytes(paths: Sequence[str | os.PathLike[str]]) -> int:
    """The bytes on disk of compiled contexts: each ``_ctx.onnx`` file and the binaries its EPContext nodes
    reference (``ep_cache_context`` of an ``embed_mode=0`` node, relative to the file), each file counted once."""
    import onnx

    files: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        files.add(path)
        model = onnx.load(str(path), load_external_data=False)
        for node in model.graph.node:
            if node.op_type != "EPContext":
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if int(attrs.get("embed_mode", 1)) == 0 and "ep_cache_context" in attrs:
                ref = attrs["ep_cache_context"]
                files.add(path.parent / (ref.decode() if isinstance(ref, bytes) else str(ref)))
    return sum(f.stat().st_size for f in files if f.exists())


def context_config(directory: Path) -> dict[str, str]:
    """Session config that makes ORT write the compiled context (``model_ctx.onnx`` plus its binary) into
    ``directory`` while it creates the session."""
    return {
        "ep.context_enable": "1",
        "ep.context_file_path": str(directory / CTX_FILE),
        "ep.context_embed_mode": "0",
    }
