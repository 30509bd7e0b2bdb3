"""Narrow a QNN session failure (a graph finalize error, a crash) to the smallest run of nodes that shows it.

QNN reports a failed graph finalize (``QNN_COMMON_ERROR_MEM_ALLOC`` and similar) for the graph as a whole, without
naming a node. :func:`narrow_failure` finds the nodes by building QNN sessions of parts of the graph, each in a child
process (``qnnx_opcheck._live``'s child: a trial may stop the process natively), and keeps the number of trials logarithmic in the graph's size:

1. the shortest prefix of the nodes, in the graph's topological order, whose session fails: a binary search over
   its length (about ``log2(nodes)`` trials);
2. the shortest run of nodes ending at that prefix's last node whose session still fails: a binary search over its
   start (about as many again).
3. within that run, the nodes joined to its last node through values the run computes, when they fail without
   the others (one trial): a contiguous run can hold nodes of another branch of the graph.

A part is the run of nodes as a model of its own: the values it reads from earlier nodes become its inputs, the
values later nodes (or the graph's outputs) read become its outputs, and it keeps the initializers it uses. A part
made only of data-movement nodes (Reshape, Identity and the like) is never built and counts as building: the run
searched for is one that computes something, which a caller can move to another EP (moving every Reshape of a
graph would cut it into pieces), and the skipped trials are saved.

The search assumes that a failing part still fails when nodes are added before or after it. The run it returns is
where the failure shows, not a proof that every other part builds: the caller builds the graph again without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import onnx

from qnnx_opcheck._live import signal_name

__all__ = ["NarrowReport", "narrow_failure"]

# Ops that only move or relabel data: a part made of these alone is not searched for (see the module doc).
MOVEMENT_OPS = frozenset({"Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Constant", "Dropout"})


@attrs.frozen(kw_only=True)
class NarrowReport:
    """Where a QNN session failure of a graph shows.

    Attributes:
        error: The failure of the whole graph (QNN's message, or how the process died).
        nodes: Names of the nodes of the smallest failing run found, in graph order; empty when the whole graph
            builds, or when no part of it was found to fail by itself.
        op_types: The op types of those nodes, sorted.
        trials: How many sessions were built (child processes started), the whole graph included.
        minimal: False when the trial budget ran out first: ``nodes`` is then a failing run, not the smallest.
        part_error: The failure of that run by itself.
    """

    error: str | None
    nodes: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ()
    trials: int = 0
    minimal: bool = True
    part_error: str | None = None

    @property
    def found(self) -> bool:
        """A failing run was found."""
        return bool(self.nodes)

    @property
    def computing_op_types(self) -> tuple[str, ...]:
        """The run's op types that compute something (not only move data: see ``MOVEMENT_OPS``)."""
        return tuple(t for t in self.op_types if t not in MOVEMENT_OPS)

    def describe(self) -> str:
        """E.g. ``QNN graph finalize failed: ...; narrowed to 3 nodes (MatMul, Reshape) by 19 trials``."""
        if self.error is None:
            return "the graph builds on QNN"
        if not self.found:
            return f"{self.error}; no part of the graph fails by itself ({self.trials} trials)"
        short = "" if self.minimal else ", not minimal: the trial budget ran out"
        return (
            f"{self.error}; narrowed to {len(self.nodes)} node(s) ({', '.join(self.op_types)}) by {self.trials} "
            f"trials{short}"
        )


def _trial(path: Path, request: Mapping[str, Any], timeout: float) -> str | None:
    """Build the session of the model at ``path`` in a child process; None when it builds, else why not."""
    req, res = path.with_suffix(".request.json"), path.with_suffix(".result.json")
    res.unlink(missing_ok=True)
    req.write_text(json.dumps({**request, "model": str(path), "build_only": True}))
    cmd = [sys.executable, "-m", "qnnx_opcheck._live", str(req), str(res)]
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return f"the session took longer than {timeout:.0f} s to build"
    if proc.returncode != 0 or not res.exists():
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
        return f"the process died ({signal_name(proc.returncode)}) {tail[0]}".strip()
    error = json.loads(res.read_text())["error"]
    return None if error is None else str(error)


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # an odd model: what it declares itself
        inferred = model
    graph = inferred.graph
    return {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}


class Parts:
    """Runs of a graph's nodes written as models of their own."""

    def __init__(self, model: onnx.ModelProto, folder: Path) -> None:
        self.model = model
        self.graph = model.graph
        self.nodes = list(self.graph.node)
        self.folder = folder
        self.infos = _value_infos(model)
        self.initializers = {i.name: i for i in self.graph.initializer}
        self.written = 0

    def movement_only(self, indices: Sequence[int]) -> bool:
        """Every node of the part only moves data (``MOVEMENT_OPS``)."""
        return all(self.nodes[k].op_type in MOVEMENT_OPS for k in indices)

    def connected_to_last(self, indices: Sequence[int]) -> tuple[int, ...]:
        """The nodes of ``indices`` joined to its last node through values the part computes itself (the others
        only share its inputs, or nothing, with it)."""
        producer = {out: k for k in indices for out in self.nodes[k].output if out}
        links: dict[int, set[int]] = {k: set() for k in indices}
        for k in indices:
            for name in self.nodes[k].input:
                j = producer.get(name)
                if j is not None:
                    links[k].add(j)
                    links[j].add(k)
        seen, todo = {indices[-1]}, [indices[-1]]
        while todo:
            for j in links[todo.pop()] - seen:
                seen.add(j)
                todo.append(j)
        return tuple(k for k in indices if k in seen)

    def write(self, indices: Sequence[int]) -> Path | None:
        """The model of the nodes at ``indices`` (in graph order); None when an input of it has no known type."""
        run = [self.nodes[k] for k in indices]
        produced = {out: k for k in indices for out in self.nodes[k].output if out}
        inputs: list[str] = []
        for n in run:
            for name in n.input:
                if name and name not in produced and name not in self.initializers and name not in inputs:
                    inputs.append(name)
        # A value leaves the part when a node after it, or outside it, or the graph's outputs read it.
        members = set(indices)
        read_outside = {name for k, n in enumerate(self.nodes) if k not in members for name in n.input}
        read_outside |= {out.name for out in self.graph.output}
        outputs = [name for name in produced if name in read_outside]
        if not outputs:  # nothing leaves the part: its last node's outputs keep it alive
            outputs = [name for name in run[-1].output if name]
        if any(name not in self.infos or not self.infos[name].type.HasField("tensor_type") for name in inputs):
            return None
        used = [self.initializers[name] for n in run for name in n.input if name in self.initializers]
        graph = onnx.helper.make_graph(
            run,
            f"part_{indices[0]}_{indices[-1]}",
            [self.infos[name] for name in inputs],
            [self.infos.get(name) or onnx.helper.make_empty_tensor_value_info(name) for name in outputs],
            initializer=list({i.name: i for i in used}.values()),
        )
        part = onnx.helper.make_model(graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version)
        self.written += 1
        path = self.folder / f"part{self.written}.onnx"
        onnx.save(part, path, save_as_external_data=True, location=f"part{self.written}.onnx.data")
        return path


def narrow_failure(
    model: onnx.ModelProto | str | Path,
    *,
    soc_model: int = 60,
    provider_options: Mapping[str, Any] | None = None,
    cpu_op_types: Sequence[str] = (),
    error: str | None = None,
    max_trials: int = 40,
    timeout: float = 600.0,
    on_trial: Callable[[int, str], None] | None = None,
) -> NarrowReport:
    """Find the smallest run of ``model``'s nodes whose QNN HTP session fails to build (see the module doc).

    Args:
        model: A ModelProto or the path of a ``.onnx`` file (its external data beside it).
        soc_model: The HTP SoC (60: device-like numerics on the x86 simulator).
        provider_options: More QNN EP options for every trial (as the failing session had them).
        cpu_op_types: Op types pinned to ONNX Runtime's CPU EP in every trial (as the failing session had them).
        error: The whole graph's failure when the caller saw it already (skips that trial).
        max_trials: The most sessions to build; past it the narrowest failing run found so far is returned.
        timeout: Seconds before a trial's child process is stopped.
        on_trial: Called before each trial with its number (from 1) and what it builds.

    Returns:
        The report; a graph that builds gives ``error=None``.
    """
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    request = {
        "soc_model": int(soc_model),
        "provider_options": dict(provider_options or {}),
        "cpu_op_types": list(cpu_op_types),
    }
    trials = 0
    with tempfile.TemporaryDirectory(prefix="qnnx-opcheck-narrow-") as tmp:
        parts = Parts(proto, Path(tmp))
        count = len(parts.nodes)
        fails: dict[tuple[int, ...], str | None] = {}

        def failure(indices: tuple[int, ...]) -> str | None:
            nonlocal trials
            if indices in fails:
                return fails[indices]
            if parts.movement_only(indices):
                return None  # not searched for (module doc)
            path = parts.write(indices)
            if path is None:
                return None
            trials += 1
            if on_trial is not None:
                span = f"nodes {indices[0]}-{indices[-1]}"
                some = "" if len(indices) == indices[-1] - indices[0] + 1 else f" ({len(indices)} of them)"
                on_trial(trials, f"{span}{some} of {count}")
            try:
                fails[indices] = _trial(path, request, timeout)
            finally:  # a part holds its share of the weights: keep at most one on disk
                for written in path.parent.glob(f"{path.name}*"):
                    written.unlink(missing_ok=True)
            return fails[indices]

        def run(start: int, stop: int) -> tuple[int, ...]:
            return tuple(range(start, stop))

        if error is None:
            error = failure(run(0, count))
            if error is None:
                return NarrowReport(error=None, trials=trials)
        fails[run(0, count)] = error
        # 1. the shortest failing prefix: prefix [0, hi) fails, [0, lo) builds.
        lo, hi = 0, count
        while hi - lo > 1 and trials < max_trials:
            mid = (lo + hi) // 2
            if failure(run(0, mid)) is not None:
                hi = mid
            else:
                lo = mid
        minimal = hi - lo <= 1
        # 2. the shortest failing run ending at node hi - 1: [start, hi) fails for start = lo_s, builds for hi_s.
        lo_s, hi_s = 0, hi
        while hi_s - lo_s > 1 and trials < max_trials:
            mid = (lo_s + hi_s) // 2
            if failure(run(mid, hi)) is not None:
                lo_s = mid
            else:
                hi_s = mid
        minimal = minimal and hi_s - lo_s <= 1
        if (lo_s, hi) == (0, count) and not minimal:
            return NarrowReport(error=error, trials=trials, minimal=False)
        # 3. within the run, the nodes joined to its last one, when they fail without the others (one trial).
        found = run(lo_s, hi)
        joined = parts.connected_to_last(found)
        if joined != found and trials < max_trials and failure(joined) is not None:
            found = joined
        nodes = [parts.nodes[k] for k in found]
        names = tuple(n.name or f"n{k}" for k, n in zip(found, nodes))
        return NarrowReport(
            error=error,
            nodes=names,
            op_types=tuple(sorted({n.op_type for n in nodes})),
            trials=trials,
            minimal=minimal,
            part_error=fails.get(found, error),
        )
