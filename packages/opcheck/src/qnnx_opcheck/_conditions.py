"""Measured conditions: ops whose behaviour on QNN HTP depends on attributes and shapes (Resize) are put in a
condition class, and the table's ``measured_conditions`` pattern says how each class ran."""

from __future__ import annotations

import math
from typing import Any, cast

from qnnx_opcheck._model import NodeView
from qnnx_opcheck._outcomes import KIND_TEXT
from qnnx_opcheck._view import GraphView

__all__ = ["Conditions"]


# Ops whose outcome on QNN HTP depends on the input's rank (tools/opcheck/conformance.py, shape-class cases).
_RANK_CLASSED = frozenset({"RMSNormalization", "Softplus", "Neg", "Log", "Sqrt", "Exp", "Reciprocal", "Abs"})
# RMSNormalization at rank 3-4: the largest dim before the normalized axis of the shape class measured right.
_RMS_LEADING_MAX = 8
# Ops whose outcome depends on the size of the normalized axis.
_AXIS_CLASSED = frozenset({"Softmax", "LogSoftmax"})


def _size_kind(dim: int, out: int) -> str:
    """How one axis of a Resize changes size: ``same``, ``up`` or ``down`` by a whole factor, ``to1`` (down to one
    element, where the coordinate modes divide by out - 1: not measured), else ``frac``."""
    if out == dim:
        return "same"
    if out == 1:
        return "to1"
    if out > 0 and out % dim == 0:
        return "up"
    if out > 0 and dim % out == 0:
        return "down"
    return "frac"


