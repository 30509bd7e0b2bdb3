"""A graph too large for one QNN context, run as parts: the staged parts and the session that chains them
(private).

:func:`stage_parts` plans the cut points of a staged model under ``max_graph_bytes`` (``qnnx_export.plan_parts``)
and writes each part beside the model's weight file, whose bytes the parts share (nothing is copied). A
:class:`PartedSession` holds one ONNX Runtime session per part and looks like one session to the program that
calls it: the model's inputs and outputs, ``run``, and ONNX Runtime's placement record of every part.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from qnnx_backend._report import PartReport

logger = logging.getLogger(__name__)

_ONNX_TYPES = {
    1: "tensor(float)",
    10: "tensor(float16)",
    11: "tensor(double)",
    7: "tensor(int64)",
    6: "tensor(int32)",
    3: "tensor(int8)",
    2: "tensor(uint8)",
    4: "tensor(uint16)",
    5: "tensor(int16)",
    9: "tensor(bool)",
}


@attrs.frozen
class Arg:
    """An input or output of the whole model, as ``InferenceSession.get_inputs()`` describes one."""

    name: str
    type: str
    shape: tuple[int, ...]

    def to_list(self) -> list[Any]:
        return [self.name, self.type, list(self.shape)]

    @classmethod
    def from_list(cls, raw: Sequence[Any]) -> Arg:
        return cls(str(raw[0]), str(raw[1]), tuple(int(d) for d in raw[2]))


@attrs.frozen(eq=False)
class PartedModel:
    """The parts of one model, in the order they run: their model files (staged ONNX models, or compiled contexts
    loaded from the cache), the whole model's inputs and outputs, and what the reports show of each part.

    ``keep`` holds what must live as long as the files (the staged model whose folder they are in)."""

    paths: tuple[str, ...]
    inputs: tuple[Arg, ...]
    outputs: tuple[Arg, ...]
    info: tuple[PartReport, ...]
    cpu_nodes: tuple[tuple[str, ...], ...] = ()
    keep: object = None

    def metadata(self, files: Sequence[str]) -> dict[str, Any]:
        """The JSON-able record a cache entry or a saved file keeps to load the parts again from ``files``."""
        return {
            "files": list(files),
            "inputs": [a.to_list() for a in self.inputs],
            "outputs": [a.to_list() for a in self.outputs],
            "info": [attrs.asdict(i) for i in self.info],
            "cpu_nodes": [list(c) for c in self.cpu_nodes],
        }

    @classmethod
    def from_metadata(cls, folder: Path, record: Mapping[str, Any], keep: object = None) -> PartedModel:
        return cls(
            paths=tuple(str(folder / f) for f in record["files"]),
            inputs=tuple(Arg.from_list(a) for a in record["inputs"]),
            outputs=tuple(Arg.from_list(a) for a in record["outputs"]),
            info=tuple(PartReport(**i) for i in record["info"]),
            cpu_nodes=tuple(tuple(c) for c in record.get("cpu_nodes") or ()),
            keep=keep,
        )


def _args(values: Sequence[Any]) -> tuple[Arg, ...]:
    out = []
    for vi in values:
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value for d in tt.shape.dim)
        out.append(Arg(vi.name, _ONNX_TYPES.get(tt.elem_type, f"tensor(onnx type {tt.elem_type})"), dims))
    return tuple(out)


def _float32_bytes(device: str) -> int:
    return 2 if device == "npu" else 4


def held_weight_bytes(proto: Any, device: str) -> int:
    """The bytes of ``proto``'s weights as ``device`` holds them: float32 as float16 on the NPU (HTP computes floats
    in float16), quantized weights at their width (from types and shapes; external data is not read), and a tensor
    that QNN stores twice counted twice (a tied embedding table: as the Gather's table and as the output head's
    weight; see ``qnnx_export.stored_weight_bytes``)."""
    import qnnx_export

    return int(qnnx_export.stored_weight_bytes(proto, float32_bytes=_float32_bytes(device)))


def plan_for(proto: Any, max_bytes: int, device: str) -> tuple[Any, Any] | None:
    """(the model with inferred shapes, its ``qnnx_export.PartsPlan``), or None when its weights fit ``max_bytes``
    (float32 weights count as float16 on the NPU, which computes floats in float16; a tensor QNN stores twice, twice)."""
    import onnx

    import qnnx_export

    float32_bytes = _float32_bytes(device)
    if qnnx_export.stored_weight_bytes(proto, float32_bytes=float32_bytes) <= max_bytes:
        return None
    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    return inferred, qnnx_export.plan_parts(inferred, max_bytes, float32_bytes=float32_bytes)


def part_reports(plan: Any) -> tuple[PartReport, ...]:
    """What the reports show of each part of a ``qnnx_export.PartsPlan``."""
    return tuple(
        PartReport(first_node=p.first_node, weight_bytes=p.weight_bytes, onnx_nodes=p.stop - p.start)
        for p in plan.parts
    )


def stage_parts(
    model_path: str | os.PathLike[str], max_bytes: int, *, device: str, cpu_nodes: Sequence[str] = (), keep: object
) -> tuple[PartedModel | None, str]:
    """Plan ``model_path``'s parts under ``max_bytes`` and write them beside it.

    Returns (the parts, or None when the model fits one context, and one line describing the plan). float32
    weights count as float16 on the NPU (HTP computes floats in float16).
    """
    import onnx

    import qnnx_export

    path = Path(model_path)
    proto = onnx.load(path, load_external_data=False)
    planned = plan_for(proto, max_bytes, device)
    if planned is None:
        return None, ""
    inferred, plan = planned
    line = plan.describe()
    if len(plan.parts) == 1:
        return None, line
    if plan.over_budget:
        logger.warning(
            "qnn backend: part(s) %s hold more than max_graph_bytes=%d: no cut between their nodes is possible "
            "(one node's weights, or values of unknown shape crossing); QNN may fail to allocate them",
            ", ".join(map(str, plan.over_budget)),
            max_bytes,
        )
    paths = []
    wanted = set(cpu_nodes)
    per_part = []
    for k, part in enumerate(qnnx_export.extract_parts(inferred, plan)):
        target = path.with_name(f"part{k}_{path.name}")
        onnx.save(part, target)  # its initializers still point into the model's one weight file
        paths.append(str(target))
        per_part.append(tuple(n.name for n in part.graph.node if n.name in wanted))
    info = part_reports(plan)
    logger.info("qnn backend: the graph runs as %s", line)
    return (
        PartedModel(
            paths=tuple(paths),
            inputs=_args(proto.graph.input),
            outputs=_args(proto.graph.output),
            info=info,
            cpu_nodes=tuple(per_part),
            keep=keep,
        ),
        line,
    )


def open_parts(model: PartedModel, create: Callable[[int, str], Any]) -> PartedSession:
    """The chained session of ``model``: ``create(k, path)`` makes the session of part ``k``."""
    return PartedSession(model, [create(k, path) for k, path in enumerate(model.paths)])


class _Subgraphs:
    """ORT's placement record of all parts, as one session's ``get_provider_graph_assignment_info`` gives it."""

    def __init__(self, sessions: Sequence[Any]) -> None:
        self._sessions = sessions

    def __call__(self) -> list[Any]:
        out: list[Any] = []
        for s in self._sessions:
            getter = getattr(s, "get_provider_graph_assignment_info", None)
            if callable(getter):
                out.extend(getter() or ())
        return out


class PartedSession:
    """One ONNX Runtime session per part, run in order; what each part computes is handed on to the later parts
    on the host. Callers see the whole model's inputs and outputs."""

    def __init__(self, model: PartedModel, sessions: Sequence[Any]) -> None:
        self.model = model
        self.sessions = tuple(sessions)
        self._inputs = [[i.name for i in s.get_inputs()] for s in self.sessions]
        self._outputs = [[o.name for o in s.get_outputs()] for s in self.sessions]
        self.get_provider_graph_assignment_info = _Subgraphs(self.sessions)

    def get_inputs(self) -> list[Arg]:
        return list(self.model.inputs)

    def get_outputs(self) -> list[Arg]:
        return list(self.model.outputs)

    def get_providers(self) -> list[str]:
        return list(dict.fromkeys(p for s in self.sessions for p in s.get_providers()))

    def run(self, output_names: Sequence[str] | None, feed: Mapping[str, Any], run_options: Any = None) -> list[Any]:
        env = dict(feed)
        for session, names, outs in zip(self.sessions, self._inputs, self._outputs):
            env.update(zip(outs, session.run(outs, {n: env[n] for n in names}, run_options)))
        wanted = [o.name for o in self.model.outputs] if output_names is None else output_names
        return [env[n] for n in wanted]


@attrs.frozen
class _Node:
    name: str


@attrs.frozen
class _Subgraph:
    ep_name: str
    names: tuple[str, ...]

    def get_nodes(self) -> list[_Node]:
        return [_Node(n) for n in self.names]


class RecordedPlacement:
    """ONNX Runtime's node placement of sessions that are gone (parts compiled to write their contexts), in the
    form a live session gives it (``get_provider_graph_assignment_info``), for the checks that read placement."""

    def __init__(self, placement: Mapping[str, Sequence[str]]) -> None:
        self._subgraphs = [_Subgraph(ep, tuple(names)) for ep, names in placement.items()]

    def get_provider_graph_assignment_info(self) -> list[_Subgraph]:
        return list(self._subgraphs)


def part_infos(session: Any) -> tuple[PartReport, ...]:
    """The parts of a session (none for a session of one context)."""
    return session.model.info if isinstance(session, PartedSession) else ()
