"""Discrete Fourier transforms (``torch.fft.*``, ``torch.stft``) as MatMuls with constant matrices, on real pairs.

Every transform PyTorch offers is linear over the reals in the (real, imaginary) parts of its input: a 1-D
transform of length ``L`` along one axis is the product of that axis (``L`` values, or ``2L`` interleaved parts of
a complex input) with a constant matrix, whose row ``j`` is the transform of the ``j``-th unit input. The matrix is
made here by running PyTorch's own transform (``torch.fft.<op>`` with the same ``n`` and ``norm``) on the unit
inputs in float64, so each of its entries is exact to float32 rounding and carries PyTorch's conventions:
the three norm modes, the half spectrum of ``rfft``/``ihfft``, the zero-padding or cropping to ``n``, and the
parts ``irfft``/``hfft`` ignore (the imaginary parts of the zero and Nyquist frequencies). A transform over several
axes is its 1-D transforms one after the other, in the order PyTorch's reference (``torch._refs.fft``) applies
them. A MatMul against a constant is HTP's natural form, and its float16 error stays a few 1e-4 of the output's
largest magnitude over the lengths allowed here (``MAX_DFT_LENGTH``, measured on the simulator).

``torch.stft`` (``return_complex=True``) is its frames (one Gather of constant positions, the centre padding
included) times the window, then the same MatMul.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

__all__ = [
    "DFT_OPS",
    "MAX_DFT_LENGTH",
    "DftCall",
    "DftStep",
    "dft_matrix",
    "frame_positions",
    "parse_dft",
    "parts_first",
]

MAX_DFT_LENGTH = 2048
"""The longest transform axis (input or output) written as a MatMul. The constant matrix holds up to
``2 L x 2 m`` float32 values (64 MiB at 2048, a complex-to-complex transform); longer transforms keep the graph in
PyTorch. On the simulator (soc 60) a length-n DFT's largest error was 2-4.4e-4 of the output's largest magnitude
for every n from 8 to 2048 (Gaussian, uniform positive and sine inputs)."""

# The 1-D transforms: whether each takes a complex input (a real one is promoted by PyTorch for the c2c pair) and
# whether it returns a complex value.
_ONE_D = {
    "fft_fft": "fft",
    "fft_ifft": "ifft",
    "fft_rfft": "rfft",
    "fft_irfft": "irfft",
    "fft_hfft": "hfft",
    "fft_ihfft": "ihfft",
}
_N_D = {
    "fft_fft2": "fft",
    "fft_fftn": "fft",
    "fft_ifft2": "ifft",
    "fft_ifftn": "ifft",
    "fft_rfft2": "rfft",
    "fft_rfftn": "rfft",
    "fft_irfft2": "irfft",
    "fft_irfftn": "irfft",
    "fft_hfft2": "hfft",
    "fft_hfftn": "hfft",
    "fft_ihfft2": "ihfft",
    "fft_ihfftn": "ihfft",
}
DFT_OPS = frozenset(_ONE_D) | frozenset(_N_D)
"""The Dynamo call names (``torch.fft.fft`` is the builtin ``fft_fft``) of the transforms written as MatMuls."""

_REAL_OUT = ("irfft", "hfft")
_REAL_IN = ("rfft", "ihfft")


@attrs.frozen
class DftStep:
    """One 1-D transform of a multi-axis one: ``torch.fft.<kind>(x, n=n, dim=dim, norm=norm)``.

    Attributes:
        kind: ``fft``, ``ifft``, ``rfft``, ``irfft``, ``hfft`` or ``ihfft``.
        dim: The (non-negative) axis it transforms.
        n: The transform's length (PyTorch's ``n``), or None for the axis' length (or ``2 (L - 1)`` for the
            complex-to-real ones).
        norm: PyTorch's ``norm`` argument.
    """

    kind: str
    dim: int
    n: int | None
    norm: str | None

    @property
    def complex_out(self) -> bool:
        """Whether the step returns a complex value."""
        return self.kind not in _REAL_OUT

    def in_length(self, size: int) -> int:
        """How many positions of an input axis of ``size`` the transform reads (the rest is cropped away)."""
        if self.n is None:
            return size
        need = self.n // 2 + 1 if self.kind in _REAL_OUT else self.n
        return min(size, need)

    def out_length(self, size: int) -> int:
        """The output axis' length for an input axis of ``size``."""
        n = self.n if self.n is not None else (2 * (size - 1) if self.kind in _REAL_OUT else size)
        return n // 2 + 1 if self.kind in _REAL_IN else n


