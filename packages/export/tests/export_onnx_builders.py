"""Small hand-built ONNX graphs containing each pattern a QNN-safety pass rewrites."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

OPSET = 20


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[int]]],
    outputs: Sequence[tuple[str, int, Sequence[int] | None]],
    initializers: dict[str, np.ndarray],
) -> onnx.ModelProto:
    """Build an opset-20 model; ``inputs``/``outputs`` are (name, TensorProto dtype, shape)."""
    graph = h.make_graph(
        list(nodes),
        "g",
        [h.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
        [h.make_tensor_value_info(n, t, None if s is None else list(s)) for n, t, s in outputs],
        [nh.from_array(v, k) for k, v in initializers.items()],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def to_ir(model: onnx.ModelProto) -> ir.Model:
    """Deserialize to onnx_ir (the form the passes work on)."""
    return ir.serde.deserialize_model(model)


def to_bytes(model: ir.Model) -> bytes:
    """Serialize an onnx_ir model."""
    return ir.to_proto(model).SerializeToString()


def add_layernorm(
    batch: int, seq: int, hidden: int, op: str, const_shape: Sequence[int], dynamic: bool, seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``LayerNormalization(op(x[N,S,H], c))``: c an initializer or a second graph input."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    c = rng.standard_normal(tuple(const_shape)).astype(np.float32)
    inits = {"g": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "b": np.zeros(hidden, np.float32)}
    inputs = [("x", TensorProto.FLOAT, x.shape)]
    feeds = {"x": x}
    if dynamic:
        inputs.append(("c", TensorProto.FLOAT, c.shape))
        feeds["c"] = c
    else:
        inits["c"] = c
    nodes = [
        h.make_node(op, ["x", "c"], ["y"]),
        h.make_node("LayerNormalization", ["y", "g", "b"], ["z"], axis=-1, epsilon=1e-5),
    ]
    return make_model(nodes, inputs, [("z", TensorProto.FLOAT, x.shape)], inits), feeds


def rmsnorm(
    batch: int, seq: int, hidden: int, weight_first: bool = True, seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The exporter's RMSNorm: ``Mul(w, x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2)) + eps)))``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    inits = {
        "w": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-6, np.float32),
        "axes": np.array([-1], np.int64),
    }
    nodes = [
        h.make_node("Pow", ["x", "two"], ["p"]),
        h.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
        h.make_node("Add", ["m", "eps"], ["a"]),
        h.make_node("Sqrt", ["a"], ["s"]),
        h.make_node("Reciprocal", ["s"], ["r"]),
        h.make_node("Mul", ["x", "r"], ["n"]),
        h.make_node("Mul", ["w", "n"] if weight_first else ["n", "w"], ["y"]),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, x.shape)], inits), {"x": x}


def erf_gelu(shape: Sequence[int], form: str, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """GELU written with Erf. ``form``: ``half_x_first`` (0.5*x*(1+erf)), ``mul_half_last`` ((x*(1+erf))*0.5),
    ``div_two_last`` ((x*(1+erf))/2), ``mul_inv_sqrt2`` (erf(x*0.7071..)) ; the output feeds a Relu so
    the Gelu is not the graph output in half of the cases."""
    rng = np.random.default_rng(seed)
    x = (2 * rng.standard_normal(tuple(shape))).astype(np.float32)
    inits = {
        "sqrt2": np.array(math.sqrt(2.0), np.float32),
        "inv_sqrt2": np.array(1 / math.sqrt(2.0), np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
        "two": np.array(2.0, np.float32),
    }
    if form == "mul_inv_sqrt2":
        first = h.make_node("Mul", ["x", "inv_sqrt2"], ["u"])
    else:
        first = h.make_node("Div", ["x", "sqrt2"], ["u"])
    nodes = [first, h.make_node("Erf", ["u"], ["e"]), h.make_node("Add", ["e", "one"], ["a"])]
    if form in ("half_x_first", "mul_inv_sqrt2"):
        nodes += [h.make_node("Mul", ["x", "half"], ["hx"]), h.make_node("Mul", ["hx", "a"], ["y"])]
    elif form == "mul_half_last":
        nodes += [h.make_node("Mul", ["x", "a"], ["xa"]), h.make_node("Mul", ["xa", "half"], ["y"])]
    else:
        nodes += [h.make_node("Mul", ["x", "a"], ["xa"]), h.make_node("Div", ["xa", "two"], ["y"])]
    nodes.append(h.make_node("Relu", ["y"], ["r"]))
    outputs = [("y", TensorProto.FLOAT, x.shape), ("r", TensorProto.FLOAT, x.shape)]
    return make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], outputs, inits), {"x": x}


def gathernd(
    data_shape: Sequence[int], indices: np.ndarray, dtype: int = TensorProto.BOOL, seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``GatherND(data, const_indices)`` on a graph input (bool by default, as in HF mask code)."""
    rng = np.random.default_rng(seed)
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    data = rng.integers(0, 2, size=tuple(data_shape)).astype(np_dtype)
    if dtype == TensorProto.FLOAT:
        data = rng.standard_normal(tuple(data_shape)).astype(np.float32)
    out_shape = list(indices.shape[:-1]) + list(data_shape[indices.shape[-1] :])
    nodes = [h.make_node("GatherND", ["data", "idx"], ["y"])]
    model = make_model(
        nodes, [("data", dtype, data.shape)], [("y", dtype, out_shape)], {"idx": indices.astype(np.int64)}
    )
    return model, {"data": data}


