"""Measured conditions: ops whose behaviour on QNN HTP depends on attributes and shapes (Resize) are put in a
condition class, and the table's ``measured_conditions`` pattern says how each class ran."""

from __future__ import annotations

import math
from typing import cast

from qnnx_opcheck._model import NodeView
from qnnx_opcheck._outcomes import KIND_TEXT
from qnnx_opcheck._view import _GraphView

__all__ = ["_Conditions"]


class _Conditions(_GraphView):
    """Condition classes and their measured outcomes."""

    def _condition_key(self, node: NodeView) -> str | None:
        """The measured-condition class of a node (see :func:`qnnx_opcheck._check.condition_keys`), or None for ops without one."""
        if node.op_type == "Resize" and node.domain in ("", "ai.onnx"):
            return self._resize_key(node)
        return None

    def _resize_key(self, node: NodeView) -> str:
        shape = self._shape(node.input[0]) if node.input else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            return "unknown_shape"
        mode = self._attr(node, "mode") or "nearest"
        parts = [f"r{len(shape)}", str(mode)]
        if mode == "nearest":
            parts.append(str(self._attr(node, "nearest_mode") or "round_prefer_floor"))
        parts.append(str(self._attr(node, "coordinate_transformation_mode") or "half_pixel"))
        scales_name = node.input[2] if len(node.input) > 2 else ""
        sizes_name = node.input[3] if len(node.input) > 3 else ""
        kinds: set[str] = set()
        if (sizes_name and not self._is_const(sizes_name)) or (
            not sizes_name and scales_name and not self._is_const(scales_name)
        ):
            kinds.add("runtime")
        elif sizes_name or scales_name:
            given = self._const_value(sizes_name or scales_name)
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
                elif out % dim == 0:
                    kinds.add("up")
                elif dim % out == 0:
                    kinds.add("down")
                else:
                    kinds.add("frac")
        parts.append("+".join(sorted(kinds)) or "same")
        for attr, default in (("antialias", 0), ("exclude_outside", 0), ("keep_aspect_ratio_policy", "stretch")):
            value = self._attr(node, attr)
            if value is not None and value != default:
                parts.append(f"{attr}={value}")
        if self._attr(node, "axes"):
            parts.append("axes")
        if mode == "cubic" and self._attr(node, "cubic_coeff_a") not in (None, -0.75):
            parts.append("cubic_coeff_a")
        return "/".join(parts)

    def _measured(self, node: NodeView) -> tuple[str, str, str | None] | None:
        """The kind, reason and evidence of a node whose condition class was measured as not right, or whose
        class was never measured; None when it was measured right (or the op has no measured classes)."""
        p = self._pattern("measured_conditions")
        classes = (p or {}).get("ops", {}).get(node.op_type)
        if not classes:
            return None
        key = self._condition_key(node)
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
