"""integer_mod_by_division: an integer Mod written with integer division, exact where HTP's own Mod is not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from export_onnx_builders import make_model, to_bytes, to_ir
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as h

import qnnx_export as qe
from qnnx_export._passes import run_passes

_NP = {TensorProto.INT32: np.int32, TensorProto.INT64: np.int64}
_dim = st.one_of(st.just(1), st.integers(2, 9))
_shapes = st.lists(_dim, min_size=1, max_size=4).map(tuple)


def _mod_model(a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: int, fmod: int, divisor: np.ndarray | None):
    """y = Mod(a, b, fmod): b a graph input, or the constant ``divisor``."""
    out = np.broadcast_shapes(a_shape, b_shape)
    inputs = [("a", dtype, a_shape)] + ([("b", dtype, b_shape)] if divisor is None else [])
    inits = {} if divisor is None else {"b": divisor}
    return make_model([h.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)], inputs, [("y", dtype, out)], inits)


def _operands(rng: np.random.Generator, a_shape, b_shape, np_dtype) -> tuple[np.ndarray, np.ndarray]:
    """Dividends across the int32 range (small ones, ones past float16's exact integers, the extremes) and nonzero
    divisors of both signs up to 2^30 (``r + b`` stays within int32)."""
    a = rng.choice(
        np.concatenate(
            [np.arange(-300, 300), rng.integers(-(2**31), 2**31 - 1, 300), [0, 2047, 2049, -2049, 2**31 - 1, -(2**31)]]
        ).astype(np_dtype),
        size=a_shape,
    )
    b = rng.choice(
        np.concatenate([np.arange(1, 70), -np.arange(1, 70), rng.integers(1, 2**30, 60), -rng.integers(1, 2**30, 60)]),
        size=b_shape,
    ).astype(np_dtype)
    return a, b


@settings(max_examples=40)
@given(
    a_shape=_shapes,
    b_rank=st.integers(0, 4),
    dtype=st.sampled_from([TensorProto.INT32, TensorProto.INT64]),
    constant=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_rewrite_gives_numpys_remainders(a_shape, b_rank, dtype, constant, seed) -> None:
    """For any dividends (int32 extremes included), nonzero divisors of either sign, broadcast or constant, the
    rewritten graph leaves no Mod and gives numpy's ``mod`` (the divisor's sign, as ``%`` in PyTorch) exactly."""
    b_shape = tuple(1 if d == 1 else d for d in a_shape[len(a_shape) - b_rank :]) if b_rank else ()
    rng = np.random.default_rng(seed)
    np_dtype = _NP[dtype]
    a, b = _operands(rng, a_shape, b_shape, np_dtype)
    model = _mod_model(a_shape, b_shape, dtype, 0, b if constant else None)
    m = to_ir(model)
    (changed,) = [c for _, c in run_passes(m, ("integer_mod_by_division",))]
    assert changed and all(n.op_type != "Mod" for n in m.graph)
    feeds = {"a": a} if constant else {"a": a, "b": b}
    (got,) = cpu_session(to_bytes(m)).run(None, feeds)
    want = np.mod(a, b)
    assert got.dtype == np_dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("dtype", "fmod"), [(TensorProto.FLOAT, 1), (TensorProto.INT32, 1), (TensorProto.INT64, 1)])
def test_float_and_truncating_mods_are_left_alone(dtype: int, fmod: int) -> None:
    """A float Mod is not integer arithmetic, and an integer ``fmod=1`` (which the QNN EP leaves to the CPU EP) would
    take the wrong sign from HTP's flooring Div: neither is rewritten."""
    model = _mod_model((4,), (4,), dtype, fmod, None)
    m = to_ir(model)
    assert run_passes(m, ("integer_mod_by_division",)) == [("integer_mod_by_division", False)]


@pytest.mark.parametrize("dtype", [TensorProto.INT32, TensorProto.INT64])
@pytest.mark.parametrize("divisor", [None, 64, 16384, 3, -64])
def test_on_qnn_the_rewrite_is_exact_where_htps_mod_is_not(dtype: int, divisor: int | None) -> None:
    """On the HTP simulator (CPU fallback off): HTP's own Mod of dividends past 2048 is wrong; the rewritten one
    equals numpy's for every pair, with runtime divisors of both signs and with constant ones, powers of two
    included (whose Div floors on HTP where ONNX truncates)."""
    rng = np.random.default_rng(7)
    np_dtype = _NP[dtype]
    a, b = _operands(rng, (4, 512), (4, 512), np_dtype)
    const = None if divisor is None else np.array(divisor, np_dtype)
    model = _mod_model((4, 512), (4, 512) if const is None else (), dtype, 0, const)
    feeds = {"a": a} if const is not None else {"a": a, "b": b}
    want = np.mod(a, b if const is None else const)
    (raw,) = qnn_session(model.SerializeToString()).run(None, feeds)
    assert (raw != want).sum() > 100  # the defect the pass exists for
    m = to_ir(model)
    run_passes(m, ("integer_mod_by_division",))
    (got,) = qnn_session(to_bytes(m)).run(None, feeds)
    np.testing.assert_array_equal(got, want)


class _HashEmbedding(torch.nn.Module):
    """A hash embedding of ids as character models write it: ``(ids + 1) * prime % buckets`` per table."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = torch.nn.ModuleList(torch.nn.Embedding(64, 8) for _ in range(2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        parts = [table((ids + 1) * prime % 64) for table, prime in zip(self.tables, (31, 43))]
        return torch.cat(parts, dim=-1) + torch.remainder(ids, 7).unsqueeze(-1)


def test_a_hash_embedding_of_large_ids_runs_on_qnn_exactly() -> None:
    """Code points up to 70000 hashed with ``%``: the exported graph runs wholly on QNN and gathers the rows eager
    PyTorch gathers (before the rewrite, HTP's Mod picked other rows for most ids past 2048)."""
    model = _HashEmbedding().eval()
    ids = torch.cat(
        [torch.arange(0, 40), torch.randint(2048, 70000, (88,), generator=torch.Generator().manual_seed(3))]
    )
    ids = ids.reshape(4, 32)
    backend = Capture(qnn_session, qe.ExportOptions())
    got = compile_and_run(model, [ids], backend)
    with torch.no_grad():
        want = model(ids)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("divisor", [64, 7, 65521])
def test_a_remainder_keeps_its_dividend_unbounded_by_the_rewrite(divisor: int) -> None:
    """The rewrite's steps stay within the dividend plus the divisor, and the integer-range analysis knows that
    ``a - Div(a, d) * d`` is below the divisor: ``ids % d`` gets a bound only where ``Div(a, d) * d`` could pass
    int32 (d - 1 below its limit), not the half or quarter that interval arithmetic of the four steps would give,
    so large ids still run on the device."""
    from export_capture import capture, only

    g = only(capture(lambda x: x % divisor + 1, torch.arange(8))[0])
    (spec,) = qe.export(g.gm, g.example_inputs, analysis=g.analysis).signature.inputs
    assert spec.max_abs is None or spec.max_abs >= 2**31 - 1 - 2 * divisor
