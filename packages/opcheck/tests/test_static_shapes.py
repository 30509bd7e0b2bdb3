"""Static shapes for files with symbolic input dims: ``--dim NAME=N`` / ``--shape INPUT=...`` on the command line,
``free_dims`` / ``input_shapes`` in ``check_model``, shape inference through the graph, and the errors for bad sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from opcheck_graphs import inp, model, node

import qnnx_opcheck as oc
from qnnx_opcheck import errors
from qnnx_opcheck._shapes import apply_static_shapes, parse_dim, parse_shape

torch = pytest.importorskip("torch")


class _Net(torch.nn.Module):
    """Conv -> Relu -> nearest 2x upsample -> flatten by a computed shape: a Resize and a Reshape whose targets come
    from the input's symbolic dims."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.interpolate(torch.relu(self.conv(x)), scale_factor=2.0, mode="nearest")
        return y.reshape(y.shape[0], -1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The net exported by torch.onnx (dynamo) with symbolic 'batch' and 'height' dims on input 'images'."""
    path = tmp_path_factory.mktemp("symbolic") / "net.onnx"
    batch, height = torch.export.Dim("batch", max=64), torch.export.Dim("height", min=2, max=1024)
    torch.manual_seed(0)
    program = torch.onnx.export(
        _Net().eval(),
        (torch.randn(1, 3, 16, 16),),
        dynamo=True,
        verbose=False,
        input_names=["images"],
        dynamic_shapes={"x": {0: batch, 2: height}},
    )
    assert program is not None
    program.save(str(path))
    dims = [d.dim_param or d.dim_value for d in onnx.load(path).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", 16]  # the file is what the test means it to be
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qnnx_opcheck", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_without_sizes_every_runtime_node_is_refused_and_told_the_flags(exported: Path) -> None:
    """With symbolic dims, the reason of each refused node names the --dim flags that fix it."""
    rep = oc.check_model(exported, onnxruntime_qnn="2.7.0", soc_model=60)
    refused = [v for v in rep.verdicts if v.status == "unsupported"]
    assert {v.op_type for v in refused} >= {"Conv", "Relu", "Resize", "Reshape"}
    for v in refused:
        assert "--dim batch=N" in (v.reason or "") and "--dim height=N" in (v.reason or ""), v.reason
    assert not any("add_free_dimension_override_by_name" in n for n in rep.notes)


def test_free_dims_make_the_exported_file_static_and_supported(exported: Path) -> None:
    """free_dims fixes the named dims; shape inference makes Reshape/Resize static; every node is supported."""
    rep = oc.check_model(exported, onnxruntime_qnn="2.7.0", soc_model=60, free_dims={"batch": 1, "height": 32})
    assert rep.supported, rep.summary()
    by_op = {v.op_type: v for v in rep.verdicts}
    assert by_op["Shape"].kind == "constant_folded"  # the shape computation is static now
    assert by_op["Reshape"].kind == "supported"
    assert any("batch=1" in n and "height=32" in n for n in rep.notes)


def test_input_shapes_give_the_same_verdicts_as_free_dims(exported: Path) -> None:
    """--shape images=1,3,32,16 fixes the same named dims as --dim batch=1 --dim height=32."""
    a = oc.check_model(exported, onnxruntime_qnn="2.7.0", input_shapes={"images": (1, 3, 32, 16)})
    b = oc.check_model(exported, onnxruntime_qnn="2.7.0", free_dims={"batch": 1, "height": 32})
    assert [(v.node_name, v.status, v.kind) for v in a.verdicts] == [
        (v.node_name, v.status, v.kind) for v in b.verdicts
    ]


def test_a_dim_left_symbolic_is_named_in_the_fix(exported: Path) -> None:
    """Fixing only batch leaves the nodes symbolic in height, and their reason names --dim height=N only."""
    rep = oc.check_model(exported, onnxruntime_qnn="2.7.0", free_dims={"batch": 1})
    conv = next(v for v in rep.verdicts if v.op_type == "Conv")
    assert conv.status == "unsupported"
    assert "--dim height=N" in (conv.reason or "") and "--dim batch" not in (conv.reason or "")
    assert any("still symbolic" in n for n in rep.notes)


def test_a_callers_model_is_not_changed(exported: Path) -> None:
    """check_model works on a copy of a given ModelProto."""
    proto = onnx.load(exported)
    before = proto.SerializeToString()
    oc.check_model(proto, onnxruntime_qnn="2.7.0", free_dims={"batch": 1, "height": 8})
    assert proto.SerializeToString() == before


def test_cli_flags_give_a_supported_verdict(exported: Path) -> None:
    """qnnx-opcheck FILE --dim batch=1 --dim height=32 exits 0; --shape does the same."""
    r = _run(str(exported), "--onnxruntime-qnn", "2.7.0", "--dim", "batch=1", "--dim", "height=32")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fixed free dimensions: batch=1, height=32" in r.stdout
    r = _run(str(exported), "--onnxruntime-qnn", "2.7.0", "--shape", "images=2,3,8,16")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _run(str(exported), "--onnxruntime-qnn", "2.7.0").returncode == 1


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--dim", "bach=1"], "'bach'"),
        (["--dim", "batch=0"], "'batch=0'"),
        (["--dim", "batch"], "'batch'"),
        (["--shape", "images=1,3,32"], "images=1,3,32"),
        (["--shape", "images=1,4,32,16"], "images=1,4,32,16"),
        (["--shape", "img=1,3,32,16"], "'img'"),
        (["--shape", "images=1,3,x,16"], "'images=1,3,x,16'"),
        (["--dim", "batch=2", "--shape", "images=1,3,8,16"], "images=1,3,8,16"),
    ],
)
def test_bad_sizes_exit_2_with_one_error_line(exported: Path, args: list[str], named: str) -> None:
    """A malformed size, an unknown name or a contradiction exits 2: one error line naming the value and what is
    accepted, then a fix line; with --json, the error document."""
    r = _run(str(exported), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("qnnx-opcheck:")]
    assert (
        len(lines) == 2 and lines[0].startswith("qnnx-opcheck: error: ") and lines[1].startswith("qnnx-opcheck: fix:")
    )
    assert named in lines[0] and "accepted" in lines[0]
    j = _run(str(exported), *args, "--json")
    assert '"InvalidShapeError"' in j.stdout and '"exit_code": 2' in j.stdout


def _two_inputs() -> onnx.ModelProto:
    return model(
        [node("Add", ["a", "b"], ["y"])],
        [inp("a", ["batch", "seq"]), inp("b", ["batch", "seq"])],
        ["y"],
    )


def test_api_errors_are_value_errors_naming_the_accepted_names() -> None:
    """check_model raises InvalidShapeError (a ValueError) naming the model's dim names and inputs."""
    with pytest.raises(errors.InvalidShapeError, match="accepted names: batch, seq"):
        oc.check_model(_two_inputs(), free_dims={"time": 4})
    with pytest.raises(ValueError, match="accepted: a positive integer"):
        oc.check_model(_two_inputs(), free_dims={"batch": True})
    with pytest.raises(errors.InvalidShapeError, match="sets to 2"):
        oc.check_model(_two_inputs(), free_dims={"batch": 2}, input_shapes={"b": (3, 4)})


def test_a_shape_fixes_its_named_dims_on_every_input() -> None:
    """A dim name stands for one size: --shape a=2,5 fixes b (batch, seq) too, and the Add is supported."""
    rep = oc.check_model(_two_inputs(), onnxruntime_qnn="2.7.0", input_shapes={"a": (2, 5)})
    assert rep.supported, rep.summary()


# --- properties -------------------------------------------------------------------------------------------------

_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:]{0,12}", fullmatch=True)
_sizes = st.integers(min_value=1, max_value=4096)