class Conditions:
    """Condition classes and their measured outcomes, on one graph."""

    def __init__(self, view: GraphView) -> None:
        self.view = view

    def condition_key(self, node: NodeView) -> str | None:
        """The measured-condition class of a node (see :func:`qnnx_opcheck._check.condition_keys`), or None for ops without one."""
        if node.domain == "ai.onnx.ml" and node.op_type == "ArrayFeatureExtractor":
            return self._feature_extractor_key(node)
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Resize":
            return self._resize_key(node)
        if node.op_type in _RANK_CLASSED:
            return self._rank_key(node)
        if node.op_type in _AXIS_CLASSED:
            return self._axis_key(node)
        if node.op_type == "Div":
            return self._divisor_key(node)
        return None

    def _rank_key(self, node: NodeView) -> str | None:
        """The rank class of the first input: ``r<rank>`` for RMSNormalization, ``r3/leading<=8`` or
        ``r4/leading<=8`` when every dim before the normalized last axis is at most 8 (QNN HTP's RMSNormalization is
        right at ranks 1-2; at ranks 3-4 it is wrong with some leading dim of 15 or more: [2, 16, 16], [16, 1, 16],
        [1, 16, 1, 16], and right over every shape measured whose leading dims are all <= 8), ``r5`` or ``r1-4``
        for the one-input elementwise ops (Softplus, Neg, Log, Sqrt are refused at rank 5; an elementwise kernel
        does not otherwise depend on the layout, so ranks 1-4 are one class, measured on every rank). An unknown
        shape keeps the cell's verdict, except for RMSNormalization."""
        shape = self.view.shape(node.input[0]) if node.input else None
        if node.op_type == "RMSNormalization":
            if shape is None:
                return "unknown_shape"
            leading = shape[:-1]
            if len(shape) in (3, 4) and all(isinstance(d, int) and d <= _RMS_LEADING_MAX for d in leading):
                return f"r{len(shape)}/leading<={_RMS_LEADING_MAX}"
            return f"r{len(shape)}"
        if shape is None:
            return None
        return "r5" if len(shape) >= 5 else "r1-4"

    def _feature_extractor_key(self, node: NodeView) -> str | None:
        """``r<rank>/<const|runtime>/<dtype>`` for an ArrayFeatureExtractor (indices along the last axis), with
        ``/negative`` when constant indices hold a negative value (onnxruntime's CPU kernel refuses them, so nothing
        says what they should give), ``/unit_last`` when the last axis has one element and ``/indices_r<n>`` for
        indices that are not a vector (onnxruntime flattens them). None when the data's shape or dtype is unknown
        (the table's cells decide)."""
        shape = self.view.shape(node.input[0]) if node.input else None
        dtype = self.view.dtype(node.input[0]) if node.input else None
        if shape is None or dtype is None or len(node.input) < 2:
            return None
        indices = node.input[1]
        parts = [f"r{len(shape)}", "const" if self.view.is_const(indices) else "runtime", dtype]
        value = self.view.const_value(indices)
        if value is not None and bool((value < 0).any()):
            parts.append("negative")
        if shape and shape[-1] == 1:
            parts.append("unit_last")
        index_shape = self.view.shape(indices)
        if index_shape is None or len(index_shape) != 1:
            parts.append(f"indices_r{'?' if index_shape is None else len(index_shape)}")
        return "/".join(parts)

    def _axis_key(self, node: NodeView) -> str | None:
        """``unit_axis`` or ``axis`` for a Softmax/LogSoftmax (QNN HTP's LogSoftmax over an axis of size 1 returns
        -4..-9 instead of 0), prefixed ``r5/`` at rank 5 (where HTP refuses LogSoftmax over any axis)."""
        shape = self.view.shape(node.input[0]) if node.input else None
        if shape is None or not shape:
            return None
        axis = self.view.attr(node, "axis")
        axis = -1 if axis is None else int(axis)
        if not -len(shape) <= axis < len(shape):
            return None
        kind = "unit_axis" if shape[axis] == 1 else "axis"
        return f"r5/{kind}" if len(shape) >= 5 else kind

    def _divisor_key(self, node: NodeView) -> str:
        """``const_zero`` when the divisor is a float constant holding a zero (x / 0 is inf or NaN, which HTP
        cannot hold: it returns a finite number), else ``const`` or ``runtime``."""
        divisor = node.input[1] if len(node.input) > 1 else ""
        if not divisor or not self.view.is_const(divisor):
            return "runtime"
        value = self.view.const_value(divisor)
        if value is None:
            return "const"
        try:
            zero = value.dtype.kind == "f" and bool((value == 0).any())
        except (TypeError, ValueError):
            zero = False
        return "const_zero" if zero else "const"

    def _resize_key(self, node: NodeView) -> str:
        shape = self.view.shape(node.input[0]) if node.input else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            return "unknown_shape"
        mode = self.view.attr(node, "mode") or "nearest"
        parts = [f"r{len(shape)}", str(mode)]
        if mode == "nearest":
            parts.append(str(self.view.attr(node, "nearest_mode") or "round_prefer_floor"))
        ctm = str(self.view.attr(node, "coordinate_transformation_mode") or "half_pixel")
        parts.append(ctm)
        scales_name = node.input[2] if len(node.input) > 2 else ""
        sizes_name = node.input[3] if len(node.input) > 3 else ""
        kinds: set[str] = set()
        runtime_tag = ""
        runtime_sizes = bool(sizes_name) and not self.view.is_const(sizes_name)
        runtime_scales = not sizes_name and bool(scales_name) and not self.view.is_const(scales_name)
        out_shape = self.view.shape(node.output[0]) if node.output else None
        static_out = out_shape is not None and len(out_shape) == len(shape)
        static_out = static_out and all(isinstance(d, int) for d in cast("tuple[Any, ...]", out_shape))
        if static_out and (runtime_sizes or (runtime_scales and mode != "cubic" and ctm == "align_corners")):
            # The QNN EP resizes to the node's static output shape: the class is how the sizes change (as for
            # constant sizes), marked runtime_sizes or runtime_scales, each class measured on its own. Runtime
            # scales only under align_corners, whose coordinates depend on the sizes alone (cubic declines them).
            for dim, out in zip(cast("tuple[int, ...]", shape), cast("tuple[int, ...]", out_shape), strict=True):
                kinds.add(_size_kind(dim, out))
            kinds.discard("same")
            kinds = {"+".join(sorted(kinds)) or "same"}
            runtime_tag = "runtime_sizes" if runtime_sizes else "runtime_scales"
        elif runtime_sizes or runtime_scales:
            kinds.add("runtime")
        elif sizes_name or scales_name:
            given = self.view.const_value(sizes_name or scales_name)
            values = [float(v) for v in given.reshape(-1)] if given is not None else []
            if len(values) != len(shape):
                kinds.add("unknown")
            # Every dim is an int (checked above); mypy does not narrow a tuple through all(isinstance(...)).
            for dim, value in zip(cast("tuple[int, ...]", shape), values, strict=False):
                out = int(value) if sizes_name else math.floor(dim * value + 1e-9)
                if out == dim:
                    continue
                if not sizes_name and abs(dim * value - out) > 1e-6:
                    kinds.add("inexact")
                else:
                    kinds.add(_size_kind(dim, out))
        parts.append("+".join(sorted(kinds)) or "same")
        if runtime_tag:
            parts.append(runtime_tag)
        for attr, default in (("antialias", 0), ("exclude_outside", 0), ("keep_aspect_ratio_policy", "stretch")):
            value = self.view.attr(node, attr)
            if value is not None and value != default:
                parts.append(f"{attr}={value}")
        if self.view.attr(node, "axes"):
            parts.append("axes")
        if mode == "cubic" and self.view.attr(node, "cubic_coeff_a") not in (None, -0.75):
            parts.append("cubic_coeff_a")
        return "/".join(parts)

    def measured(self, node: NodeView) -> tuple[str, str, str | None] | None:
        """The kind, reason and evidence of a node whose condition class was measured as not right, or whose
        class was never measured; None when it was measured right (or the op has no measured classes)."""
        p = self.view.pattern("measured_conditions")
        classes = (p or {}).get("ops", {}).get(node.op_type)
        if not classes:
            return None
        key = self.condition_key(node)
        if key is None:
            return None
        outcome = classes.get(key)
        evidence = p.get("evidence") if p else None
        if outcome == "right":
            return None
        if outcome is None:
            return (
                "unknown_op",
                f"{node.op_type} with this configuration ({key}) was not measured on QNN HTP, so opcheck cannot "
                "vouch for it",
                evidence,
            )
        kind = {"wrong": "wrong_result", "refused": "rejected", "crash": "crash"}.get(outcome, "wrong_result")
        return kind, f"{node.op_type} configuration {key}: {KIND_TEXT.get(kind, kind)}", evidence
