"""Tracing a Dynamo graph to ATen for the translator: make_fx under qnnx-export's own fake mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from qnnx_export._options import DEFAULT_MAX_DENSE_EXPERTS, DEFAULT_MAX_GATHERED_EXPERT_BYTES

if TYPE_CHECKING:
    import torch.fx

__all__ = ["trace_aten"]


def trace_aten(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    outputs: Sequence[torch.fx.Node],
    *,
    max_dense_experts: int = DEFAULT_MAX_DENSE_EXPERTS,
    max_gathered_expert_bytes: int = DEFAULT_MAX_GATHERED_EXPERT_BYTES,
) -> torch.fx.GraphModule:
    """Trace ``gm`` to an ATen graph with fake tensors; its outputs are the nodes ``outputs`` of ``gm``.

    Fused fast-path kernels are swapped for their plain math first (as the torch.onnx path does), and
    scaled-dot-product attention is decomposed to matmuls and a safe softmax.

    Args:
        gm: Dynamo's graph (not modified).
        example_inputs: Dynamo's real arguments; only their dtypes and shapes are used.
        outputs: The nodes of ``gm`` that become the outputs of the ATen graph, in order.

    Returns:
        The functionalized ATen graph; every node's ``meta["val"]`` holds its fake value.
    """
    import torch
    import torch.fx
    import torch.fx.traceback as fx_traceback
    from torch._decomp import get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    from qnnx_export._decompose import unfuse
    from qnnx_export._functorch import functorch_levels_kept

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        new = graph.node_copy(node, lambda n: env[n])
        unfuse(new, max_dense_experts=max_dense_experts, max_gathered_expert_bytes=max_gathered_expert_bytes)
        env[node] = new
    graph.output(tuple(env[n] for n in outputs))
    lifted = torch.fx.GraphModule(gm, graph)
    decompositions = get_decompositions(
        [
            aten._scaled_dot_product_flash_attention_for_cpu,
            aten._scaled_dot_product_efficient_attention,
            aten._native_batch_norm_legit_no_training,
        ]
    )
    interpreter = torch.fx.Interpreter(lifted)

    def run(*args: Any) -> Any:
        # The interpreter sets each node's meta as the current one, so the ATen nodes keep
        # nn_module_stack (where in the model they come from).
        return interpreter.run(*args)

    # Our own fake mode, outside any Dynamo tracing context: inside a backend call make_fx would
    # otherwise reuse Dynamo's fake mode and add guards to its shape environment.
    # functionalize: in-place ops on intermediates (nn.ReLU(inplace=True)) become their pure forms.
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Real tensors read by get_attr (the constants of the real-pair rewrite: DFT matrices, frame positions) are
    # allowed: make_fx keeps them as constants of the traced graph, which the translator makes initializers.
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True)
    with functorch_levels_kept(), tracing(None), fake_mode, torch.no_grad(), fx_traceback.preserve_node_meta():
        fake_args = [fake_mode.from_tensor(a, static_shapes=True) for a in example_inputs]
        traced = make_fx(
            torch.func.functionalize(run, remove="mutations"),
            decomposition_table=decompositions,  # type: ignore[arg-type]  # torch: get_decompositions' key type is wider
            tracing_mode="real",
        )(*fake_args)
    traced.graph.eliminate_dead_code()
    return traced
