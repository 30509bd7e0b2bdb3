"""Gathers QNN HTP cannot take as exported: GatherND, Gather by runtime indices along an inner axis, and Gather of a
rank-1 tensor by indices of rank >= 2."""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import onnx_ir as ir

from qnnx_export._naming import UniqueNames
from qnnx_export._passes import _graph
from qnnx_export._passes._base import QnnPass, register

__all__ = [
    "GatherNDToGather",
    "GatherOfVectorByFlatIndices",
    "GatherRuntimeIndicesAsRows",
]


# ----------------------------------------------------------------------------- GatherND -> Gather


@register(order=10)
class GatherNDToGather(QnnPass):
    """Rewrite ``GatherND`` (``batch_dims=0``) into ``Reshape`` + ``Gather`` (or a bare ``Reshape``).

    Two QNN HTP defects (onnxruntime-qnn 2.7.0, soc_model 60):

    - GatherND on bool, int64 and uint8 data is rejected ("Failed to create GatherND node"), and Hugging Face's
      attention-mask code emits it on a bool mask (``padding_mask[batch_idx, kv_idx]``).
    - GatherND by *runtime* indices is silently wrong when the indices hold more than 8 tuples along their
      second-to-last axis and each tuple selects a slice of rank 2: output row ``k`` is the slice of index tuple
      ``k % 8``. Data ``[4, 16, 32]`` by indices ``[32, 1]`` (an MoE layer picking expert weights, ``w[ids]``
      in PyTorch), ``[4, 5, 6]`` by ``[9, 1]``, ``[4, 3, 5, 6]`` by ``[16, 2]``: wrong; by ``[8, 1]``, ``[4, 8, 1]``
      or with rank-1 or rank-3 slices: right.

    - GatherND by runtime indices of rank 4 is silently wrong when their first axis is longer than 8 and each
      tuple selects an element: data ``[5, 5, 5]`` by indices ``[9, 2, 2, 3]`` or ``[10, 10, 10, 3]`` (PyTorch's
      ``x[i, j, k]`` with broadcast index tensors, as torch.onnx writes ``_unsafe_masked_index``) was 2.6-4.6 off,
      ``[8, 2, 2, 3]`` and rank-3 indices right. (Runtime indices of rank 5 stopped the process, SIGSEGV, and a
      Reshape flattening them failed QNN's graph finalize: they are left alone, and qnnx-opcheck refuses them.)

    With constant indices the gather is a plain Gather of flattened row indices. With runtime indices whose last
    dim is 1 it is a Gather along axis 0 by the indices without their last axis (right on HTP for runtime indices,
    negative ones included). Runtime indices of rank 4 that select elements or rank-1 slices are flattened
    to ``[N, k]`` (a Reshape), made positive (a flat GatherND by negative runtime indices failed at run time),
    gathered, and the output reshaped back: right on HTP for every ``N`` measured up to 1000. All are exact: the
    same elements are selected.
    """

    name = "gathernd_to_gather"
    defect = (
        "GatherND is rejected on bool data, and wrong by runtime indices with more than 8 rank-2 slices or by "
        "runtime indices of rank 4, on QNN HTP"
    )

    @staticmethod
    def _plan(node: ir.Node) -> tuple[np.ndarray | None, tuple[int, ...], tuple[int, ...]] | None:
        if node.op_type != "GatherND":
            return None
        batch_dims = node.attributes.get("batch_dims")
        if batch_dims is not None and batch_dims.as_int() != 0:
            return None
        data_shape = _graph.static_shape(node.inputs[0])
        indices = _graph.const_array(node.inputs[1])
        if data_shape is None or indices is None or indices.ndim < 1:
            return GatherNDToGather._runtime_plan(node, data_shape)
        m = indices.shape[-1]
        if m > len(data_shape) or m == 0:
            return None
        dims = np.array(data_shape[:m], dtype=np.int64)
        idx = indices.astype(np.int64)
        idx = np.where(idx < 0, idx + dims, idx)
        if (idx < 0).any() or (idx >= dims).any():
            return None  # out of range: leave the node, ORT will report it
        # Row-major strides of the indexed leading block: strides[k] = prod(dims[k + 1 :]).
        strides = np.ones(m, dtype=np.int64)
        for k in range(m - 2, -1, -1):
            strides[k] = strides[k + 1] * dims[k + 1]
        flat = (idx * strides).sum(axis=-1)
        rows = int(np.prod(dims))
        return flat, (rows, *data_shape[m:]), tuple(indices.shape[:-1]) + tuple(data_shape[m:])

    @staticmethod
    def _runtime_plan(
        node: ir.Node, data_shape: tuple[int, ...] | None
    ) -> tuple[None, tuple[int, ...], tuple[int, ...]] | None:
        """For runtime indices of static shape ``[..., 1]``: the indices' shape without their last axis, and the
        output's shape."""
        index_shape = _graph.static_shape(node.inputs[1])
        if data_shape is None or not data_shape or index_shape is None or not index_shape:
            return None
        if _graph.const_array(node.inputs[1]) is not None:
            return None  # constant indices of another form: out of range or empty, left to ORT
        k = index_shape[-1]
        if k == 1:
            return None, index_shape[:-1], (*index_shape[:-1], *data_shape[1:])
        if len(index_shape) == 4 and 1 < k <= len(data_shape) and len(data_shape) - k <= 1:
            tuples = math.prod(index_shape[:-1])
            return None, (tuples, k), (*index_shape[:-1], *data_shape[k:])
        return None

    def find_defects(self, graph: ir.Graph) -> list[str]:
        return [n.name or "GatherND" for n in graph if self._plan(n) is not None]

    @staticmethod
    def _rewrite_runtime(
        graph: ir.Graph, node: ir.Node, rows_shape: tuple[int, ...], out_shape: tuple[int, ...], names: UniqueNames
    ) -> None:
        data, indices, out = (cast(ir.Value, v) for v in (*node.inputs, node.outputs[0]))
        target = _graph.add_initializer(graph, names("index_shape"), np.array(rows_shape, dtype=np.int64))
        rows = _graph.new_value(names("index"), indices.dtype, rows_shape)
        result = _graph.new_value(names("out"), out.dtype, out_shape)
        graph.insert_before(node, ir.Node("", "Reshape", [indices, target], outputs=[rows]))
        if len(rows_shape) == 2 and rows_shape[1] > 1:  # flat [N, k] tuples: GatherND on them, then the shape back
            data_shape = cast(tuple[int, ...], _graph.static_shape(data))
            sliced = len(data_shape) - rows_shape[1]  # 0 or 1 (_runtime_plan)
            flat_shape = (rows_shape[0], *out_shape[len(out_shape) - sliced :])
            flat_out = _graph.new_value(names("flat_out"), out.dtype, flat_shape)
            shape = _graph.add_initializer(graph, names("out_shape"), np.array(out_shape, dtype=np.int64))
            # Negative indices counted from the end, made positive: a flat GatherND by negative runtime indices
            # failed at run time on HTP ([5, 5, 5] by [100, 3]: QNN_COMMON_ERROR_GENERAL).
            np_index = cast(ir.DataType, indices.dtype).numpy()
            dims = _graph.add_initializer(graph, names("dims"), np.array(data_shape[: rows_shape[1]], np_index))
            zero = _graph.add_initializer(graph, names("zero"), np.array(0, np_index))
            negative = _graph.new_value(names("negative"), ir.DataType.BOOL, rows_shape)
            wrapped = _graph.new_value(names("wrapped"), indices.dtype, rows_shape)
            positive = _graph.new_value(names("positive"), indices.dtype, rows_shape)
            graph.insert_before(node, ir.Node("", "Less", [rows, zero], outputs=[negative]))
            graph.insert_before(node, ir.Node("", "Add", [rows, dims], outputs=[wrapped]))
            graph.insert_before(node, ir.Node("", "Where", [negative, wrapped, rows], outputs=[positive]))
            graph.insert_before(node, ir.Node("", "GatherND", [data, positive], outputs=[flat_out]))
            graph.insert_before(node, ir.Node("", "Reshape", [flat_out, shape], outputs=[result]))
        else:
            graph.insert_before(
                node, ir.Node("", "Gather", [data, rows], attributes=[ir.AttrInt64("axis", 0)], outputs=[result])
            )
        _graph.replace_value(graph, out, result)

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_gathernd")
        changed = False
        for node in list(graph):
            plan = self._plan(node)
            if plan is None:
                continue
            flat, flat_shape, out_shape = plan
            if flat is None:
                self._rewrite_runtime(graph, node, flat_shape, out_shape, names)
                changed = True
                continue
            data, out = cast(ir.Value, node.inputs[0]), node.outputs[0]  # _plan read its shape
            rows = _graph.add_initializer(graph, names("rows_shape"), np.array(flat_shape, dtype=np.int64))
            flat_data = _graph.new_value(names("rows"), data.dtype, flat_shape)
            new_nodes = [ir.Node("", "Reshape", [data, rows], outputs=[flat_data])]
            if flat.size == flat_shape[0] and np.array_equal(flat.reshape(-1), np.arange(flat_shape[0])):
                # The gather selects every row in order: only a reshape.
                final_shape = _graph.add_initializer(graph, names("out_shape"), np.array(out_shape, dtype=np.int64))
                result = _graph.new_value(names("out"), out.dtype, out_shape)
                new_nodes.append(ir.Node("", "Reshape", [flat_data, final_shape], outputs=[result]))
            else:
                index = _graph.add_initializer(graph, names("index"), flat.astype(np.int32))
                result = _graph.new_value(names("out"), out.dtype, out_shape)
                new_nodes.append(
                    ir.Node("", "Gather", [flat_data, index], attributes=[ir.AttrInt64("axis", 0)], outputs=[result])
                )
            for n in new_nodes:
                graph.insert_before(node, n)
            _graph.replace_value(graph, out, result)
            changed = True
        return changed


