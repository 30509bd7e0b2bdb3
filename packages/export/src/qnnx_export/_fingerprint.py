"""A cheap, process-independent fingerprint of (graph, inputs, weights, options)."""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib.metadata
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from qnnx_export._analysis import GraphAnalysis, analyze
from qnnx_export._options import ExportOptions

if TYPE_CHECKING:
    import torch

__all__ = ["fingerprint", "tensor_digest", "weight_digest"]

# Bump when the export pipeline changes in a way that changes the ONNX for the same inputs and the
# package version does not move (e.g. during development).
_FINGERPRINT_SCHEMA = "1"


def _update_tensor(h: Any, t: torch.Tensor) -> None:
    import torch

    t = t.detach()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel() == 0:
        return
    flat = t.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    # Hash the raw bytes through a uint8 view: works for every dense dtype (bf16/fp8 have no numpy dtype).
    # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12; arrays are buffers on every version.
    h.update(memoryview(flat.view(torch.uint8).numpy()))  # type: ignore[arg-type,unused-ignore]


def tensor_digest(t: torch.Tensor) -> str:
    """Return the sha256 hex digest of a tensor's dtype, shape and bytes."""
    h = hashlib.sha256()
    _update_tensor(h, t)
    return h.hexdigest()


def weight_digest(example_inputs: Sequence[Any], analysis: GraphAnalysis) -> str:
    """Return the sha256 hex digest of the frozen parameter/buffer bytes, in argument order.

    Memoized on ``analysis`` and on which tensors these are (storage, dtype, version), so fingerprint + export
    hash the weights once, and an export from other tensors (the float16 copies of an fp16 export) gets their own
    digest.
    """
    import torch

    memo = analysis._memo
    which = tuple(
        (t.data_ptr(), t.dtype, t._version) if isinstance(t, torch.Tensor) else (id(t),)
        for t in (example_inputs[i] for i in analysis.param_indices)
    )
    key = ("weight_digest", which)
    cached = memo.get(key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    for i in analysis.param_indices:
        h.update(f"#{i}|".encode())
        _update_tensor(h, example_inputs[i])
    digest = h.hexdigest()
    memo[key] = digest
    return digest


def _qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        # OpOverload / OpOverloadPacket and other callables without a qualname.
        return f"{type(obj).__module__}.{type(obj).__qualname__}:{obj}"
    return f"{module}.{name}"


def _canon(value: Any, index: dict[Any, int], gm: Any) -> str:
    """Canonical text of an FX argument: no memory addresses, ids or object reprs."""
    import torch
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return f"%{index[value]}"
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return "float(nan)" if math.isnan(value) else f"float({value.hex()})"
    if isinstance(value, (list, tuple)):
        inner = ",".join(_canon(v, index, gm) for v in value)
        return f"{type(value).__name__}[{inner}]"
    if isinstance(value, dict):
        items = ",".join(f"{_canon(k, index, gm)}:{_canon(v, index, gm)}" for k, v in sorted(value.items(), key=str))
        return f"dict{{{items}}}"
    if isinstance(value, slice):
        return (
            f"slice({_canon(value.start, index, gm)},{_canon(value.stop, index, gm)},{_canon(value.step, index, gm)})"
        )
    if value is Ellipsis:
        return "..."
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return f"torch:{value}"
    if isinstance(value, torch.Tensor):
        return f"tensor:{tensor_digest(value)}"
    if isinstance(value, enum.Enum):
        return f"{_qualname(type(value))}.{value.name}"
    if isinstance(value, torch.Size):
        return f"size{tuple(value)}"
    if callable(value):
        return _qualname(value)
    # Last resort: the type and repr, which for user objects may contain an address; that only costs
    # a cache miss, never a wrong hit.
    return f"{_qualname(type(value))}:{value!r}"


def _graph_text(gm: torch.fx.GraphModule) -> str:
    import torch

    index: dict[Any, int] = {}
    lines: list[str] = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "placeholder":
            target = "placeholder"
        elif node.op in ("call_method",):
            target = str(node.target)
        elif node.op == "get_attr":
            attr = gm
            for part in str(node.target).split("."):
                attr = getattr(attr, part)
            digest = tensor_digest(attr) if isinstance(attr, torch.Tensor) else _qualname(type(attr))
            target = f"{node.target}={digest}"
        elif node.op == "call_module":
            mod = gm.get_submodule(str(node.target))
            state = ",".join(f"{k}={tensor_digest(v)}" for k, v in sorted(mod.state_dict().items()))
            target = f"{_qualname(type(mod))}({mod.extra_repr()}|training={mod.training}|{state})"
        else:
            target = _canon(node.target, index, gm)
        args = _canon(node.args, index, gm)
        kwargs = _canon(dict(node.kwargs), index, gm)
        lines.append(f"{node.op}|{target}|{args}|{kwargs}")
    return "\n".join(lines)


def _inputs_text(example_inputs: Sequence[Any], analysis: GraphAnalysis) -> str:
    import torch

    parts: list[str] = []
    for i in analysis.user_indices:
        v = example_inputs[i]
        if isinstance(v, torch.Tensor):
            parts.append(f"{i}:{v.dtype}:{tuple(v.shape)}:{v.device.type}")
        else:
            parts.append(f"{i}:{type(v).__name__}:{v!r}")
    parts.append("params:" + ",".join(str(i) for i in analysis.param_indices))
    return ";".join(parts)


@functools.cache
def _dist_version(dist: str) -> str:
    """Installed version of a distribution, read from metadata (importing onnxscript is slow)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def fingerprint(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    analysis: GraphAnalysis | None = None,
    *,
    options: ExportOptions | None = None,
) -> str:
    """Return a hex sha256 that identifies the ONNX model :func:`export` would produce.

    Covers the canonical graph (ops, targets, args, constants; never memory addresses), the user
    input specs (shape, dtype, device), the frozen weight bytes, the torch, onnx, onnxscript, onnx-ir
    and qnnx-export versions and the export options. Runs no export; the weight hash is the main cost
    (about 1-2 GB/s) and is memoized on ``analysis``.

    Args:
        gm: The Dynamo graph (not modified).
        example_inputs: The real example arguments (parameters included).
        analysis: The result of :func:`analyze` for the same graph, to avoid redoing it.
        options: The options the export will use (default :class:`ExportOptions`).

    Returns:
        64 lowercase hex characters.
    """
    import torch

    from qnnx_export._version import __version__

    analysis = analysis if analysis is not None else analyze(gm, example_inputs)
    options = options if options is not None else ExportOptions()
    h = hashlib.sha256()
    for part in (
        f"qnnx-export-fingerprint/{_FINGERPRINT_SCHEMA}",
        f"qnnx_export={__version__}",
        f"torch={torch.__version__}",
        f"onnx={_dist_version('onnx')}",
        f"onnxscript={_dist_version('onnxscript')}",
        f"onnx-ir={_dist_version('onnx-ir')}",
        f"opset={options.opset}",
        f"passes={','.join(options.resolved_passes())}",
        f"external_data_threshold={options.external_data_threshold}",
        _graph_text(gm),
        _inputs_text(example_inputs, analysis),
        f"weights={weight_digest(example_inputs, analysis)}",
    ):
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()
