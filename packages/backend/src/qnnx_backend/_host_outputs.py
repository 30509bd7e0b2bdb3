"""Outputs beyond float16's range, computed in PyTorch beside the QNN graph that computes the rest (private).

HTP computes a float graph in float16 and saturates silently at +-65504, so a graph with an output beyond that range
on its example inputs is refused by the NPU (:func:`qnnx_backend._check.fp16_range_refusal`). Such an output is
often no result of the model at all but an attention mask handed to the next graph across a graph break: ``(1 -
mask) * torch.finfo(dtype).min``, or ``masked_fill`` with ``-inf``. Refusing the whole graph for it sends the
graph's real work (its matmuls) to PyTorch.

:func:`separate` keeps the rest of such a graph on QNN: when every output beyond the range is *light* (computed
without a matmul, a convolution or attention, from a few dozen operations), the graph splits in two over the same
arguments, the QNN graph without those outputs and a PyTorch graph of only what computes them, and
:class:`HostOutputsProgram` runs both at each call and puts the outputs back in their places. The values PyTorch
computes are eager's own, so nothing is approximated; the cost is those few operations on the CPU per call. A graph
whose out-of-range output needs heavy work is refused by the NPU as before, and ``partition="whole"`` (or ``strict``)
never splits.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from qnnx_backend._compare import FP16_MAX, EagerReference
from qnnx_backend._export import CompileContext, ExportMemo, analyze

if TYPE_CHECKING:
    from qnnx_backend._program import Program, Target
    from qnnx_backend._report import ExportReport, PartReport
    from qnnx_export import GraphSignature

logger = logging.getLogger(__name__)

MAX_HOST_NODES = 64
"""The most operations PyTorch computes per call for the outputs it takes over (a mask takes a few dozen)."""

# Work that belongs on the accelerator: an output that needs one of these is no mask, and the graph is not split.
_HEAVY = frozenset(
    {
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "addbmm",
        "baddbmm",
        "addmv",
        "mv",
        "linear",
        "bilinear",
        "einsum",
        "tensordot",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convolution",
        "_convolution",
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
        "lstm",
        "gru",
        "rnn_tanh",
        "rnn_relu",
    }
)


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", None) or str(target)
    return str(name).split(".")[-1]


def _is_compute(node: torch.fx.Node) -> bool:
    return node.op in ("call_function", "call_method", "call_module")


def beyond_half(value: object) -> bool:
    """Whether ``value`` is a float tensor with an element beyond float16's range (an infinity included)."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
        return False
    return bool((value.detach().abs().nan_to_num(nan=0.0) > FP16_MAX).any())


@attrs.frozen(eq=False)
class HostSplit:
    """One graph as two over the same arguments: ``device_gm`` (every output but ``host_positions``) for QNN, and
    ``host_gm`` (only those) for PyTorch."""

    device_gm: torch.fx.GraphModule
    host_gm: torch.fx.GraphModule
    host_positions: tuple[int, ...]
    """The positions in the graph's output tuple that PyTorch computes."""
    count: int
    """How many outputs the graph returns."""
    as_list: bool
    host_ops: int
    """How many operations PyTorch computes per call."""

    def device_part(self, outputs: Sequence[object]) -> tuple[object, ...]:
        """The outputs of ``device_gm`` taken from the whole graph's ``outputs``."""
        return tuple(v for k, v in enumerate(outputs) if k not in self.host_positions)

    def merge(self, device: Any, host: Any) -> Any:
        """The whole graph's outputs from the two graphs' outputs."""
        on_device = iter(device)
        on_host = iter(host)
        merged = [next(on_host) if k in self.host_positions else next(on_device) for k in range(self.count)]
        return merged if self.as_list else tuple(merged)

    def describe(self) -> str:
        where = ", ".join(str(k) for k in self.host_positions)
        return (
            f"output(s) {where} beyond float16's range computed in PyTorch ({self.host_ops} operation(s) per call, "
            "no matmul or convolution); the rest of the graph on QNN"
        )


