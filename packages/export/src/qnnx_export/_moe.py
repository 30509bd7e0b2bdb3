"""Static-shape forms of the data-dependent parts of a mixture-of-experts layer (Hugging Face's ``grouped_mm``).

transformers' default experts implementation (``grouped_mm``) sorts the token-expert pairs by expert, counts them
per expert (``histc``), turns the counts into group ends (``cumsum``) and multiplies each group by its expert's
weights with a grouped matrix product whose groups have data-dependent sizes
(``transformers::grouped_mm_fallback`` under torch.compile in float32). No exporter takes the grouped product, and
torch.onnx writes the rest with ops QNN HTP computes in fp16 or declines.
Three local rewrites of the Dynamo graph make the whole layer static-shape and exact on integers:

- the grouped product gets one of two static-shape forms, chosen per product from its row count (tokens times
  experts per token) and its experts' count. *Gathered* (fewer rows than experts, as in a decode step): each row's
  expert weights are gathered by the row's expert and applied with one batched product, one expert product per row
  and ``rows * K * N`` gathered weights, bounded by ``max_gathered_expert_bytes``. *Dense* (otherwise): every row by
  every expert's weights, each row keeping its own expert's product, ``E`` expert products per row, bounded by
  ``max_dense_experts``. Either way a row's expert is the group that holds it (found from the group ends), and a
  row past the last end is zero, as the fallback leaves it;
- ``cumsum(histc(ids.float(), bins, min, max), dtype=<int>)`` of integer ids is counted on the integers (each
  bin holds one integer, which is checked with ``torch.histc`` itself), so no float count is rounded;
- ``x[i // k]`` becomes ``x.repeat_interleave(k, 0)[i]``, the same rows for every index PyTorch accepts, without
  the floor division (whose sign handling QNN declines).

Each rewrite points the FX node at a function of this module; the functions are plain ATen math that both
exporters trace.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch

from qnnx_export._options import DEFAULT_MAX_DENSE_EXPERTS, DEFAULT_MAX_GATHERED_EXPERT_BYTES
from qnnx_export.errors import ExportError

__all__ = [
    "choose_expert_form",
    "counts_cumsum",
    "dense_grouped_mm",
    "gathered_grouped_mm",
    "repeated_rows",
    "rewrite_moe_node",
]

log = logging.getLogger(__name__)

# Integers a float32 holds exactly: histc's bounds beyond them are not rewritten.
_EXACT_FLOAT_INTS = 2**24
# Bins beyond this are not counted one by one (the comparison is rows x bins).
_MAX_BINS = 4096


def _row_experts(offs: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's expert in ``[0, E)`` (the group that holds it, ``offs[e-1] <= s < offs[e]``) and whether the row
    is in a group at all (``s < offs[-1]``; a row past the last end takes expert ``E - 1`` and ``False``)."""
    ends = offs.to(torch.int32)
    positions = torch.arange(rows, dtype=torch.int32, device=offs.device)
    inside = positions < ends[-1]
    if ends.shape[0] == 1:  # no inner ends: comparing with none would be a zero-element tensor (QNN: SIGFPE)
        return torch.zeros(rows, dtype=torch.int32, device=offs.device), inside
    expert = (ends[:-1].unsqueeze(0) <= positions.unsqueeze(1)).to(torch.int32).sum(dim=1)
    return expert, inside