def gathernd_runtime(
    data_shape: Sequence[int], index_shape: Sequence[int], seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``GatherND(const float data, runtime int64 indices)``, the indices in range (negative ones included)."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(tuple(data_shape)).astype(np.float32)
    m = index_shape[-1]
    columns = [rng.integers(-d, d, size=tuple(index_shape[:-1])) for d in data_shape[:m]]
    indices = np.stack(columns, axis=-1).astype(np.int64).reshape(tuple(index_shape))
    out_shape = list(index_shape[:-1]) + list(data_shape[m:])
    nodes = [h.make_node("GatherND", ["data", "idx"], ["y"])]
    model = make_model(
        nodes, [("idx", TensorProto.INT64, index_shape)], [("y", TensorProto.FLOAT, out_shape)], {"data": data}
    )
    return model, {"idx": indices}


def unsqueeze_int64(
    shape: Sequence[int], axes: Sequence[int], seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``Unsqueeze(int64 data, axes) + 1`` (the Add keeps it int64 arithmetic, like mask code)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(-5, 5, size=tuple(shape)).astype(np.int64)
    rank = len(shape) + len(axes)
    norm = sorted(a % rank for a in axes)
    out_shape = list(shape)
    for a in norm:
        out_shape.insert(a, 1)
    nodes = [h.make_node("Unsqueeze", ["d", "axes"], ["u"]), h.make_node("Add", ["u", "one"], ["y"])]
    inits = {"axes": np.array(list(axes), np.int64), "one": np.array(1, np.int64)}
    return make_model(nodes, [("d", TensorProto.INT64, data.shape)], [("y", TensorProto.INT64, out_shape)], inits), {
        "d": data
    }


def avgpool(
    shape: Sequence[int], dtype: int = TensorProto.FLOAT, seed: int = 0, **attrs: object
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``AveragePool(x, **attrs)`` of a graph input (see :func:`pool`)."""
    return pool("AveragePool", shape, dtype, seed, **attrs)


def pool(
    op_type: str,
    shape: Sequence[int],
    dtype: int = TensorProto.FLOAT,
    seed: int = 0,
    shift: float = 0.0,
    **attrs: object,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``op_type(x, **attrs)`` (a pool) of a graph input, fed standard normal values plus ``shift``. The output's
    shape is left undeclared: under ceil_mode ONNX's shape inference keeps a last window that would start in the end
    padding, which ONNX Runtime (and PyTorch) drop, so an inferred shape would disagree with what the node
    computes."""
    node = h.make_node(op_type, ["x"], ["y"], **attrs)
    graph = h.make_graph(
        [node], "g", [h.make_tensor_value_info("x", dtype, list(shape))], [h.make_tensor_value_info("y", dtype, None)]
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)], ir_version=10)
    x = np.random.default_rng(seed).standard_normal(tuple(shape)) + shift
    return model, {"x": x.astype(onnx.helper.tensor_dtype_to_np_dtype(dtype))}


def einsum(
    equation: str, shapes: Sequence[Sequence[int]], seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One Einsum of two float graph inputs ``a`` and ``b``, and feeds for them."""
    rng = np.random.default_rng(seed)
    inputs = [(name, TensorProto.FLOAT, shape) for name, shape in zip("ab", shapes, strict=True)]
    node = h.make_node("Einsum", ["a", "b"], ["y"], equation=equation)
    model = make_model([node], inputs, [("y", TensorProto.FLOAT, None)], {})
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in zip("ab", shapes, strict=True)}
    return model, feeds


def projection_into_heads(
    lead: Sequence[int], k: int, heads: int, head_dim: int, *, bias: bool, trans_b: bool, unflatten: bool, seed: int
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A Linear on ``x[*lead, k]`` as exported (``Reshape -> Gemm -> Reshape``), split into ``heads`` heads of
    ``head_dim``: through the unflattened ``[*lead, n]`` when ``unflatten``, else straight from the Gemm."""
    rng = np.random.default_rng(seed)
    n, rows = heads * head_dim, int(np.prod(lead))
    weight = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = {
        "w": weight,
        "flat": np.array([rows, k], np.int64),
        "back": np.array([*lead, n], np.int64),
        "split": np.array([*lead, heads, head_dim], np.int64),
    }
    gemm_inputs = ["x2", "w"]
    if bias:
        inits["b"] = rng.standard_normal(n).astype(np.float32)
        gemm_inputs.append("b")
    nodes = [
        h.make_node("Reshape", ["x", "flat"], ["x2"]),
        h.make_node("Gemm", gemm_inputs, ["g"], transB=int(trans_b)),
    ]
    if unflatten:
        nodes += [h.make_node("Reshape", ["g", "back"], ["g3"]), h.make_node("Reshape", ["g3", "split"], ["y"])]
    else:
        nodes.append(h.make_node("Reshape", ["g", "split"], ["y"]))
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    model = make_model(
        nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, (*lead, heads, head_dim))], inits
    )
    return model, {"x": x}


