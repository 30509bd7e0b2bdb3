"""Integer inputs and results of rank 5 or more that the graph only reshapes cross the graph boundary with their
leading dims merged (``InputSpec.onnx_shape``, ``OutputSlot.shape``): HTP holds no integer tensor of rank 5. The
caller sees the same tensors; the ONNX model holds none of rank 5."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from export_capture import capture, only
from export_qnn_helpers import Capture, compile_and_run, cpu_session, qnn_session
from hypothesis import given, settings
from hypothesis import strategies as st

import qnnx_export as qe

FAST = qe.ExportOptions(exporter="fast")


@pytest.fixture(autouse=True)
def _no_grad() -> Iterator[None]:
    """Inference mode, as the backend sees it."""
    with torch.no_grad():
        yield


def _boundary_ranks(exported: qe.ExportedGraph) -> list[int]:
    """The rank of every input and output of the ONNX model."""
    graph = exported.model.graph
    return [len(v.type.tensor_type.shape.dim) for v in (*graph.input, *graph.output)]


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 3), min_size=5, max_size=6),
    dtype=st.sampled_from([torch.int64, torch.int32, torch.bool]),
    seed=st.integers(0, 2**16),
)
def test_integer_tensors_of_rank_5_cross_the_boundary_as_views(shape: list[int], dtype: torch.dtype, seed: int) -> None:
    """An integer or bool argument of rank 5-6 that the graph reshapes, and a result it reshapes to rank 5-6 last:
    the model's inputs and outputs are of rank 4 at most, the signature names the views (and survives its dict
    form), and the caller gets eager's tensors exactly on the CPU EP."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 5, shape, generator=g).to(dtype)
    n = math.prod(shape)

    def fn(i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = i.reshape(n).to(torch.int32) * 3
        return flat.reshape(shape[::-1]).to(dtype), flat.sum()

    ref = fn(x)
    cap = only(capture(fn, x)[0])
    exported = qe.export(cap.gm, cap.example_inputs, options=FAST)
    assert max(_boundary_ranks(exported)) <= 4
    sig = exported.signature
    assert sig.inputs[0].onnx_shape is not None and math.prod(sig.inputs[0].onnx_shape) == n
    assert sig.outputs[0].shape == tuple(shape[::-1])
    assert qe.GraphSignature.from_dict(sig.to_dict()) == sig
    backend = Capture(cpu_session, FAST)
    got = compile_and_run(fn, (x,), backend)  # type: ignore[arg-type]  # a function of one tensor
    for out, want in zip(got, ref, strict=True):
        assert out.dtype == want.dtype and torch.equal(out, want)


def test_a_rank_5_integer_tensor_used_otherwise_is_left() -> None:
    """An integer argument of rank 5 that an elementwise op reads keeps its shape (a view would change what the op
    computes on): no input view, and a float argument of rank 5 is never viewed."""
    i, x = torch.randint(0, 9, (2, 1, 2, 3, 2)), torch.randn(2, 1, 2, 3, 2)
    cap = only(capture(lambda i, x: (i + 1, x.reshape(-1)), i, x)[0])
    sig = qe.export(cap.gm, cap.example_inputs, options=FAST).signature
    assert [s.onnx_shape for s in sig.inputs] == [None, None]


def test_a_segnet_3d_stage_across_two_graphs_runs_wholly_on_the_htp_simulator() -> None:
    """A 3-D encoder stage (convolution, ReLU, max pool with indices) and a decoder stage (unpooling with those
    indices, convolution), the indices passed between two compiled graphs as a batched rank-5 int64 tensor: each
    graph wholly on QNN (no CPU fallback), the indices eager's on the encoder's own float16 features, and the
    decoder within float16's rounding of eager."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 4, 6, 6)
    down, up = torch.nn.Conv3d(4, 4, 3, padding=1).eval(), torch.nn.Conv3d(4, 3, 3, padding=1).eval()

    def encode(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = down(v).relu()
        return (*torch.nn.functional.max_pool3d(features, 2, return_indices=True), features)

    def decode(v: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return up(torch.nn.functional.max_unpool3d(v, i, 2, output_size=x.shape[-3:])).relu()

    encoder, decoder = Capture(qnn_session, FAST), Capture(qnn_session, FAST)
    values, indices, features = compile_and_run(encode, (x,), encoder)  # type: ignore[arg-type]  # one tensor
    ref_values, ref_indices, _ = encode(x)
    # The indices of the features HTP computed: a pool of them in eager (first maximum of each window).
    assert indices.shape == ref_indices.shape
    assert torch.equal(indices, torch.nn.functional.max_pool3d(features, 2, return_indices=True)[1])
    assert float((values - ref_values).abs().max()) <= 5e-3 * float(ref_values.abs().max())
    out = compile_and_run(decode, (ref_values, ref_indices), decoder)  # type: ignore[arg-type]  # two tensors
    ref = decode(ref_values, ref_indices)
    assert out.shape == ref.shape and float((out - ref).abs().max()) <= 5e-3 * float(ref.abs().max())
    assert encoder.exported[0].signature.outputs[1].shape == tuple(ref_indices.shape)
    assert [s.onnx_shape for s in decoder.exported[0].signature.inputs if s.dtype == "int64"] == [(8, 2, 3, 3)]
