"""The memory figures of a compile report: weight bytes as the device holds them, context bytes on disk, weight
copies (no QNN session needed: the figures come from ONNX models and files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from qnnx_backend import _session
from qnnx_backend._parts import held_weight_bytes
from qnnx_backend._report import CompileReport, collecting, record
from qnnx_backend._session import context_bytes, release_memory

_DTYPES = (np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64, np.bool_)


def _model(arrays: list[np.ndarray]) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(a, name=f"w{k}") for k, a in enumerate(arrays)]
    out = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [out], initializer=inits)
    return helper.make_model(graph)


_arrays = st.lists(
    st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=3)).map(
        lambda t: np.zeros(t[1], dtype=t[0])
    ),
    max_size=6,
)


@given(_arrays)
def test_weight_bytes_count_float32_as_float16_on_the_npu_and_every_other_type_at_its_width(
    arrays: list[np.ndarray],
) -> None:
    """On the NPU a float32 weight counts 2 bytes per element, every other type its own width; elsewhere nbytes."""
    model = _model(arrays)
    npu = sum(a.size * 2 if a.dtype == np.float32 else a.nbytes for a in arrays)
    assert held_weight_bytes(model, "npu") == npu
    assert held_weight_bytes(model, "gpu") == sum(a.nbytes for a in arrays)


def test_weight_bytes_count_packed_int4_weights_at_half_a_byte() -> None:
    """Quantized 4-bit weights count at their width, rounded up to whole bytes per tensor."""
    tensor = helper.make_tensor("w", onnx.TensorProto.INT4, [3, 5], [0] * 15)
    model = _model([])
    model.graph.initializer.append(tensor)
    assert held_weight_bytes(model, "npu") == 8


def _context(folder: Path, name: str, binary: str | None, size: int) -> Path:
    attrs = {"embed_mode": 0, "ep_cache_context": binary} if binary is not None else {"embed_mode": 1}
    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", **attrs)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    path = folder / name
    onnx.save(helper.make_model(helper.make_graph([node], "g", [x], [y])), path)
    if binary is not None:
        (folder / binary).write_bytes(b"\0" * size)
    return path


@given(st.lists(st.tuples(st.integers(0, 4096), st.booleans()), min_size=1, max_size=4))
def test_context_bytes_sum_each_context_file_and_each_binary_once(parts: list[tuple[int, bool]]) -> None:
    """The bytes of contexts on disk: every ``_ctx.onnx`` plus the binaries it points at, a shared binary once."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = []
        binaries: dict[str, int] = {}
        for k, (size, shared) in enumerate(parts):
            name = "shared_qnn.bin" if shared else f"part{k}_qnn.bin"
            if shared and name in binaries:
                size = binaries[name]  # the group's one binary keeps its size
            binaries[name] = size
            paths.append(_context(folder, f"part{k}_ctx.onnx", name, size))
        expected = sum(p.stat().st_size for p in paths) + sum(binaries.values())
        assert context_bytes(paths) == expected
        assert context_bytes(paths + paths) == expected


def test_context_bytes_of_an_embedded_context_is_its_file() -> None:
    """An ``embed_mode=1`` context holds its binary inside the file: its size is the file's."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = _context(Path(tmp), "model_ctx.onnx", None, 0)
        assert context_bytes([path]) == path.stat().st_size


def _report(graph_id: int, **fields: object) -> CompileReport:
    base: dict[str, object] = {"device": "npu", "requested_device": "npu", "strict": True, **fields}
    return CompileReport(graph_id=graph_id, **base)  # type: ignore[arg-type]


def test_collecting_receives_the_reports_recorded_inside_its_block_only() -> None:
    """A model's collector gets the reports recorded while it is active, nested collectors both, none after."""
    outer: list[CompileReport] = []
    inner: list[CompileReport] = []
    with collecting(outer):
        record(_report(1))
        with collecting(inner):
            record(_report(2))
    record(_report(3))
    assert [r.graph_id for r in outer] == [1, 2]
    assert [r.graph_id for r in inner] == [2]


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"weight_bytes": 3 * 2**20, "weight_copies": 1}, "3.0 MiB of weights (1 copy)"),
        ({"weight_bytes": 29108, "weight_copies": 1}, "28.4 KiB of weights (1 copy)"),
        (
            {"weight_bytes": 2**20, "weight_copies": 1, "context_bytes": 2 * 2**20},
            "1.0 MiB of weights (1 copy), contexts 2.0 MiB on disk",
        ),
    ],
)
def test_the_summary_names_the_weight_and_context_bytes(fields: dict[str, object], text: str) -> None:
    """The report's one line says the graph's weight bytes, its copies and its contexts' bytes when known."""
    summary = _report(0, is_simulator=True, soc_model=60, **fields).summary()
    assert text in summary, summary
    assert _report(0, is_simulator=True, soc_model=60, **fields).to_dict()["weight_bytes"] == fields["weight_bytes"]


