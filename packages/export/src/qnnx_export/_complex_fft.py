"""Fourier transforms (``torch.fft.*``, ``torch.stft``) on real pairs: MatMuls with constant matrices (private)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qnnx_export._complex_core import NoPairRewrite, Rewriter, node_name, source_of
from qnnx_export._dft import (
    MAX_DFT_LENGTH,
    DftStep,
    dft_matrix,
    frame_positions,
    parse_dft,
    parts_first,
)

if TYPE_CHECKING:
    pass

__all__ = ["dft", "stft"]


def _dft_step(r: Rewriter, node: Any, x: Any, is_pair: bool, step: DftStep, shape: list[int]) -> Any:
    """One 1-D transform along ``step.dim`` of the new-graph value ``x`` (a real tensor of ``shape``, or the real
    pair of a complex one) as one 2-D MatMul with a constant matrix. Updates ``shape`` to the output's.

    Along the last axis, the rows of the product are every other position and its columns the axis with the
    parts interleaved, as the pair lays them out. Along another axis the value is seen as ``[before, size, after]``
    (the parts merged into ``after``) and transposed to put the axis last; its columns are then the parts, then the
    positions, and the matrix is ordered the same way. Only rank-3 Transposes: with the pair's rank-4+ Transpose
    before the MatMul and a Reshape to ``[..., m, 2]`` after it, QNN HTP failed to finalize the graph
    (QNN_COMMON_ERROR_MEM_ALLOC, fft2 of a [5, 6, 7] tensor, whatever the matrix's values).
    """
    import math

    import torch

    size = shape[step.dim]
    length = step.in_length(size)
    out = step.out_length(size)
    if max(length, out) > MAX_DFT_LENGTH:
        raise NoPairRewrite(
            f"node {node.name} ({node_name(node)}) transforms {length} positions into {out}; lengths up to "
            f"{MAX_DFT_LENGTH} are written as a MatMul with a constant matrix"
        )
    if length < 1 or out < 1:
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) transforms {length} positions into {out}")
    try:
        matrix = dft_matrix(step, length, complex_in=is_pair)
    except (RuntimeError, ValueError) as exc:  # what PyTorch itself refuses (rfft of a complex value...)
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}): {exc}") from exc
    parts_in, parts_out = (2 if is_pair else 1), (2 if step.complex_out else 1)
    before = shape[: step.dim]
    after = math.prod(shape[step.dim + 1 :])
    shape[step.dim] = out
    final = (*shape, *((2,) if step.complex_out else ()))
    if after == 1 and not is_pair:
        # A real value's last axis (or one followed by size-1 axes only): the output's parts interleaved.
        if length != size:
            x = r.graph.call_method("narrow", (x, step.dim, 0, length))
        rows = r.graph.call_method("reshape", (x, -1, length * parts_in))
        product = r.fn(torch.mm, rows, r.constant(matrix, "dft"))
        return r.graph.call_method("reshape", (product, *final))
    matrix = parts_first(matrix, length, is_pair, step.complex_out)
    lead = math.prod(before)
    x = r.graph.call_method("reshape", (x, lead, size, after * parts_in))
    if length != size:
        x = r.graph.call_method("narrow", (x, 1, 0, length))
    # [lead, length, after * parts] -> [lead * after, parts * length]: rows (before, after), columns (part, position)
    rows = r.graph.call_method("reshape", (r.fn(torch.transpose, x, 1, 2), lead * after, parts_in * length))
    product = r.fn(torch.mm, rows, r.constant(matrix, "dft"))
    # [lead * after, parts * out] -> [lead, after * parts, out] -> [lead, out, after * parts]
    product = r.graph.call_method("reshape", (product, lead, after * parts_out, out))
    return r.graph.call_method("reshape", (r.fn(torch.transpose, product, 1, 2), *final))


def dft(r: Rewriter, node: Any) -> tuple[Any, bool]:
    """A ``torch.fft`` transform as MatMuls with constant matrices (``_dft.py``): one for the whole call when it
    transforms the trailing axes (up to ``MAX_DFT_LENGTH`` positions in and out), else one per axis."""
    import math

    import torch

    source = source_of(node)
    value = r.value(source)
    if value is None or not hasattr(value, "shape"):
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) has no recorded input shape")
    is_pair = r.is_pair(source)
    if str(value.dtype) != ("torch.complex64" if is_pair else "torch.float32"):
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}) of a {value.dtype} tensor (float32, complex64 only)")
    shape = [int(s) for s in value.shape]
    try:
        call = parse_dft(node_name(node), len(shape), node.args[1:], dict(node.kwargs))
    except ValueError as exc:
        raise NoPairRewrite(f"node {node.name} ({node_name(node)}): {exc}") from exc
    out_value = r.value(node)
    out_shape = [int(s) for s in out_value.shape]
    first = min(call.axes)
    block_in, block_out = math.prod(shape[first:]), math.prod(out_shape[first:])
    x = r.new(source)
    if sorted(call.axes) == list(range(first, len(shape))) and max(block_in, block_out) <= MAX_DFT_LENGTH:
        # The whole call is one product: no Transpose at all.
        try:
            matrix = call.block_matrix(shape[first:], complex_in=is_pair)
        except (RuntimeError, ValueError) as exc:  # what PyTorch itself refuses (rfft of a complex value...)
            raise NoPairRewrite(f"node {node.name} ({node_name(node)}): {exc}") from exc
        rows = r.graph.call_method("reshape", (x, -1, matrix.shape[0]))
        product = r.fn(torch.mm, rows, r.constant(matrix, "dft"))
        complex_out = out_value.is_complex()
        return r.graph.call_method("reshape", (product, *out_shape, *((2,) if complex_out else ()))), complex_out
    for step in call.steps():
        x = _dft_step(r, node, x, is_pair, step, shape)
        is_pair = step.complex_out
    return x, is_pair


_STFT_ARGS = (
    "n_fft",
    "hop_length",
    "win_length",
    "window",
    "center",
    "pad_mode",
    "normalized",
    "onesided",
    "return_complex",
)


def stft(r: Rewriter, node: Any) -> tuple[Any, bool]:
    """``torch.stft(..., return_complex=True)`` of a real float32 signal: its frames (centre padding folded into
    one Gather of constant positions) times the window, then one MatMul with the (half) spectrum's matrix."""
    import torch
    import torch.fx

    source = source_of(node)
    value = r.value(source)
    got: dict[str, Any] = dict(zip(_STFT_ARGS, node.args[1:], strict=False))
    got.update({k: v for k, v in node.kwargs.items() if k in _STFT_ARGS})
    n_fft: Any = got.get("n_fft")
    hop: Any = got.get("hop_length") or (n_fft // 4 if isinstance(n_fft, int) else None)
    win_length: Any = got.get("win_length") or n_fft
    window = got.get("window")
    center, pad_mode = got.get("center", True), got.get("pad_mode", "reflect")
    normalized, onesided = got.get("normalized", False), got.get("onesided")
    if (
        value is None
        or r.is_pair(source)
        or str(value.dtype) != "torch.float32"
        or value.dim() not in (1, 2)
        or not all(isinstance(v, int) and v > 0 for v in (n_fft, hop, win_length))
        or not isinstance(center, bool)
        or not isinstance(normalized, bool)
        or (window is not None and not isinstance(window, torch.fx.Node))
        or got.get("return_complex") is not True
    ):
        raise NoPairRewrite(f"node {node.name} (stft) with arguments {got!r} of {getattr(value, 'dtype', '?')}")
    window_value = r.value(window) if window is not None else None
    if window_value is not None and (window_value.is_complex() or str(window_value.dtype) != "torch.float32"):
        raise NoPairRewrite(f"node {node.name} (stft) with a {window_value.dtype} window (float32 only)")
    length = int(value.shape[-1])
    pad = n_fft // 2 if center else 0
    if win_length > n_fft or length + 2 * pad < n_fft:
        raise NoPairRewrite(f"node {node.name} (stft) with win_length {win_length}, n_fft {n_fft}, signal {length}")
    spectrum = DftStep("rfft" if onesided in (None, True) else "fft", 0, None, "ortho" if normalized else "backward")
    if spectrum.out_length(n_fft) > MAX_DFT_LENGTH or n_fft > MAX_DFT_LENGTH:
        raise NoPairRewrite(f"node {node.name} (stft) with n_fft {n_fft} (up to {MAX_DFT_LENGTH})")
    try:
        positions = frame_positions(length, n_fft, hop, pad, pad_mode if center else "constant")
    except ValueError as exc:
        raise NoPairRewrite(f"node {node.name} (stft): {exc}") from exc
    x = r.new(source)
    if positions is None:  # zeros around the signal, then plain frames
        if pad:
            x = r.fn(torch.nn.functional.pad, x, (pad, pad))
        positions = frame_positions(length + 2 * pad, n_fft, hop, 0, "replicate")
    assert positions is not None
    frames = len(positions)
    index = r.constant(torch.tensor([p for frame in positions for p in frame], dtype=torch.int64), "frames")
    x = r.fn(torch.unflatten, r.fn(torch.index_select, x, -1, index), -1, (frames, n_fft))
    left = (n_fft - win_length) // 2
    if window is not None:
        w = r.new(window)
        if win_length != n_fft:
            w = r.fn(torch.nn.functional.pad, w, (left, n_fft - win_length - left))
        x = r.fn(torch.mul, x, w)
    elif win_length != n_fft:
        ones = torch.zeros(n_fft)
        ones[left : left + win_length] = 1.0
        x = r.fn(torch.mul, x, r.constant(ones, "window"))
    shape = [*value.shape[:-1], frames, n_fft]
    step = DftStep(spectrum.kind, len(shape) - 1, None, spectrum.norm)
    x = _dft_step(r, node, x, False, step, shape)
    # [..., frames, freqs, 2] -> PyTorch's [..., freqs, frames, 2]
    return r.fn(torch.transpose, x, -3, -2), True