def _norm(norm: Any) -> str | None:
    if norm not in (None, "backward", "ortho", "forward"):
        raise ValueError(f"norm={norm!r}; PyTorch accepts None, 'backward', 'ortho' or 'forward'")
    return norm


def _axis(d: int, rank: int) -> int:
    if not -rank <= d < rank:
        raise ValueError(f"dim {d} is out of range for a tensor of rank {rank}")
    return d + rank if d < 0 else d


@attrs.frozen
class DftCall:
    """A ``torch.fft`` call with its arguments made canonical.

    Attributes:
        name: The call's name (``fft_rfft2``...).
        axes: The (non-negative) axes it transforms, in the call's order.
        sizes: PyTorch's ``n`` (one axis) or ``s`` entries per axis, None where left out or -1.
        norm: PyTorch's ``norm``.
    """

    name: str
    axes: tuple[int, ...]
    sizes: tuple[int | None, ...]
    norm: str | None

    @property
    def kind(self) -> str:
        """The 1-D transform it is made of: ``fft``, ``ifft``, ``rfft``, ``irfft``, ``hfft`` or ``ihfft``."""
        return _ONE_D.get(self.name) or _N_D[self.name]

    def steps(self) -> list[DftStep]:
        """The 1-D transforms that make the call, in the order PyTorch's reference applies them."""
        kind, norm, axes, sizes = self.kind, self.norm, self.axes, self.sizes
        if self.name in _ONE_D or kind in ("fft", "ifft"):
            return [DftStep(kind, d, n, norm) for d, n in zip(axes, sizes, strict=True)]
        last, others = axes[-1], list(zip(axes[:-1], sizes[:-1], strict=True))
        c2c = "fft" if kind in ("fft", "rfft", "hfft") else "ifft"
        if kind in _REAL_IN:  # rfftn, ihfftn: the half spectrum along the last axis first, then the others
            return [DftStep(kind, last, sizes[-1], norm), *(DftStep(c2c, d, n, norm) for d, n in others)]
        # irfftn, hfftn: the full transforms of the other axes, then the complex-to-real one along the last
        return [*(DftStep(c2c, d, n, norm) for d, n in others), DftStep(kind, last, sizes[-1], norm)]

    def block_matrix(self, block: Sequence[int], *, complex_in: bool) -> torch.Tensor:
        """The float32 matrix of the whole call when its axes are the trailing ones, whose sizes are ``block``:
        rows the flattened block (its interleaved parts when ``complex_in``), columns the flattened output (with
        its interleaved parts when complex). Row ``j`` is PyTorch's own call on the ``j``-th unit input, in
        float64, so the conventions of the multi-axis transforms are PyTorch's exactly."""
        import math

        import torch

        fn = getattr(torch.fft, self.name.removeprefix("fft_"))
        # ``block`` is the input's shape from its first transformed axis on; axis 0 of the units counts them.
        dims = [d - min(self.axes) + 1 for d in self.axes]
        count = math.prod(block)
        eye = torch.eye(count, dtype=torch.float64).reshape(count, *block)
        units = [eye] if not complex_in else [eye.to(torch.complex128), eye.to(torch.complex128) * 1j]
        rows = []
        for unit in units:
            if self.name in _ONE_D:
                out = fn(unit, n=self.sizes[0], dim=dims[0], norm=self.norm)
            else:
                s = None if all(v is None for v in self.sizes) else [-1 if v is None else v for v in self.sizes]
                out = fn(unit, s=s, dim=dims, norm=self.norm)
            rows.append(torch.view_as_real(out.resolve_conj()).flatten(1) if out.is_complex() else out.flatten(1))
        return torch.stack(rows, 1).reshape(count * len(units), -1).to(torch.float32).contiguous()