# ------------------------------------------------------------------------------ Gather by runtime indices


@register(order=30)
class GatherRuntimeIndicesAsRows(QnnPass):
    """Gather by runtime indices along an inner axis as a gather of rows: data ``[A, N, B]`` (``A`` and ``B`` the
    products of the dims before and after the axis) is transposed to ``[N, A*B]``, gathered along axis 0 by the
    flattened indices and brought back to the output's shape.

    QNN HTP's Gather by runtime indices is wrong, silently, along an inner axis when a dim before it is larger
    than 1: ``[2, 16, 64]`` along axis 1 by 4 indices, ``[3, 3, 5]`` along axis 1, ``[2, 5, 8, 3]`` along axis 2 by a
    scalar index, ``[3, 1, 1]`` along axis 1; also along the last axis by indices of rank >= 2 when the output
    reaches rank 5. Along axis 0 (any index rank) and along the last axis by 0-D or 1-D indices it is right, and so
    is every Gather by constant indices (onnxruntime-qnn 2.7.0, soc_model 60). The rewrite only moves elements
    (exact); it needs static shapes, and leaves the node alone without them.
    """

    name = "gather_runtime_indices_as_rows"
    defect = "Gather by runtime indices along an inner axis is wrong on QNN HTP when a dim before the axis is > 1"

    def match(self, node: ir.Node) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
        if not _graph.is_op(node, "Gather") or len(node.inputs) != 2:
            return None
        data, indices = node.inputs
        if data is None or indices is None or _graph.const_array(indices) is not None:
            return None
        data_shape, index_shape = _graph.static_shape(data), _graph.static_shape(indices)
        if data_shape is None or index_shape is None or not data_shape:
            return None
        attr = node.attributes.get("axis")
        axis = attr.as_int() if attr is not None else 0
        axis = axis + len(data_shape) if axis < 0 else axis
        if not 0 <= axis < len(data_shape) or math.prod(data_shape[:axis]) == 1:
            return None  # along the leading axis (or after unit dims only): right as it is
        if axis == len(data_shape) - 1 and len(index_shape) <= 1:
            return None  # along the last axis by 0-D or 1-D indices: right as it is
        return axis, data_shape, index_shape

    def rewrite(self, graph: ir.Graph) -> bool:
        names = _graph.fresh_names(graph, "qnnx_gather_rows")
        matched = self.matched(graph)
        for node, (axis, data_shape, index_shape) in matched:
            _Rows(graph, node, names).gather(axis, data_shape, index_shape)
        return bool(matched)


