"""The outcomes a QNN table records ("kinds"): the report status of each, the words for it, and the verdict of one
table cell."""

from __future__ import annotations

from typing import Any

from qnnx_opcheck._model import NodeView

__all__ = ["KIND_STATUS", "KIND_TEXT", "Decision", "cell_decision"]

#: What the rules decide about a node: kind, reason, evidence, and the dtype key that decided it.
Decision = tuple[str, str | None, str | None, str | None]

# Table outcome -> report status. Everything that stops the node (or the whole session) is unsupported;
# a known-wrong numerical result is unsupported too: a silent wrong answer is worse than a fallback.
KIND_STATUS = {
    "supported": "supported",
    "fused": "supported",
    "constant_folded": "supported",
    "removed": "supported",
    "caveat": "hazard",
    "unknown_dtype": "hazard",
    "unverified": "hazard",
    "unknown_shape": "hazard",
    "rejected": "unsupported",
    "finalize_error": "unsupported",
    "session_error": "unsupported",
    "crash": "unsupported",
    "wrong_result": "unsupported",
    "run_error": "unsupported",
    "error": "unsupported",
    "unknown_op": "unsupported",
    "unlisted_dtype": "unsupported",
}
KIND_TEXT = {
    "rejected": "the QNN EP declines it (it would fall back to the CPU EP)",
    "finalize_error": "the QNN EP takes it, then QNN graph finalize fails (CPU fallback does not rescue this)",
    "session_error": "session creation fails even with CPU fallback allowed",
    "crash": "it crashes the process (segfault inside the QNN EP)",
    "wrong_result": "QNN runs it but returns wrong values (silent)",
    "run_error": "the session builds but Run() fails",
    "error": "session creation fails",
    "unverified": "support is documented for float only; this dtype is unverified on this backend",
}


def cell_decision(
    node: NodeView, variant: dict[str, Any], key: str, cell: dict[str, Any], entry: dict[str, Any]
) -> Decision:
    """The decision a table cell (the outcome measured for ``key``, a dtype or QDQ form) gives a node."""
    status = cell["status"]
    evidence = cell.get("evidence") or variant.get("evidence") or entry.get("evidence")
    if status == "supported":
        return "supported", cell.get("note"), evidence, key
    what = KIND_TEXT.get(status, status)
    desc = variant.get("description")
    detail = cell.get("reason")
    text = f"{node.op_type} on {key}{f' ({desc})' if desc else ''}: {what}"
    if detail:
        text += f" [{detail}]"
    return status, text, evidence, key