def parse_dft(name: str, rank: int, args: Sequence[Any], kwargs: dict[str, Any]) -> DftCall:
    """The call ``name(x, *args, **kwargs)`` on an input of ``rank``, made canonical.

    Raises:
        ValueError: Arguments PyTorch would refuse, or that are not constants.
    """
    if name in _ONE_D:
        keys = ("n", "dim", "norm")
        values: dict[str, Any] = dict(zip(keys, (None, -1, None), strict=True))
        values.update(zip(keys, args, strict=False))
        values.update({k: v for k, v in kwargs.items() if k in keys})
        n, dim = values["n"], values["dim"]
        if not (n is None or isinstance(n, int)) or not isinstance(dim, int):
            raise ValueError(f"{name} with n={n!r}, dim={dim!r} (constants are needed)")
        return DftCall(name, (_axis(dim, rank),), (n,), _norm(values["norm"]))
    two = name.endswith("2")
    keys = ("s", "dim", "norm")
    values = dict(zip(keys, (None, (-2, -1) if two else None, None), strict=True))
    values.update(zip(keys, args, strict=False))
    values.update({k: v for k, v in kwargs.items() if k in keys})
    s: Any = values["s"]
    dims: Any = values["dim"]
    norm = _norm(values["norm"])
    if isinstance(dims, int):
        dims = (dims,)
    if isinstance(s, int):
        s = (s,)
    if (dims is not None and not all(isinstance(d, int) for d in dims)) or (
        s is not None and not all(isinstance(v, int) for v in s)
    ):
        raise ValueError(f"{name} with s={s!r}, dim={dims!r} (constants are needed)")
    if dims is None:
        axes = list(range(rank - len(s), rank)) if s is not None else list(range(rank))
    else:
        axes = [_axis(d, rank) for d in dims]
    if len(set(axes)) != len(axes) or not axes or (s is not None and len(s) != len(axes)):
        raise ValueError(f"{name} with s={s!r}, dim={dims!r}")
    sizes: list[int | None] = [None if s is None or s[i] == -1 else s[i] for i in range(len(axes))]
    return DftCall(name, tuple(axes), tuple(sizes), norm)


def dft_matrix(step: DftStep, length: int, *, complex_in: bool) -> torch.Tensor:
    """The float32 matrix of ``step`` on an axis of ``length`` (already cropped to :meth:`DftStep.in_length`).

    Rows: the input's positions (``length``), or its interleaved (real, imaginary) parts (``2 length``) when
    ``complex_in``; columns: the output's positions, or its interleaved parts when the step returns a complex value.
    Row ``j`` is PyTorch's own transform of the ``j``-th unit input, in float64.
    """
    import torch

    fn = getattr(torch.fft, step.kind)
    eye = torch.eye(length, dtype=torch.float64)
    units = [eye]
    if complex_in:
        units = [eye.to(torch.complex128), eye.to(torch.complex128) * 1j]
    rows = []
    for unit in units:
        if step.kind in _REAL_IN and unit.is_complex():
            raise ValueError(f"{step.kind} of a complex value")
        out = fn(unit, n=step.n, dim=-1, norm=step.norm)
        rows.append(torch.view_as_real(out.resolve_conj()).flatten(-2) if out.is_complex() else out)
    # [length, parts, columns] -> the interleaved rows (j, part) of the input's real pair.
    return torch.stack(rows, 1).reshape(length * len(units), -1).to(torch.float32).contiguous()


def parts_first(matrix: torch.Tensor, length: int, complex_in: bool, complex_out: bool) -> torch.Tensor:
    """:func:`dft_matrix` with its rows ordered (part, position) and its columns (part, frequency) instead of
    interleaved: the layout of an axis transformed in place (see ``_complex._dft_step``)."""
    rows, cols = (2 if complex_in else 1), (2 if complex_out else 1)
    out = matrix.shape[1] // cols
    return matrix.reshape(length, rows, out, cols).permute(1, 0, 3, 2).reshape(rows * length, cols * out).contiguous()


def frame_positions(length: int, n_fft: int, hop: int, pad: int, mode: str) -> list[list[int]] | None:
    """The signal positions each ``torch.stft`` frame reads, with ``pad`` positions of centre padding in ``mode``
    on both sides folded in; None for ``constant`` padding (zeros are not positions of the signal).

    Raises:
        ValueError: A pad mode PyTorch lacks, or a reflection longer than the signal.
    """
    total = length + 2 * pad
    frames = 1 + (total - n_fft) // hop
    if mode == "constant":
        return None

    def source(i: int) -> int:
        if mode == "reflect":
            if pad >= length:
                raise ValueError(f"reflect padding of {pad} on a signal of {length}")
            return -i if i < 0 else 2 * (length - 1) - i if i >= length else i
        if mode == "replicate":
            return min(max(i, 0), length - 1)
        if mode == "circular":
            return i % length
        raise ValueError(f"pad_mode={mode!r}; accepted: 'constant', 'reflect', 'replicate', 'circular'")

    return [[source(f * hop + k - pad) for k in range(n_fft)] for f in range(frames)]