def _with_outputs(gm: torch.fx.GraphModule, picked: Sequence[torch.fx.Node]) -> torch.fx.GraphModule:
    """A graph over ``gm``'s arguments returning the tuple ``picked`` (what no longer feeds an output is dropped)."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.graph_copy(gm.graph, env)
    graph.output(tuple(env[n] for n in picked))
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)


def plan_split(gm: torch.fx.GraphModule, positions: Sequence[int]) -> HostSplit | str:
    """The split that computes the outputs at ``positions`` in PyTorch, or why the graph is not split."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = out.args[0]
    if not isinstance(values, tuple | list):
        return "the graph returns one value"
    wanted = tuple(sorted(set(positions)))
    if not wanted or any(not 0 <= k < len(values) or not isinstance(values[k], torch.fx.Node) for k in wanted):
        return "an output beyond float16's range is not a value of the graph"
    rest = [values[k] for k in range(len(values)) if k not in wanted]
    if not rest or any(not isinstance(v, torch.fx.Node) for v in rest):
        return "no other output is computed by the graph"
    host_nodes: set[torch.fx.Node] = set()
    stack = [values[k] for k in wanted]
    while stack:
        node = stack.pop()
        if node in host_nodes:
            continue
        host_nodes.add(node)
        if node.op == "call_module" or (_is_compute(node) and _op_name(node) in _HEAVY):
            return f"computing it takes {_op_name(node)!r} ({node.name}), work for the accelerator"
        stack.extend(node.all_input_nodes)
    ops = sum(1 for n in host_nodes if _is_compute(n) and n.target is not operator.getitem)
    if ops > MAX_HOST_NODES:
        return f"computing it takes {ops} operations (more than {MAX_HOST_NODES})"
    return HostSplit(
        device_gm=_with_outputs(gm, rest),
        host_gm=_with_outputs(gm, [values[k] for k in wanted]),
        host_positions=wanted,
        count=len(values),
        as_list=isinstance(values, list),
        host_ops=ops,
    )


def separate(ctx: CompileContext) -> tuple[CompileContext, HostSplit | None]:
    """The compile of ``ctx``'s graph without its light outputs beyond float16's range, and the split that computes
    them in PyTorch; ``(ctx, None)`` when nothing is split.

    Runs the float16 range check (the compile's one eager run of the graph), so call it only when the NPU may take
    the graph. The returned context shares the check's eager outputs: the NPU does not run the graph again.
    """
    from qnnx_backend._check import fp16_range_refusal

    if ctx.calibration is not None or ctx.options.resolved_partition == "whole":
        return ctx, None
    if fp16_range_refusal(ctx) is None or ctx.memo.eager is None:
        return ctx, None
    outputs = ctx.memo.eager.outputs
    if not isinstance(outputs, tuple | list) or not all(_plain_value(v) for v in outputs):
        return ctx, None
    positions = [k for k, v in enumerate(outputs) if beyond_half(v)]
    split = plan_split(ctx.gm, positions)
    if isinstance(split, str):
        logger.info("qnn backend: outputs beyond float16's range stay with the graph: %s", split)
        return ctx, None
    analysis = analyze(split.device_gm, ctx.args, ctx.options)
    if analysis.problems:
        return ctx, None
    memo = ExportMemo(range_checked=True, eager=EagerReference(ctx.args, split.device_part(outputs)))
    logger.info("qnn backend: %s", split.describe())
    return attrs.evolve(ctx, gm=split.device_gm, analysis=analysis, memo=memo), split


def _plain_value(value: object) -> bool:
    """Whether the range check reads ``value`` as one output: a real tensor, or no tensor at all."""
    if isinstance(value, torch.Tensor):
        return not value.is_complex()
    return not isinstance(value, tuple | list | Mapping)


class HostOutputsProgram:
    """A QNN program plus the PyTorch graph of the outputs beyond float16's range; each call runs both."""

    def __init__(self, inner: Program, split: HostSplit) -> None:
        self.inner = inner
        self.split = split

    @property
    def signature(self) -> GraphSignature:
        return self.inner.signature

    @property
    def target(self) -> Target:
        return self.inner.target

    @property
    def cache(self) -> str:
        return self.inner.cache

    @property
    def onnx_nodes(self) -> int | None:
        return self.inner.onnx_nodes

    @property
    def passes_applied(self) -> tuple[str, ...]:
        return self.inner.passes_applied

    @property
    def placement(self) -> Mapping[str, int]:
        return self.inner.placement

    @property
    def cpu_nodes(self) -> Mapping[str, str]:
        return self.inner.cpu_nodes

    @property
    def parts(self) -> tuple[PartReport, ...]:
        return self.inner.parts

    @property
    def weight_bytes(self) -> int | None:
        return self.inner.weight_bytes

    @property
    def context_bytes(self) -> int | None:
        return self.inner.context_bytes

    @property
    def export(self) -> ExportReport | None:
        return self.inner.export

    @property
    def clip_inputs(self) -> bool:
        return self.inner.clip_inputs

    @clip_inputs.setter
    def clip_inputs(self, value: bool) -> None:
        self.inner.clip_inputs = value

    @property
    def clipped(self) -> bool:
        return self.inner.clipped

    def beyond_half_range(self, args: Sequence[object]) -> bool:
        return self.inner.beyond_half_range(args)

    def run(self, args: Sequence[object]) -> Any:
        device = self.inner.run(args)
        with torch.no_grad():
            host = self.split.host_gm(*args)
        return self.split.merge(device, host)

    def recreate(self) -> HostOutputsProgram:
        return HostOutputsProgram(self.inner.recreate(), self.split)


__all__ = ["HostOutputsProgram", "HostSplit", "beyond_half", "plan_split", "separate"]