def merged_heads_matmul(
    source: Sequence[int], merged: Sequence[int], n: int = 8, seed: int = 0, via: Sequence[int] | None = None
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``MatMul(Reshape(x[source] -> merged), W[K, n])``, attention's output projection after its heads are merged
    back, and feeds for ``x``."""
    rng = np.random.default_rng(seed)
    nodes = [h.make_node("Reshape", ["x", "merge"], ["r"]), h.make_node("MatMul", ["r", "w"], ["y"])]
    inits = {
        "merge": np.array(merged, np.int64),
        "w": rng.standard_normal((merged[-1], n)).astype(np.float32),
    }
    if via is not None:  # through a first Reshape (ONNX Runtime merges the two)
        nodes.insert(0, h.make_node("Reshape", ["x", "via"], ["v"]))
        nodes[1].input[0] = "v"
        inits["via"] = np.array(via, np.int64)
    model = make_model(nodes, [("x", TensorProto.FLOAT, source)], [("y", TensorProto.FLOAT, None)], inits)
    return model, {"x": rng.standard_normal(source).astype(np.float32)}


def window_attention_output(
    batch: int, side: int, window: int, heads: int, head_dim: int, seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The end of Swin's window attention as torch.onnx exports it: the heads of every window merged back
    (``Transpose -> Reshape``, ``allowzero=1``), the output projection (``MatMul + Add``) and the window reverse
    through rank 6 (``[B, H/w, W/w, w, w, C] -> perm (0, 1, 3, 2, 4, 5) -> [B, H*W, C]``), with feeds for the
    attention's context ``[B * windows, heads, w*w, head_dim]``."""
    rng = np.random.default_rng(seed)
    c, grid, area = heads * head_dim, side // window, window * window
    rows = batch * grid * grid
    inits = {
        "merge": np.array([rows, area, -1], np.int64),
        "w": (rng.standard_normal((c, c)) / math.sqrt(c)).astype(np.float32),
        "b": rng.standard_normal(c).astype(np.float32),
        "six": np.array([batch, grid, grid, window, window, c], np.int64),
        "back": np.array([batch, side * side, c], np.int64),
    }
    nodes = [
        h.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["t", "merge"], ["m"], allowzero=1),
        h.make_node("MatMul", ["m", "w"], ["p"]),
        h.make_node("Add", ["p", "b"], ["q"]),
        h.make_node("Reshape", ["q", "six"], ["r6"]),
        h.make_node("Transpose", ["r6"], ["t6"], perm=[0, 1, 3, 2, 4, 5]),
        h.make_node("Reshape", ["t6", "back"], ["y"]),
    ]
    x = rng.standard_normal((rows, heads, area, head_dim)).astype(np.float32)
    model = make_model(nodes, [("x", TensorProto.FLOAT, x.shape)], [("y", TensorProto.FLOAT, None)], inits)
    return model, {"x": x}


def conv_transpose(
    spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    pads: Sequence[int],
    dilations: Sequence[int],
    groups: int,
    weight_input: bool,
    seed: int = 0,
    output_padding: Sequence[int] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A ConvTranspose of ``x[2, 2 * groups, *spatial]`` into ``3 * groups`` channels with a bias, its weight an
    initializer or (``weight_input``) a graph input; ``pads`` holds the begin pads then the end pads. Feeds for its
    inputs."""
    rng = np.random.default_rng(seed)
    cin, cout = 2 * groups, 3
    w = rng.standard_normal((cin, cout, *kernel)).astype(np.float32)
    x = rng.standard_normal((2, cin, *spatial)).astype(np.float32)
    inits = {"b": rng.standard_normal(cout * groups).astype(np.float32)}
    inputs = [("x", TensorProto.FLOAT, x.shape)]
    feeds = {"x": x}
    if weight_input:
        inputs.append(("w", TensorProto.FLOAT, w.shape))
        feeds["w"] = w
    else:
        inits["w"] = w
    node = h.make_node(
        "ConvTranspose",
        ["x", "w", "b"],
        ["y"],
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        group=groups,
        **({"output_padding": list(output_padding)} if output_padding else {}),
    )
    return make_model([node], inputs, [("y", TensorProto.FLOAT, None)], inits), feeds
