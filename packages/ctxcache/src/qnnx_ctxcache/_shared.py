"""One weight copy for several graphs: a weight-shared EPContext group (private; public through ``qnnx_ctxcache.ort``).

A decoder's prefill buckets and its decode step are graphs over the same weights. Compiled apart, each context
binary holds its own copy of them; compiled as one group, the QNN EP writes one ``_qnn.bin`` holding every graph and
one copy of the weights, and each ``_ctx.onnx`` of the group points at it with its own ``partition_name``.

The group is made by creating the sessions of the group one after another in one process, each with
``ep.context_enable=1``, ``ep.context_embed_mode=0`` and ``ep.share_ep_contexts=1``, the last one also with
``ep.stop_share_ep_contexts=1`` (measured on onnxruntime 1.32 and onnxruntime-qnn 2.7.0). Whether the target can
*load* such a group is a separate question, answered by ``qnnx_detection.probe_weight_sharing()`` in a child
process: on the x86_64 HTP simulator the load fails, so a group must never be loaded unprobed.

:func:`check_shared_group` checks a generated group: exactly one binary, every EPContext node of every context model
pointing at it, and (given the sizes of the graphs compiled apart) a binary about one copy of the weights in size.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from qnnx_ctxcache._manifest import inspect_context_model
from qnnx_ctxcache.errors import InvalidOptionsError, SharedContextError

if TYPE_CHECKING:
    import onnx

__all__ = [
    "SHARE_CONFIG",
    "SharedContextGroup",
    "SharedGroupCheck",
    "check_shared_group",
    "compile_shared_group",
    "group_binaries",
    "sharing_problems",
    "size_verdict",
]

_log = logging.getLogger(__name__)

#: The session config entries the group compile sets on every session (``ep.stop_share_ep_contexts`` on the last).
SHARE_CONFIG = ("ep.share_ep_contexts", "ep.stop_share_ep_contexts")
_CONTEXT_SUFFIX = "_ctx.onnx"
# onnx.save cannot write a proto of 2 GiB or more in one file; larger ones are written with external data.
_PROTO_LIMIT = 2**31 - 2**20
# The EP keeps the shared contexts of a group in process-wide state until the session that stops sharing: two groups
# compiled at once in one process would end up in each other's binary.
_GROUP_LOCK = threading.Lock()


@attrs.frozen
class SharedContextGroup:
    """What :func:`compile_shared_group` wrote.

    Attributes:
        directory: The folder holding the group.
        context_models: The ``_ctx.onnx`` files, in the order of the models given (load them from here: their
            EPContext nodes name the binary relative to this folder).
        binaries: The context binaries the context models reference (one when the EP shared the weights).
        binary_bytes: Bytes of the binaries together.
        bytes_on_disk: ``binary_bytes`` plus the context models.
        elapsed_s: Seconds the compile took.
    """

    directory: Path
    context_models: tuple[Path, ...]
    binaries: tuple[Path, ...]
    binary_bytes: int
    bytes_on_disk: int
    elapsed_s: float


@attrs.frozen
class SharedGroupCheck:
    """The outcome of :func:`check_shared_group` (it raises instead when the group is not shared).

    Attributes:
        binary: The one context binary of the group.
        binary_bytes: Its size.
        graphs: How many EPContext nodes (graphs) point at it.
        separate_bytes: The sizes of the graphs compiled apart, as given (empty when not given).
        ratio: ``binary_bytes / sum(separate_bytes)``, or None without them: near ``1 / len(separate_bytes)``
            for graphs that are mostly weights.
        copies: ``binary_bytes / max(separate_bytes)``, or None: how many weight copies the binary holds, near 1.
    """

    binary: Path
    binary_bytes: int
    graphs: int
    separate_bytes: tuple[int, ...] = ()
    ratio: float | None = None
    copies: float | None = None


def _names(models: Sequence[object], names: Sequence[str] | None) -> list[str]:
    if names is None:
        out = []
        for index, model in enumerate(models):
            out.append(Path(os.fspath(model)).stem if isinstance(model, str | os.PathLike) else f"graph_{index}")
    else:
        if isinstance(names, str) or len(names) != len(models):
            raise InvalidOptionsError(
                f"names={names!r}; accepted: one name per model ({len(models)}). Fix: pass a list as long as models, "
                "or leave names out to use the file names."
            )
        out = list(names)
    for name in out:
        if not isinstance(name, str) or not name or name != Path(name).name or name.startswith("."):
            raise InvalidOptionsError(
                f"the group name {name!r} is not a file name; accepted: a non-empty name without a folder, e.g. "
                "'prefill_128'. Fix: pass names=[...] of plain names."
            )
    repeated = sorted({n for n in out if out.count(n) > 1})
    if repeated:
        raise InvalidOptionsError(
            f"the group names {', '.join(map(repr, repeated))} repeat; accepted: one distinct name per model (each "
            "names its _ctx.onnx file). Fix: pass names=[...], e.g. ['prefill_128', 'decode']."
        )
    return out


def _free_dims_list(free_dims: object, count: int) -> list[Mapping[str, int] | None]:
    if free_dims is None or isinstance(free_dims, Mapping):
        return [free_dims] * count
    if isinstance(free_dims, Sequence) and not isinstance(free_dims, str) and len(free_dims) == count:
        return list(free_dims)
    raise InvalidOptionsError(
        f"free_dims={free_dims!r}; accepted: None, one mapping for every model, or a list of {count} mappings (or "
        "None), one per model. Fix: e.g. free_dims=[{'seq': 128}, {'seq': 1}] for a prefill bucket and a decode step."
    )


def _session_config(session_options: Mapping[str, str] | None) -> Mapping[str, str] | None:
    if isinstance(session_options, Mapping):
        owned = sorted(k for k in session_options if k in SHARE_CONFIG)
        if owned:
            raise InvalidOptionsError(
                f"session_options sets {', '.join(owned)}; accepted: any entry but {', '.join(SHARE_CONFIG)}, which "
                "the group compile sets on its sessions. Fix: leave them out."
            )
    return session_options


def _check_models(models: object) -> None:
    if isinstance(models, str | os.PathLike) or not isinstance(models, Sequence) or not models:
        raise InvalidOptionsError(
            f"models={models!r}; accepted: a non-empty list of ONNX paths or ModelProtos, the graphs over the same "
            "weights. Fix: e.g. compile_shared_group(['prefill.onnx', 'decode.onnx'], 'out')."
        )
    import onnx

    for index, model in enumerate(models):
        if not isinstance(model, str | os.PathLike | onnx.ModelProto):
            raise InvalidOptionsError(
                f"models[{index}] is a {type(model).__name__}; accepted: a path of a .onnx file or an "
                "onnx.ModelProto. Fix: pass paths or ModelProtos."
            )


def _source(model: str | os.PathLike[str] | onnx.ModelProto, name: str, directory: Path) -> Path:
    """The path of ``model`` as a file: a path as given, a ModelProto written into ``directory`` first."""
    if isinstance(model, str | os.PathLike):
        path = Path(os.fspath(model))
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such ONNX file. Fix: pass the path of a .onnx model or a ModelProto.")
        return path
    import onnx

    path = directory / f"{name}.onnx"
    if model.ByteSize() < _PROTO_LIMIT:
        onnx.save_model(model, str(path))
    else:  # a copy: externalizing rewrites the proto's tensors in place
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        onnx.save_model(copy, str(path), save_as_external_data=True, location=f"{name}.onnx.data")
    return path


def compile_shared_group(
    models: Sequence[str | os.PathLike[str] | onnx.ModelProto],
    directory: str | os.PathLike[str],
    *,
    names: Sequence[str] | None = None,
    device: str = "npu",
    soc_model: int | str | None = None,
    free_dims: Mapping[str, int] | Sequence[Mapping[str, int] | None] | None = None,
    provider_options: Mapping[str, object] | None = None,
    session_options: Mapping[str, str] | None = None,
) -> SharedContextGroup:
    """Compile ``models`` on the QNN EP into one weight-shared EPContext group in ``directory``.

    The sessions are created in the order given, in this process, each writing ``<name>_ctx.onnx``; the EP writes
    one context binary for all of them (check it with :func:`check_shared_group`). Nothing is loaded: whether the
    target can load the group is for ``qnnx_detection.probe_weight_sharing()`` to say. A group of one model is a
    plain compile (what the sizes of a group are compared with).

    Args:
        models: Paths of ``.onnx`` files (external data beside them) or ``onnx.ModelProto`` objects (written to
            ``directory`` as ``<name>.onnx`` first), the graphs over the same weights.
        directory: Where the group goes (created if missing); none of its output files may exist yet.
        names: One name per model, naming its ``<name>_ctx.onnx``. None: the file names, ``graph_<i>`` for protos.
        device, soc_model, provider_options: As for ``cached_session``, the same for every model.
        free_dims: One mapping for every model, or a list with one mapping (or None) per model: the buckets of one
            symbolic model, e.g. ``[{"seq": 128}, {"seq": 1}]``.
        session_options: Session config entries for every session, as for ``cached_session``; the context and
            sharing entries are set here and refused.

    Returns:
        A :class:`SharedContextGroup`.

    Raises:
        qnnx_ctxcache.errors.InvalidOptionsError: no models, a bad name, option or free dim, or an output file that
            exists already.
        FileNotFoundError: a model path is not a file.
        ImportError: onnxruntime or onnxruntime-qnn is not installed.
    """
    from qnnx_ctxcache.ort import SessionPlan  # ort re-exports this module: imported at call time

    _check_models(models)
    group_names = _names(models, names)
    dims = _free_dims_list(free_dims, len(models))
    config = _session_config(session_options)
    folder = Path(directory)
    targets = [folder / f"{name}{_CONTEXT_SUFFIX}" for name in group_names]
    taken = [str(p) for p in targets if p.exists()] + [
        str(p) for name in group_names[:1] for p in folder.glob(f"{name}_ctx*.bin")
    ]
    if taken:
        raise InvalidOptionsError(
            f"{', '.join(taken)} exist(s) already; accepted: a directory without the group's output files (the EP "
            "never overwrites a context). Fix: pass an empty or new directory, or delete those files."
        )
    folder.mkdir(parents=True, exist_ok=True)
    plans = [
        SessionPlan(
            _source(model, name, folder),
            device=device,
            soc_model=soc_model,
            free_dims=dim,
            provider_options=provider_options,
            session_options=config,
        )
        for model, name, dim in zip(models, group_names, dims, strict=True)
    ]
    started = time.monotonic()
    with _GROUP_LOCK:
        done = 0
        try:
            for plan, source, target in zip(plans, _distinct_paths(plans), targets, strict=True):
                last = done == len(plans) - 1
                plan.ort.InferenceSession(source, sess_options=plan.session_options(_share(target, last)))
                done += 1
        finally:
            if done < len(plans):
                _abandon(plans[0], done, targets, folder)
    elapsed = time.monotonic() - started
    binaries, problems = group_binaries(folder, [t.name for t in targets])
    if problems:
        raise SharedContextError(problems, str(folder))
    binary_bytes = sum(b.stat().st_size for b in binaries)
    on_disk = binary_bytes + sum(t.stat().st_size for t in targets)
    _log.info(
        "compiled a group of %d graph(s) in %.2f s into %s: %d binary(ies), %d bytes",
        len(plans),
        elapsed,
        folder,
        len(binaries),
        binary_bytes,
    )
    if len(binaries) != 1:
        _log.warning(
            "the QNN EP wrote %d context binaries for the group in %s: weights not shared", len(binaries), folder
        )
    return SharedContextGroup(
        directory=folder,
        context_models=tuple(targets),
        binaries=binaries,
        binary_bytes=binary_bytes,
        bytes_on_disk=on_disk,
        elapsed_s=elapsed,
    )


def _distinct_paths(plans: Sequence[Any]) -> list[str]:
    """The models' paths as strings, each spelled differently.

    The EP names a graph of the group after its model's path (ONNX Runtime hashes the path as given), and a second
    graph of the same name collides with the first in the shared context ("Failed to compose Qnn graph",
    onnxruntime-qnn 2.7.0). The buckets of one symbolic model are one file: each repeat is spelled with one more
    ``.`` folder (``dir/./model.onnx``), the same file, its external data found beside it as usual.
    """
    seen: dict[str, int] = {}
    out = []
    for plan in plans:
        path = os.path.abspath(plan.model)
        repeat = seen.get(path, 0)
        seen[path] = repeat + 1
        out.append(os.path.join(os.path.dirname(path), *["."] * repeat, os.path.basename(path)))
    return out


def _share(target: Path, last: bool) -> dict[str, str]:
    """The session config entries of one session of a group writing ``target``."""
    extra = {
        "ep.context_enable": "1",
        "ep.context_file_path": str(target),
        "ep.context_embed_mode": "0",
        "ep.share_ep_contexts": "1",
    }
    if last:
        extra["ep.stop_share_ep_contexts"] = "1"
    return extra


def _abandon(first: Any, done: int, targets: Sequence[Path], folder: Path) -> None:
    """After a session of the group failed: delete what the group wrote, and end the EP's sharing.

    The EP keeps the graphs of an unfinished group and puts them into the binary of the next group this process
    compiles (measured on onnxruntime-qnn 2.7.0): one more compile, which stops sharing, into a folder that is then
    deleted, drops them. It compiles a one-node graph of its own: a graph of the group would collide with its own
    tensor names in the shared context.
    """
    import shutil
    import tempfile

    import onnx
    from onnx import TensorProto, helper

    for path in [*targets, *folder.glob(f"{targets[0].stem}*.bin")]:
        path.unlink(missing_ok=True)
    if done == 0:
        return
    scratch = Path(tempfile.mkdtemp(prefix="qnnx-shared-abandoned-"))
    try:
        x, y = (helper.make_tensor_value_info(f"qnnx_abandon_{n}", TensorProto.FLOAT, [1, 4]) for n in "xy")
        node = helper.make_node("Relu", [x.name], [y.name])
        graph = helper.make_graph([node], "qnnx_abandon", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
        onnx.save_model(model, str(scratch / "abandon.onnx"))
        options = first.session_options(_share(scratch / "abandon_ctx.onnx", True))
        first.ort.InferenceSession(str(scratch / "abandon.onnx"), sess_options=options)
    except Exception:
        _log.warning("could not end the QNN EP's context sharing after a failed group", exc_info=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def group_binaries(directory: Path, context_models: Sequence[str]) -> tuple[tuple[Path, ...], list[str]]:
    """The binaries the EPContext nodes of ``context_models`` (names in ``directory``) reference, in order of first
    reference, and every problem found (a model that does not parse, has no EPContext node, names a missing file)."""
    binaries: dict[str, None] = {}
    problems: list[str] = []
    for model in context_models:
        contexts, found = inspect_context_model(directory, model)
        problems.extend(f"{model}: {p}" for p in found)
        if not contexts and not found:
            problems.append(f"{model}: no EPContext node (the QNN EP compiled none of the graph)")
        binaries.update((c["file"], None) for c in contexts if c["file"] is not None)
    return tuple(directory / b for b in binaries), problems


def sharing_problems(references: Mapping[str, Sequence[str | None]]) -> tuple[str | None, list[str]]:
    """Pure part of the check: ``references`` maps each context model to the file each of its EPContext nodes names
    (None: a node naming no file). Returns the one shared file (None when there is not exactly one) and every
    problem: a model with no node, a node naming no file, more than one file across the group."""
    problems: list[str] = []
    files: dict[str, list[str]] = {}
    for model, refs in references.items():
        if not refs:
            problems.append(f"{model} has no EPContext node")
        for index, ref in enumerate(refs):
            if ref is None:
                problems.append(f"EPContext node #{index} of {model} embeds its context (ep.context_embed_mode=1)")
            else:
                files.setdefault(ref, [])
                if model not in files[ref]:
                    files[ref].append(model)
    if len(files) > 1:
        listed = "; ".join(f"{f} (from {', '.join(ms)})" for f, ms in sorted(files.items()))
        problems.append(f"the group references {len(files)} context binaries, not one: {listed}")
    if not files and references:
        problems.append("no EPContext node of the group names a context binary")
    shared = next(iter(files)) if len(files) == 1 and not problems else None
    return shared, problems


def _separate(separate_bytes: object) -> tuple[int, ...]:
    if separate_bytes is None:
        return ()
    values = [separate_bytes] if isinstance(separate_bytes, int) else separate_bytes
    if (
        isinstance(values, str | bytes)
        or not isinstance(values, Sequence)
        or not values
        or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values)
    ):
        raise InvalidOptionsError(
            f"separate_bytes={separate_bytes!r}; accepted: None, or the positive byte sizes of the graphs' binaries "
            "compiled apart (one int per graph, or their sum). Fix: pass e.g. [g.binary_bytes for g in apart]."
        )
    return tuple(values)


def size_verdict(
    binary_bytes: int, separate_bytes: object, *, tolerance: float = 0.1
) -> tuple[tuple[int, ...], float | None, float | None, str | None]:
    """Pure part of the check: ``(separate sizes, ratio, copies, problem or None)`` for a shared binary of
    ``binary_bytes`` against the sizes of the graphs compiled apart (see :class:`SharedGroupCheck`). The binary is
    one copy when it is at most ``1 + tolerance`` times the largest graph compiled apart."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < math.inf:
        raise InvalidOptionsError(
            f"tolerance={tolerance!r}; accepted: a finite number >= 0 (0.1: the shared binary may be 10% larger than "
            "the largest graph compiled apart). Fix: e.g. tolerance=0.1."
        )
    sizes = _separate(separate_bytes)
    if not sizes:
        return (), None, None, None
    ratio = binary_bytes / sum(sizes)
    copies = binary_bytes / max(sizes)
    problem = None
    if copies > 1 + tolerance:
        problem = (
            f"the shared binary holds {binary_bytes} bytes, {copies:.2f} times the largest graph compiled apart "
            f"({max(sizes)} bytes; {ratio:.2f} of their sum {sum(sizes)}); accepted: at most {1 + tolerance:.2f} "
            "times (one copy of the weights)"
        )
    return sizes, ratio, copies, problem