class _Rows:
    """Writes the row-gather form of one Gather node, each new node inserted before it."""

    def __init__(self, graph: ir.Graph, node: ir.Node, names: UniqueNames) -> None:
        self.graph, self.node, self.names = graph, node, names
        self.dtype = cast(ir.Value, node.inputs[0]).dtype

    def _emit(self, op: str, inputs: list[ir.Value], shape: tuple[int, ...], **attrs: Any) -> ir.Value:
        result = _graph.new_value(self.names(op.lower()), self.dtype, shape)
        attributes = [ir.AttrInt64s(k, v) if isinstance(v, list) else ir.AttrInt64(k, v) for k, v in attrs.items()]
        self.graph.insert_before(self.node, ir.Node("", op, inputs, attributes=attributes, outputs=[result]))
        return result

    def _reshape(self, source: ir.Value, shape: tuple[int, ...]) -> ir.Value:
        target = _graph.add_initializer(self.graph, self.names("shape"), np.array(shape, dtype=np.int64))
        return self._emit("Reshape", [source, target], shape)

    def gather(self, axis: int, data_shape: tuple[int, ...], index_shape: tuple[int, ...]) -> None:
        data, indices, out = (cast(ir.Value, v) for v in (*self.node.inputs, self.node.outputs[0]))
        before, size, after = math.prod(data_shape[:axis]), data_shape[axis], math.prod(data_shape[axis + 1 :])
        count = math.prod(index_shape)
        blocks = self._emit(
            "Transpose", [self._reshape(data, (before, size, after))], (size, before, after), perm=[1, 0, 2]
        )
        rows = self._reshape(blocks, (size, before * after))
        flat_shape = _graph.add_initializer(self.graph, self.names("flat_shape"), np.array([count], dtype=np.int64))
        flat = _graph.new_value(self.names("flat_indices"), indices.dtype, (count,))
        self.graph.insert_before(self.node, ir.Node("", "Reshape", [indices, flat_shape], outputs=[flat]))
        picked = self._emit("Gather", [rows, flat], (count, before * after), axis=0)
        picked = self._reshape(picked, (count, before, after))
        back = self._emit("Transpose", [picked], (before, count, after), perm=[1, 0, 2])
        result = self._reshape(back, (*data_shape[:axis], *index_shape, *data_shape[axis + 1 :]))
        _graph.replace_value(self.graph, out, result)


