"""Plain-ATen replacements for fused PyTorch fast paths that have no ONNX translation.

Under ``torch.no_grad()``, ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` call fused
kernels (``torch._transformer_encoder_layer_fwd``, ``torch._native_multi_head_attention``). Dynamo
has already recorded those calls when the backend sees the graph, and torch.onnx (torch 2.13) has no
translation for them ("No ONNX function found for aten._transformer_encoder_layer_fwd"). We swap each
call for the math below, which mirrors the non-fused path in torch/nn/modules/transformer.py and
activation.py (batch-first layout, which the fast paths require). A circular pad, whose PyTorch decomposition no
exporter takes either, becomes slices joined by ``cat`` (:func:`circular_pad`).
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from qnnx_export._moe import rewrite_moe_node
from qnnx_export._options import DEFAULT_MAX_DENSE_EXPERTS, DEFAULT_MAX_GATHERED_EXPERT_BYTES

__all__ = ["FUSED_REPLACEMENTS", "circular_pad", "unfuse"]

log = logging.getLogger(__name__)


def _additive_mask(
    mask: torch.Tensor | None, mask_type: int | None, batch: int, heads: int, q_len: int, k_len: int
) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask_type == 1:  # key padding mask [B, S]
        mask = mask.view(batch, 1, 1, k_len)
    elif mask.dim() == 2:  # attention mask [L, S]
        mask = mask.view(1, 1, q_len, k_len)
    else:  # merged mask, [B, H, L, S] or broadcastable
        mask = mask.view(batch, -1, q_len, k_len)
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float32).masked_fill(mask, float("-inf"))
    return mask


class _Projections(NamedTuple):
    """One attention block's sizes and projections, as both fused kernels take them (q, k and v stacked)."""

    embed_dim: int
    num_heads: int
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor
    proj_weight: torch.Tensor
    proj_bias: torch.Tensor


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    p: _Projections,
    mask: torch.Tensor | None,
    mask_type: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias = p
    batch, q_len, _ = query.shape
    k_len = key.shape[1]
    head_dim = embed_dim // num_heads
    # Slices, not chunk(): the ONNX optimizer constant-folds Slice of an initializer but skips
    # multi-output Split (onnxscript 0.7.2), which would leave weight Split/Transpose nodes in the graph.
    e = embed_dim
    w_q, w_k, w_v = qkv_weight[:e], qkv_weight[e : 2 * e], qkv_weight[2 * e :]
    b_q, b_k, b_v = qkv_bias[:e], qkv_bias[e : 2 * e], qkv_bias[2 * e :]
    q = F.linear(query, w_q, b_q).view(batch, q_len, num_heads, head_dim).transpose(1, 2)
    k = F.linear(key, w_k, b_k).view(batch, k_len, num_heads, head_dim).transpose(1, 2)
    v = F.linear(value, w_v, b_v).view(batch, k_len, num_heads, head_dim).transpose(1, 2)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
    additive = _additive_mask(mask, mask_type, batch, num_heads, q_len, k_len)
    if additive is not None:
        scores = scores + additive.to(scores.dtype)
    weights = torch.softmax(scores, dim=-1)
    ctx = torch.matmul(weights, v).transpose(1, 2).reshape(batch, q_len, embed_dim)
    return F.linear(ctx, proj_weight, proj_bias), weights