@given(_names, _sizes)
def test_parse_dim_reads_what_is_written(name: str, size: int) -> None:
    """NAME=N parses back to (NAME, N), spaces around the parts allowed."""
    assert parse_dim(f"{name}={size}") == (name, size)
    assert parse_dim(f" {name} = {size} ") == (name, size)


@given(_names, st.lists(_sizes, min_size=1, max_size=6))
def test_parse_shape_reads_what_is_written(name: str, dims: list[int]) -> None:
    """INPUT=D0,D1,... parses back to (INPUT, dims)."""
    assert parse_shape(f"{name}={','.join(map(str, dims))}") == (name, tuple(dims))


@given(st.text(max_size=20))
def test_the_parsers_raise_only_their_error(text: str) -> None:
    """Any text either parses to positive sizes or raises InvalidShapeError; never another exception."""
    for parse in (parse_dim, parse_shape):
        message = ""
        try:
            _, value = parse(text)
        except errors.InvalidShapeError as exc:
            message = str(exc)
        if message:
            assert "accepted" in message and "Fix:" in message
        else:
            sizes = value if isinstance(value, tuple) else (value,)
            assert all(isinstance(d, int) and d >= 1 for d in sizes)


_dim = st.one_of(st.sampled_from(["batch", "seq", "h"]), st.integers(min_value=1, max_value=9))


