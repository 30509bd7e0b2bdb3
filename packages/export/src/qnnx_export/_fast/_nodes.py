"""Reading the FX nodes of a traced ATen graph: their fake values, shapes and axes."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import Node
    from torch.fx.node import Argument

__all__ = ["fake", "only_first_output_used", "onnx_axis", "out_shape"]


def fake(x: Argument) -> Any:
    """The fake tensor (or Python scalar) that stands for an FX argument."""
    import torch.fx

    if isinstance(x, torch.fx.Node):
        return x.meta.get("val")
    return x


def out_shape(node: Node) -> tuple[int, ...]:
    """The static shape PyTorch computed for ``node``'s (single) output."""
    return tuple(int(s) for s in node.meta["val"].shape)


def onnx_axis(d: int, rank: int) -> int:
    """PyTorch's dimension ``d`` (maybe negative) as a non-negative axis of a tensor of rank ``rank``."""
    return d + rank if d < 0 else d


def only_first_output_used(node: Node) -> bool:
    """Whether the users of a multi-output node (batch norm, max pool with indices) read its first output only."""
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)