def transformer_encoder_layer_fwd(
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: torch.Tensor,
    norm_bias_1: torch.Tensor,
    norm_weight_2: torch.Tensor,
    norm_bias_2: torch.Tensor,
    ffn_weight_1: torch.Tensor,
    ffn_bias_1: torch.Tensor,
    ffn_weight_2: torch.Tensor,
    ffn_bias_2: torch.Tensor,
    mask: torch.Tensor | None = None,
    mask_type: int | None = None,
) -> torch.Tensor:
    """Unfused ``torch._transformer_encoder_layer_fwd`` (same signature, batch-first)."""

    projections = _Projections(embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias)

    def self_attention(x: torch.Tensor) -> torch.Tensor:
        return _attention(x, x, x, projections, mask, mask_type)[0]

    def feed_forward(x: torch.Tensor) -> torch.Tensor:
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
        return F.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm1(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    x = src
    if norm_first:
        x = x + self_attention(norm1(x))
        return x + feed_forward(norm2(x))
    x = norm1(x + self_attention(x))
    return norm2(x + feed_forward(x))


def native_multi_head_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused ``torch._native_multi_head_attention`` (same signature, batch-first)."""
    projections = _Projections(embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias)
    out, weights = _attention(query, key, value, projections, mask, mask_type)
    if not need_weights:
        return out, torch.empty(0, dtype=out.dtype)
    if average_attn_weights:
        weights = weights.mean(dim=1)
    return out, weights


def rms_norm(
    input: torch.Tensor,
    normalized_shape: Any,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """``torch.rms_norm`` (``nn.RMSNorm``, ``F.rms_norm``) without in-place ops.

    Its ATen kernel adds ``eps`` with an in-place ``add_`` that functionalization does not see (the composite runs
    below it), so the traced graph kept an ``aten.add_`` no exporter takes. Same math: in float32 for float16 and
    bfloat16 inputs, ``eps`` defaults to that type's machine epsilon."""
    dims = tuple(range(-len(tuple(normalized_shape)), 0))
    acc = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    x = input.to(acc)
    if eps is None:
        eps = torch.finfo(acc).eps
    out = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        out = out * weight
    return out.to(input.dtype)


def linear_cross_entropy_chunked(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: torch.Tensor | None,
    weight: torch.Tensor | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    *_chunking: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``F.linear_cross_entropy``'s batch-chunked custom op (``reduction`` mean or sum) as the reference math it
    chunks: ``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)``.

    The op also returns the gradients it precomputes for its backward; :func:`unfuse` swaps it only where none is
    requested (inference), so those outputs are the op's empty placeholders."""
    logits = F.linear(input, linear_weight, linear_bias)
    loss = F.cross_entropy(
        logits, target, weight=weight, reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing
    )
    empty = torch.empty((0, 0), dtype=input.dtype)
    return loss, empty, empty, torch.empty((0,), dtype=input.dtype)


def linear_cross_entropy_chunked_none(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: torch.Tensor | None,
    weight: torch.Tensor | None,
    ignore_index: int,
    *_chunking: Any,
) -> torch.Tensor:
    """``F.linear_cross_entropy``'s batch-chunked custom op for ``reduction="none"``: the per-sample loss."""
    logits = F.linear(input, linear_weight, linear_bias)
    return F.cross_entropy(logits, target, weight=weight, reduction="none", ignore_index=ignore_index)


def circular_pad(input: torch.Tensor, pad: Any, mode: str = "circular", value: float | None = None) -> torch.Tensor:
    """``F.pad(input, pad, mode="circular")`` as slices joined by ``cat``, one padded axis after another.

    PyTorch decomposes a circular pad into copies into a new empty tensor, which no exporter takes (the translator
    declines the copies, and torch.onnx writes a Pad of mode 'wrap', which the QNN EP declines). The wrapped-around
    elements are slices of the input, so the same tensor is data movement only: exact. Padding the axes in turn
    wraps the corners as PyTorch does. :func:`unfuse` uses it only for pads from 0 to the axis' size."""
    out = input
    for i in range(len(pad) // 2):
        dim = input.dim() - 1 - i
        before, after = int(pad[2 * i]), int(pad[2 * i + 1])
        size = out.shape[dim]
        parts = [out.narrow(dim, size - before, before)] if before else []
        parts.append(out)
        if after:
            parts.append(out.narrow(dim, 0, after))
        out = torch.cat(parts, dim) if len(parts) > 1 else out
    return out


def _is_circular_pad_in_range(node: Any) -> bool:
    """A call of ``torch._C._nn.pad`` (what ``F.pad`` and a circular ``nn.Conv*d`` record) of mode 'circular' whose
    pads are constants from 0 to the size of their axis (PyTorch refuses a pad that wraps more than once; a
    negative one crops), on an input of known shape."""
    if node.op != "call_function" or node.target is not torch._C._nn.pad:
        return False
    args = list(node.args) + [None] * 4
    mode = node.kwargs.get("mode", args[2])
    pad = node.kwargs.get("pad", args[1])
    source = node.kwargs.get("input", args[0])
    value = getattr(source, "meta", {}).get("example_value")
    if mode != "circular" or not isinstance(pad, (list, tuple)) or len(pad) % 2 or value is None:
        return False
    shape = tuple(value.shape)
    if len(shape) - len(pad) // 2 not in (1, 2) or not all(isinstance(p, int) for p in pad):
        return False  # PyTorch pads the axes after a batch axis and a channel axis, or after a channel axis
    return all(0 <= p <= shape[len(shape) - 1 - i // 2] for i, p in enumerate(pad))


def _computes_gradients(node: Any) -> bool:
    """Whether a call of the chunked scalar op asks for any of the gradients it can precompute (its arguments 12 to 14,
    ``compute_input_grad``, ``compute_linear_weight_grad`` and ``compute_linear_bias_grad``, which Dynamo records
    positionally); a call written otherwise counts as asking."""
    flags = node.args[12:15]
    return len(flags) != 3 or any(flags)


def _chunked_cross_entropy_ops() -> dict[Any, Any]:
    namespace = getattr(torch.ops, "torch_nn", None)
    table: dict[Any, Any] = {}
    for name, fn in (
        ("_linear_cross_entropy_batch_chunked", linear_cross_entropy_chunked),
        ("_linear_cross_entropy_batch_chunked_no_reduction", linear_cross_entropy_chunked_none),
    ):
        try:
            op = getattr(namespace, name)
        except (AttributeError, RuntimeError):  # an older torch, or the op's module not yet imported
            continue
        table[op] = fn
        table[op.default] = fn
    return table


def _replacements() -> dict[Any, Any]:
    table: dict[Any, Any] = {torch.rms_norm: rms_norm, torch.nn.functional.rms_norm: rms_norm}
    for name, fn in (
        ("_transformer_encoder_layer_fwd", transformer_encoder_layer_fwd),
        ("_native_multi_head_attention", native_multi_head_attention),
    ):
        target = getattr(torch, name, None)
        if target is not None:
            table[target] = fn
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            table[op] = fn
            table[op.default] = fn
    return table


FUSED_REPLACEMENTS: dict[Any, Any] = _replacements()


def unfuse(
    node: Any,
    *,
    max_dense_experts: int = DEFAULT_MAX_DENSE_EXPERTS,
    max_gathered_expert_bytes: int = DEFAULT_MAX_GATHERED_EXPERT_BYTES,
) -> None:
    """Point a copied FX node that calls a fused fast path (an op no exporter takes) at its decomposition, and a node
    of a mixture-of-experts layer at its static-shape form (see :mod:`qnnx_export._moe`).

    Raises:
        ExportError: A grouped expert product is over both ``max_dense_experts`` and ``max_gathered_expert_bytes``.
    """
    if _is_circular_pad_in_range(node):
        log.debug("writing circular pad at node %s as slices joined by cat", node.name)
        node.target = circular_pad
        return
    if node.op == "call_function" and node.target in FUSED_REPLACEMENTS:
        log.debug("decomposing fused fast path %s at node %s", node.target, node.name)
        node.target = FUSED_REPLACEMENTS[node.target]
        return
    if node.op == "call_function" and getattr(node.target, "namespace", None) == "torch_nn":
        chunked = _chunked_cross_entropy_ops().get(node.target)
        if chunked is linear_cross_entropy_chunked_none or (chunked is not None and not _computes_gradients(node)):
            log.debug(
                "writing chunked linear cross entropy %s at node %s as its reference math", node.target, node.name
            )
            node.target = chunked
            return
    rewrite_moe_node(node, max_dense_experts, max_gathered_expert_bytes)