_graph = st.builds(
    lambda device, weights, disk: _report(
        0,
        device=device,
        weight_bytes=weights,
        context_bytes=disk,
        weight_copies=1 if device == "npu" and weights else 0,
    ),
    st.sampled_from(["npu", "eager"]),
    st.one_of(st.none(), st.integers(0, 2**34)),
    st.one_of(st.none(), st.integers(1, 2**34)),
)


@given(st.lists(_graph, max_size=6), st.sampled_from([None, True, False]))
def test_generation_memory_sums_the_graphs_that_hold_weights(graphs: list[CompileReport], sharing: bool | None) -> None:
    """The per-model view: one weight copy per graph on QNN that holds weights, the contexts' bytes summed (None
    when one is unknown), the largest graph's weights as the model's, and the probe's verdict in words."""
    import types

    import qnnx_detection
    from qnnx_backend.hf import generation_memory

    probe = None if sharing is None else qnnx_detection.WeightSharingReport(supported=sharing, reason="why")
    model = types.SimpleNamespace(_qnnx_graphs=list(graphs), _qnnx_weight_sharing=probe)
    memory = generation_memory(model)
    holding = [g for g in graphs if g.device == "npu" and g.weight_bytes]
    assert memory.weight_copies == len(holding)
    assert memory.weight_bytes == (max(g.weight_bytes for g in holding) if holding else None)  # type: ignore[type-var]
    disk = [g.context_bytes for g in holding]
    assert memory.context_bytes == (None if not disk or None in disk else sum(disk))  # type: ignore[arg-type]
    expected = {None: "not probed", True: "supported on this target", False: "not supported on this target (why)"}
    assert memory.weight_sharing.startswith(expected[sharing])
    assert f"{memory.weight_copies} weight cop" in memory.summary() and memory.to_dict()["graphs"] == [
        g.to_dict() for g in graphs
    ]


def _anon_bytes() -> int:
    """The process's anonymous resident memory (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status on this system")


_needs_trim = pytest.mark.skipif(_session._malloc_trim() is None, reason="the C library has no malloc_trim")


@_needs_trim
def test_release_memory_hands_freed_heap_pages_back() -> None:
    """Memory a dropped compiling session freed into the C heap, under a block still alive above it, is resident
    until ``release_memory`` hands its pages back (200 MiB of freed 64 KiB blocks: 0 MiB without it, 117 MiB with it,
    measured)."""
    blocks = [np.ones(64 * 1024, np.uint8) for _ in range(3200)]
    top = blocks.pop()  # alive above the freed blocks: free() alone cannot shrink the heap under it
    del blocks
    before = _anon_bytes()
    release_memory()
    freed = before - _anon_bytes()
    assert freed > 50 * 2**20, f"release_memory freed {freed / 2**20:.0f} MiB of 200 MiB freed blocks"
    assert int(top.sum()) == top.size


@_needs_trim
@given(st.lists(st.tuples(st.integers(1, 256 * 1024), st.booleans()), min_size=1, max_size=40), st.integers(0, 255))
def test_release_memory_leaves_live_memory_as_it_was(blocks: list[tuple[int, bool]], fill: int) -> None:
    """Whatever was allocated and freed around them, the blocks still alive keep every byte after
    ``release_memory`` (it hands back free pages only)."""
    made = [(np.full(size, fill, np.uint8), kept) for size, kept in blocks]
    alive = [a for a, kept in made if kept]
    del made
    release_memory()
    for a in alive:
        assert np.all(a == fill)
