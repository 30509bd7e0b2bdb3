"""Hypothesis strategies that the qnnx packages' property tests share.

Only plain-Python values: no strategy here imports torch, numpy or onnx, so every package's tests can use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

SEED_MAX = 2**16
# The QDQ types onnxruntime's QNN quantization tooling writes: activations, and weights (per tensor or per channel).
QDQ_ACTIVATION_TYPES = ("uint8", "uint16")
QDQ_WEIGHT_TYPES = ("uint8", "int8", "uint16", "int16")

JsonScalar = None | bool | int | float | str


def seeds(max_value: int = SEED_MAX) -> st.SearchStrategy[int]:
    """Seeds for a random generator (``torch.manual_seed``, ``numpy.random.default_rng``): 0 to ``max_value``."""
    return st.integers(0, max_value)


def shapes(
    *, min_rank: int = 0, max_rank: int = 3, min_side: int = 1, max_side: int = 4
) -> st.SearchStrategy[list[int]]:
    """Tensor shapes as lists of sizes: ``min_rank`` to ``max_rank`` dimensions of ``min_side`` to ``max_side``."""
    return st.lists(st.integers(min_side, max_side), min_size=min_rank, max_size=max_rank)


def json_scalars(
    *, max_int: int | None = 2**53, max_text: int = 12, floats: bool = False
) -> st.SearchStrategy[JsonScalar]:
    """JSON leaves: None, booleans, integers in ``[-max_int, max_int]`` (unbounded if None), short text and, with
    ``floats``, finite or infinite floats (never NaN, which equals nothing)."""
    integers = st.integers() if max_int is None else st.integers(-max_int, max_int)
    leaves: list[st.SearchStrategy[Any]] = [st.none(), st.booleans(), integers, st.text(max_size=max_text)]
    if floats:
        leaves.append(st.floats(allow_nan=False))
    return st.one_of(leaves)


def json_values(
    scalars: st.SearchStrategy[Any] | None = None, *, max_size: int = 4, max_key: int = 8, max_leaves: int = 12
) -> st.SearchStrategy[Any]:
    """Nested JSON values: ``scalars`` (default ``json_scalars()``) in lists and string-keyed objects of at most
    ``max_size`` items, keys of at most ``max_key`` characters, at most ``max_leaves`` leaves in all."""
    return st.recursive(
        json_scalars() if scalars is None else scalars,
        lambda inner: (
            st.lists(inner, max_size=max_size) | st.dictionaries(st.text(max_size=max_key), inner, max_size=max_size)
        ),
        max_leaves=max_leaves,
    )


def key_materials(
    values: st.SearchStrategy[Any] | None = None, *, min_size: int = 1, max_size: int = 8, max_key: int = 8
) -> st.SearchStrategy[dict[str, Any]]:
    """Flat key material, as a cache hashes it: non-empty names (at most ``max_key`` characters) to ``values``
    (default ``json_scalars()``)."""
    return st.dictionaries(
        st.text(min_size=1, max_size=max_key),
        json_scalars() if values is None else values,
        min_size=min_size,
        max_size=max_size,
    )


def flipped_bytes(payload: bytes | bytearray, *, start: int = 0, stop: int | None = None) -> st.SearchStrategy[bytes]:
    """``payload`` with one byte in ``[start, stop)`` (default: anywhere) XORed with a non-zero mask."""
    end = len(payload) if stop is None else stop
    if not 0 <= start < end <= len(payload):
        raise ValueError(f"no byte to flip in [{start}, {end}) of a {len(payload)}-byte payload")
    original = bytes(payload)

    def flip(at: int, mask: int) -> bytes:
        changed = bytearray(original)
        changed[at] ^= mask
        return bytes(changed)

    return st.builds(flip, st.integers(start, end - 1), st.integers(1, 255))


def truncations(payload: bytes | bytearray) -> st.SearchStrategy[bytes]:
    """Every strict prefix of ``payload``, the empty one included."""
    if not payload:
        raise ValueError("an empty payload has no strict prefix")
    original = bytes(payload)
    return st.integers(0, len(original) - 1).map(lambda n: original[:n])


def qdq_settings(
    activations: Sequence[str] = QDQ_ACTIVATION_TYPES, weights: Sequence[str] = QDQ_WEIGHT_TYPES
) -> dict[str, st.SearchStrategy[Any]]:
    """How a graph is quantized, as keyword strategies for ``@given(**qdq_settings())``: ``activation`` and
    ``weight`` type names, and ``per_channel`` weights or not."""
    return {
        "activation": st.sampled_from(tuple(activations)),
        "weight": st.sampled_from(tuple(weights)),
        "per_channel": st.booleans(),
    }


PoolWindow = tuple[list[int], dict[str, list[int]]]


@st.composite
def _pool_window(
    draw: st.DrawFn,
    max_spatial: int,
    max_kernel: int,
    max_stride: int,
    max_side: int,
    max_batch: int,
    max_channels: int,
) -> PoolWindow:
    spatial = draw(st.integers(1, max_spatial), label="spatial axes")
    kernel = draw(st.lists(st.integers(1, max_kernel), min_size=spatial, max_size=spatial), label="kernel_shape")
    strides = draw(st.lists(st.integers(1, max_stride), min_size=spatial, max_size=spatial), label="strides")
    pads = [draw(st.integers(0, k - 1), label="pad") for k in kernel * 2]
    sides = [
        draw(st.integers(max(1, k - begin - end), max(max_side, k - begin - end)), label="side")
        for k, begin, end in zip(kernel, pads[:spatial], pads[spatial:], strict=True)
    ]
    shape = [draw(st.integers(1, max_batch), label="batch"), draw(st.integers(1, max_channels), label="channels")]
    return [*shape, *sides], {"kernel_shape": kernel, "strides": strides, "pads": pads}


def pool_windows(
    *,
    max_spatial: int = 3,
    max_kernel: int = 4,
    max_stride: int = 3,
    max_side: int = 7,
    max_batch: int = 2,
    max_channels: int = 3,
) -> st.SearchStrategy[PoolWindow]:
    """The windows of a valid ONNX pool (AveragePool, MaxPool) over ``[batch, channels, *sides]``: ``(shape,
    {"kernel_shape", "strides", "pads"})`` with 1 to ``max_spatial`` spatial axes, every pad below its kernel and
    every padded side at least the kernel, as ONNX Runtime requires (sides of up to ``max_side``, or of what the
    kernel needs when that is more)."""
    return _pool_window(max_spatial, max_kernel, max_stride, max_side, max_batch, max_channels)