@given(st.lists(st.lists(_dim, min_size=1, max_size=4), min_size=1, max_size=3), st.data())
def test_applied_sizes_replace_exactly_the_named_dims(shapes: list[list[int | str]], data: st.DataObject) -> None:
    """After apply_static_shapes, every named dim that was given is its size on every input, fixed dims are
    unchanged, and names not given stay symbolic."""
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s) for i, s in enumerate(shapes)]
    m = helper.make_model(helper.make_graph([], "g", inputs, []), opset_imports=[helper.make_opsetid("", 21)])
    names = sorted({d for s in shapes for d in s if isinstance(d, str)})
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]))
    sizes = {n: data.draw(_sizes) for n in chosen}
    apply_static_shapes(m, sizes, None)
    for vi, before in zip(m.graph.input, shapes, strict=True):
        after = [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        assert after == [sizes.get(d, d) if isinstance(d, str) else d for d in before]


@given(st.lists(_dim, min_size=1, max_size=4), st.lists(_sizes, min_size=1, max_size=4))
def test_a_shape_is_accepted_exactly_when_it_fits_the_input(dims: list[int | str], shape: list[int]) -> None:
    """A --shape is applied when its rank and fixed dims agree with the input (and a repeated name gets one size);
    otherwise it raises InvalidShapeError and the model is unchanged."""
    m = helper.make_model(
        helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)], []),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    before = m.SerializeToString()
    named: dict[str, int] = {}
    fits = len(dims) == len(shape)
    for have, want in zip(dims, shape, strict=False):
        if isinstance(have, int):
            fits &= have == want
        else:
            fits &= named.setdefault(have, want) == want
    if fits:
        apply_static_shapes(m, None, {"x": shape})
        assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == shape
    else:
        with pytest.raises(errors.InvalidShapeError):
            apply_static_shapes(m, None, {"x": shape})
        assert m.SerializeToString() == before


def test_shapes_are_inferred_through_computed_constants() -> None:
    """Pad widths computed from constants by a Transpose and a Reshape: onnx's own data propagation leaves the Pad
    output unknown; opcheck folds the constants as onnxruntime does, so the Relu after it is static and supported
    (without folding it would be an unverified hazard)."""
    from onnx import numpy_helper

    nodes = [
        node("Transpose", ["p2"], ["pt"], perm=[1, 0]),
        node("Reshape", ["pt", "flat"], ["pads"]),
        node("Pad", ["x", "pads"], ["p"]),
        node("Relu", ["p"], ["y"], name="relu"),
    ]
    inits = [
        numpy_helper.from_array(np.array([[0, 0, 1], [0, 0, 2]], np.int64), "p2"),
        numpy_helper.from_array(np.array([-1], np.int64), "flat"),
    ]
    m = model(nodes, [inp("x", ["batch", 2, 8])], ["y"], inits)
    rep = oc.check_model(m, onnxruntime_qnn="2.7.0", free_dims={"batch": 1})
    relu = next(v for v in rep.verdicts if v.node_name == "relu")
    assert (relu.status, relu.kind) == ("supported", "supported"), relu.reason


def test_a_shape_opcheck_cannot_infer_is_a_hazard_not_an_acceptance() -> None:
    """With every input static, a value whose shape stays unknown (the Pad widths are a runtime input) makes the
    nodes on it hazards that say so, never plainly supported."""
    m = model(
        [node("Pad", ["x", "pads"], ["p"]), node("Relu", ["p"], ["y"], name="relu")],
        [inp("x", [1, 2, 8]), inp("pads", [6], TensorProto.INT64)],
        ["y"],
    )
    relu = next(v for v in oc.check_model(m, onnxruntime_qnn="2.7.0").verdicts if v.node_name == "relu")
    assert (relu.status, relu.kind) == ("hazard", "unknown_shape"), relu.reason