def check_shared_group(
    group: SharedContextGroup | Sequence[str | os.PathLike[str]],
    *,
    separate_bytes: int | Sequence[int] | None = None,
    tolerance: float = 0.1,
) -> SharedGroupCheck:
    """Check that a generated group shares one copy of its weights.

    Args:
        group: What :func:`compile_shared_group` returned, or the paths of the group's ``_ctx.onnx`` files (one
            folder).
        separate_bytes: The binary sizes of the graphs compiled apart (one per graph, or their sum), to measure the
            shared binary against. None: its size is not checked.
        tolerance: How much larger than the largest graph compiled apart the shared binary may be (0.1: 10%).

    Returns:
        A :class:`SharedGroupCheck` with the ratio to the sizes compiled apart.

    Raises:
        qnnx_ctxcache.errors.SharedContextError: not exactly one binary for the group, an EPContext node that does
            not point at it, a missing file, or a binary larger than one copy; every problem is listed.
        qnnx_ctxcache.errors.InvalidOptionsError: ``group``, ``separate_bytes`` or ``tolerance`` is not acceptable.
    """
    paths = list(group.context_models) if isinstance(group, SharedContextGroup) else _context_paths(group)
    sizes, _, _, _ = size_verdict(1, separate_bytes, tolerance=tolerance)  # the arguments, before any file work
    folder = paths[0].parent
    if any(p.parent != folder for p in paths):
        raise InvalidOptionsError(
            f"the group's context models are in several folders ({', '.join(sorted({str(p.parent) for p in paths}))}); "
            "accepted: one folder (the EP writes a group's binary beside its context models). Fix: pass the "
            "_ctx.onnx files of one compile_shared_group directory."
        )
    references: dict[str, list[str | None]] = {}
    problems: list[str] = []
    for path in paths:
        contexts, found = inspect_context_model(folder, path.name)
        problems.extend(f"{path.name}: {p}" for p in found)
        # A node of a graph split with the CPU that names no file (main_context=0) is a graph in its model's binary.
        references[path.name] = [c["file"] for c in contexts if c["embed_mode"] != 0 or c["file"] is not None]
    shared, structural = sharing_problems(references)
    problems.extend(structural)
    binary = folder / shared if shared is not None and not problems else None
    binary_bytes, ratio, copies = 0, None, None
    if binary is not None:
        binary_bytes = binary.stat().st_size
        _, ratio, copies, size_problem = size_verdict(binary_bytes, separate_bytes, tolerance=tolerance)
        if size_problem is not None:
            problems.append(size_problem)
    if problems or binary is None:
        raise SharedContextError(problems, str(folder))
    return SharedGroupCheck(
        binary=binary,
        binary_bytes=binary_bytes,
        graphs=sum(len(refs) for refs in references.values()),
        separate_bytes=sizes,
        ratio=ratio,
        copies=copies,
    )


def _context_paths(group: Any) -> list[Path]:
    if isinstance(group, str | os.PathLike) or not isinstance(group, Sequence) or not group:
        raise InvalidOptionsError(
            f"group={group!r}; accepted: a SharedContextGroup or a non-empty list of the group's _ctx.onnx paths. "
            "Fix: pass what compile_shared_group returned."
        )
    paths = [Path(os.fspath(p)) for p in group]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)}: no such context model. Fix: pass the group's _ctx.onnx files.")
    return paths