# ------------------------------------------------------------------- Gather of a vector by multi-dim indices


@register(order=168)
class GatherOfVectorByFlatIndices(QnnPass):
    """Write a ``Gather`` by indices of rank >= 2 of a rank-1 tensor, or with a rank-5 output, as a Gather by the
    flattened indices followed by a ``Reshape`` to the output's shape.

    ONNX Runtime stops the process (a failed bounds assertion in its C++ library, SIGABRT) while it creates a QNN
    session for ``Transpose -> Reshape to rank 1 -> Gather(axis 0) by indices of rank 2 or 4 -> Transpose`` (also
    with elementwise ops before the last Transpose, with or without graph optimizations, and with Gather or
    Transpose pinned to the CPU EP; onnxruntime 1.32, onnxruntime-qnn 2.7.0). That is how an ``as_strided`` view
    of a transposed tensor is exported (Longformer's and LED's sliding-window attention): the process died on the
    first call. The same graph with the Gather by 1-D indices and a Reshape after it builds and runs. And QNN HTP
    computes a Gather by indices of rank >= 2 into a rank-5 output wrongly (``x[3, 4, 2, 3]`` along axis 1 by
    ``[[0, 3]]``: 3.5 of the output's scale off; ``x[5, 1, 3, 3]`` by ``[[0, 0, 0]]``: 3.7 off; onnxruntime-qnn 2.7.0,
    soc 60), while the Gather by the flattened indices has the data's rank and is right. Exact: the same elements,
    in the same order. Shape classes: indices of static shape and rank >= 2 (any dtype, constant or computed at run
    time) into data of rank 1 or an output of rank 5; other Gathers are left alone.
    """

    name = "gather_of_vector_by_flat_indices"
    defect = (
        "ONNX Runtime aborts creating a QNN session for a Gather of a transposed, flattened tensor by 2-D+ indices, "
        "and QNN HTP computes a Gather by 2-D+ indices into a rank-5 output wrongly"
    )

    def match(self, node: ir.Node) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
        """The data's and the indices' static shapes and the axis of a Gather by indices of rank >= 2 of a rank-1
        tensor or into a rank-5 output, or None."""
        if not _graph.is_op(node, "Gather") or len(node.inputs) != 2:
            return None
        data, indices = node.inputs
        data_shape, index_shape = _graph.static_shape(data), _graph.static_shape(indices)
        if data_shape is None or not data_shape or index_shape is None or len(index_shape) < 2:
            return None
        if len(data_shape) != 1 and len(data_shape) - 1 + len(index_shape) != _graph.MAX_HTP_RANK:
            return None
        axis = node.attributes.get_int("axis", 0) or 0
        return data_shape, index_shape, axis + len(data_shape) if axis < 0 else axis

    def rewrite(self, graph: ir.Graph) -> bool:
        def flat(
            names: UniqueNames, node: ir.Node, found: tuple[tuple[int, ...], tuple[int, ...], int]
        ) -> tuple[list[ir.Node], ir.Value]:
            data_shape, index_shape, axis = found
            data, indices, out = (cast(ir.Value, v) for v in (*node.inputs, node.outputs[0]))
            count = math.prod(index_shape)
            constant = _graph.const_array(indices)
            new_nodes: list[ir.Node] = []
            if constant is not None:
                flat_indices = _graph.add_initializer(graph, names("indices"), constant.reshape(count))
            else:
                count_shape = _graph.add_initializer(graph, names("count"), np.array([count], dtype=np.int64))
                flat_indices = _graph.new_value(names("indices"), indices.dtype, (count,))
                new_nodes.append(ir.Node("", "Reshape", [indices, count_shape], outputs=[flat_indices]))
            picked_shape = (*data_shape[:axis], count, *data_shape[axis + 1 :])
            picked = _graph.new_value(names("picked"), data.dtype, picked_shape)
            new_nodes.append(
                ir.Node("", "Gather", [data, flat_indices], attributes=[ir.AttrInt64("axis", axis)], outputs=[picked])
            )
            out_shape = (*data_shape[:axis], *index_shape, *data_shape[axis + 1 :])
            target = _graph.add_initializer(graph, names("shape"), np.array(out_shape, dtype=np.int64))
            result = _graph.new_value(names("out"), out.dtype, out_shape)
            new_nodes.append(ir.Node("", "Reshape", [picked, target], outputs=[result]))
            return new_nodes, result

        return self.replace_matched(graph, "qnnx_flat_gather", flat)