def dense_grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``grouped_mm(input [S, K], weight [E, K, N], offs [E])`` with static shapes, every row by every expert.

    Row ``s`` belongs to group ``e`` when ``offs[e-1] <= s < offs[e]`` and takes ``input[s] @ weight[e]``; rows at or
    past ``offs[-1]`` are zero. Every expert's product is computed and the row's own is selected with ``where``
    (not a multiplication by a 0/1 mask, which would turn another expert's overflow into NaN).
    """
    rows, experts = input.shape[0], weight.shape[0]
    expert, inside = _row_experts(offs, rows)
    expert_ids = torch.arange(experts, dtype=torch.int32, device=input.device)
    own = ((expert.unsqueeze(0) == expert_ids.unsqueeze(1)) & inside.unsqueeze(0)).unsqueeze(-1)  # [E, S, 1]
    products = torch.matmul(input.unsqueeze(0), weight.to(input.dtype))  # [E, S, N]
    zero = torch.zeros((), dtype=products.dtype, device=products.device)
    return torch.where(own, products, zero).sum(dim=0)


def gathered_grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``grouped_mm(input [S, K], weight [E, K, N], offs [E])`` with static shapes, each row by its own expert.

    Each row's expert weights are gathered along the experts' axis (``[E, K, N] -> [S, K, N]``) and applied with
    one batched product (``[S, 1, K] @ [S, K, N]``): ``S`` expert products and ``S * K * N`` gathered weights,
    against ``E * S`` products for :func:`dense_grouped_mm`. Rows at or past ``offs[-1]`` are zero (selected with
    ``where``, so their product, whatever it is, cannot leak in).
    """
    expert, inside = _row_experts(offs, input.shape[0])
    picked = weight.to(input.dtype).index_select(0, expert)  # [S, K, N]
    products = torch.matmul(input.unsqueeze(1), picked).squeeze(1)  # [S, N]
    zero = torch.zeros((), dtype=products.dtype, device=products.device)
    return torch.where(inside.unsqueeze(1), products, zero)


def counts_cumsum(ids: torch.Tensor, low: int, bins: int, dtype: torch.dtype) -> torch.Tensor:
    """``cumsum(histc(ids.float(), bins, low, low + bins - 1), 0, dtype=dtype)`` for integer ``ids``, counted on
    the integers: bin ``b`` holds the ids equal to ``low + b``."""
    # Compared in the ids' own dtype: an int64 id past int32 must not wrap into a bin (on QNN, int64 saturates).
    values = torch.arange(low, low + bins, dtype=ids.dtype, device=ids.device)
    hits = (ids.reshape(-1, 1) == values.unsqueeze(0)).to(torch.int32)
    return torch.cumsum(hits.sum(dim=0), dim=0).to(dtype)


def repeated_rows(x: torch.Tensor, index: torch.Tensor, k: int) -> torch.Tensor:
    """``x[index // k]`` as ``x.repeat_interleave(k, 0)[index]``: row ``i`` of the repeated tensor is row
    ``i // k`` of ``x``, and PyTorch accepts the same indices for both (``[-k * len(x), k * len(x))``)."""
    return x.repeat_interleave(k, dim=0)[index]


def _val(arg: Any) -> Any:
    """The fake or example value FX recorded for ``arg`` (Dynamo: ``example_value``; ATen traces: ``val``)."""
    meta = getattr(arg, "meta", None) or {}
    return meta.get("example_value", meta.get("val"))


def _is_grouped_mm(target: Any) -> bool:
    """transformers' grouped product in float32 (``aten._grouped_mm``, which it calls in bfloat16, takes only
    bfloat16 under Dynamo, a dtype qnnx does not export)."""
    name = getattr(target, "_qualified_op_name", None) or (target.name() if hasattr(target, "name") else None)
    return isinstance(name, str) and name.split(".")[0] == "transformers::grouped_mm_fallback"


def _grouped_mm_args(node: Any) -> tuple[Any, Any, Any] | None:
    """``(input, weight, offs)`` of a grouped product of a 2-D input by 3-D weights with group ends, else None."""
    args = list(node.args)
    offs = node.kwargs.get("offs", args[2] if len(args) > 2 else None)
    if len(args) < 2 or offs is None or node.kwargs.get("bias") is not None:
        return None
    if any(k not in ("offs", "bias", "out_dtype") for k in node.kwargs) or len(args) > 3:
        return None
    a, w, o = _val(args[0]), _val(args[1]), _val(offs)
    if not all(isinstance(v, torch.Tensor) for v in (a, w, o)):
        return None
    if a.dim() != 2 or w.dim() != 3 or o.dim() != 1 or o.shape[0] != w.shape[0] or a.shape[1] != w.shape[1]:
        return None
    if node.kwargs.get("out_dtype") not in (None, a.dtype):
        return None
    return args[0], args[1], offs


def choose_expert_form(rows: int, experts: int, gathered_bytes: int, limits: tuple[int, int]) -> str | None:
    """``"gathered"`` or ``"dense"`` for a grouped product of ``rows`` rows over ``experts`` experts whose gathered
    weights take ``gathered_bytes``, under ``limits = (max_dense_experts, max_gathered_expert_bytes)``; None when
    neither is allowed.

    Gathered when there are fewer rows than experts (it moves fewer weight bytes than the dense form reads, and
    computes ``experts`` times fewer products), dense otherwise; the other form when the preferred one is over its
    limit.
    """
    max_dense, max_gathered = limits
    gathered_ok, dense_ok = gathered_bytes <= max_gathered, experts <= max_dense
    if gathered_ok and (rows < experts or not dense_ok):
        return "gathered"
    return "dense" if dense_ok else None


def _rewrite_grouped_mm(node: Any, limits: tuple[int, int]) -> bool:
    found = _grouped_mm_args(node)
    if found is None:
        return False
    x, w = _val(found[0]), _val(found[1])
    rows, experts, out = int(x.shape[0]), int(w.shape[0]), int(w.shape[2])
    gathered_bytes = rows * int(w.shape[1]) * out * x.element_size()
    form = choose_expert_form(rows, experts, gathered_bytes, limits)
    if form is None:
        raise ExportError(
            f"the grouped expert product (FX node {node.name!r}) of {rows} rows over {experts} experts has no "
            f"static-shape form within the limits: computed densely (every row by every expert: {experts} expert "
            f"products per row instead of 1) it is refused by max_dense_experts={limits[0]}, and its rows' "
            f"gathered expert weights ({gathered_bytes} bytes) by max_gathered_expert_bytes={limits[1]}; raise "
            "either option to accept its cost, or run fewer tokens per call (the gathered weights grow with them)."
        )
    log.info(
        "computing the grouped expert product at %s %s: %d rows x %d experts (%d expert products per row, %d "
        "gathered weight bytes) -> %d outputs each",
        node.name,
        "by gathered experts" if form == "gathered" else "densely",
        rows,
        experts,
        1 if form == "gathered" else experts,
        gathered_bytes if form == "gathered" else 0,
        out,
    )
    node.target = gathered_grouped_mm if form == "gathered" else dense_grouped_mm
    node.args, node.kwargs = found, {}
    return True


def _integer_source(node: Any) -> Any:
    """The integer tensor node that ``node`` converts to float (``ids.float()``, ``ids.to(torch.float32)``), else
    None."""
    if getattr(node, "op", None) not in ("call_method", "call_function") or not node.args:
        return None
    src = node.args[0]
    src_val, val = _val(src), _val(node)
    if not isinstance(src_val, torch.Tensor) or not isinstance(val, torch.Tensor):
        return None
    if src_val.dtype not in (torch.int32, torch.int64) or val.dtype != torch.float32:
        return None
    converts = (node.op == "call_method" and node.target in ("float", "to", "type")) or node.target in (
        torch.ops.aten._to_copy.default,
        torch.ops.prims.convert_element_type.default,
    )
    return src if converts else None


def _histc_of_integers(node: Any) -> tuple[Any, int, int] | None:
    """``(ids, low, bins)`` when ``node`` is ``histc(ids.float(), bins, low, high)`` of integer ids whose bins hold
    one integer each (``high - low == bins - 1 > 0``, checked by ``torch.histc`` on those integers), else None."""
    if getattr(node, "op", None) != "call_function" or node.target not in (torch.histc, torch.ops.aten.histc.default):
        return None
    names = ("input", "bins", "min", "max")
    values = dict(zip(names, node.args, strict=False))
    values.update({k: v for k, v in node.kwargs.items() if k in names})
    if set(node.kwargs) - set(names):
        return None
    bins, low, high = values.get("bins", 100), values.get("min", 0), values.get("max", 0)
    if not all(isinstance(v, int) or (isinstance(v, float) and v.is_integer()) for v in (bins, low, high)):
        return None
    bins, low, high = int(bins), int(low), int(high)
    # One bin (min == max) is left alone: histc then takes its range from the data.
    if not 1 < bins <= _MAX_BINS or high - low != bins - 1 or max(abs(low), abs(high)) >= _EXACT_FLOAT_INTS:
        return None
    source = _integer_source(values.get("input"))
    if source is None:
        return None
    every = torch.arange(low, high + 1, dtype=torch.float32)
    if not torch.equal(torch.histc(every, bins=bins, min=low, max=high), torch.ones(bins)):
        return None
    return source, low, bins


def _rewrite_counts(node: Any) -> bool:
    if getattr(node, "op", None) != "call_function" or node.target not in (
        torch.cumsum,
        torch.ops.aten.cumsum.default,
    ):
        return False
    hist = node.args[0] if node.args else None
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    dtype = node.kwargs.get("dtype", node.args[2] if len(node.args) > 2 else None)
    if dim not in (0, -1) or not isinstance(dtype, torch.dtype) or dtype.is_floating_point or dtype == torch.bool:
        return False
    found = _histc_of_integers(hist)
    if found is None:
        return False
    ids, low, bins = found
    node.target = counts_cumsum
    node.args, node.kwargs = (ids, low, bins, dtype), {}
    return True


def _rewrite_floor_index(node: Any) -> bool:
    if getattr(node, "op", None) != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return False
    x, index = node.args
    if getattr(index, "op", None) != "call_function" or index.target not in (operator.floordiv, torch.floor_divide):
        return False
    if len(index.args) != 2 or index.kwargs:
        return False
    ids, k = index.args
    ids_val, x_val = _val(ids), _val(x)
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        return False
    # int32/int64 only: a uint8 or bool index is a mask, not positions.
    if not isinstance(ids_val, torch.Tensor) or ids_val.dtype not in (torch.int32, torch.int64):
        return False
    if not isinstance(x_val, torch.Tensor) or x_val.dim() == 0:
        return False
    node.target = repeated_rows
    node.args = (x, ids, k)
    return True


def rewrite_moe_node(
    node: Any,
    max_dense_experts: int = DEFAULT_MAX_DENSE_EXPERTS,
    max_gathered_expert_bytes: int = DEFAULT_MAX_GATHERED_EXPERT_BYTES,
) -> bool:
    """Point a copied FX node of a mixture-of-experts layer at its static-shape form; True when it was rewritten.

    Raises:
        ExportError: A grouped expert product is over both limits: more than ``max_dense_experts`` experts and
            more than ``max_gathered_expert_bytes`` of gathered expert weights.
    """
    if node.op != "call_function":
        return False
    if _is_grouped_mm(node.target):
        return _rewrite_grouped_mm(node, (max_dense_experts, max_gathered_expert_bytes))
    return _rewrite_counts(node) or _rewrite_floor_index(node)
