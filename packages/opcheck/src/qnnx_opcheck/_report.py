"""Result types: one verdict per node and the report over a whole model."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from qnnx_opcheck.errors import UnsupportedOperatorsError

__all__ = ["NodeVerdict", "OpCheckReport", "Status"]

Status = Literal["supported", "unsupported", "hazard"]
STATUSES: tuple[str, ...] = ("supported", "unsupported", "hazard")


@attrs.frozen(kw_only=True)
class NodeVerdict:
    """Whether one ONNX node can run on the chosen QNN backend.

    Attributes:
        node_name: The node's name (ONNX allows empty names; the report then uses ``n<index>``).
        op_type: The ONNX operator, e.g. ``"Conv"``.
        domain: The operator domain; ``""`` is the default ONNX domain.
        status: ``"supported"``, ``"unsupported"`` (QNN rejects it, fails on it, crashes on it, or
            computes it wrongly), or ``"hazard"`` (runs on QNN with a documented caveat).
        reason: Why the node is not plainly supported, or how it is supported (e.g. folded by ORT).
        evidence: Where the table entry comes from (probe case, release notes, issue).
        dtype: The dtype key the decision used (e.g. ``"float32"``, ``"qdq_uint8"``), None if unknown.
        kind: The table outcome behind the status (``"supported"``, ``"rejected"``, ``"finalize_error"``,
            ``"session_error"``, ``"crash"``, ``"wrong_result"``, ``"caveat"``, ``"unknown_op"``, ...).
    """

    node_name: str
    op_type: str
    domain: str = ""
    status: Status
    reason: str | None = None
    evidence: str | None = None
    dtype: str | None = None
    kind: str = "supported"

    def __attrs_post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict of all fields."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class OpCheckReport:
    """Node-by-node verdicts for one model on one QNN backend.

    Attributes:
        backend: ``"htp"`` or ``"gpu"``.
        onnxruntime_qnn: The version of the table that was used (may differ from the requested version
            when that release has no table; ``notes`` then says so).
        soc_model: The SoC the table was probed for (HTP), None for tables that do not depend on it.
        verdicts: One verdict per node, in graph order (after inlining local functions).
        requested_onnxruntime_qnn: The version asked for (or detected), None when none was known.
        table_source: ``"probed"``, ``"derived"`` or ``"documented"``: how the table was made.
        notes: Report-level remarks: table fallbacks, backend-wide caveats.
    """

    backend: str
    onnxruntime_qnn: str
    soc_model: int | None
    verdicts: tuple[NodeVerdict, ...]
    requested_onnxruntime_qnn: str | None = None
    table_source: str = "probed"
    notes: tuple[str, ...] = ()

    @property
    def supported(self) -> bool:
        """True when no node is unsupported (hazard nodes run on QNN, so they count as supported)."""
        return not self.unsupported

    @property
    def unsupported(self) -> tuple[NodeVerdict, ...]:
        """The verdicts that block running the whole model on this backend."""
        return tuple(v for v in self.verdicts if v.status == "unsupported")

    @property
    def hazards(self) -> tuple[NodeVerdict, ...]:
        """The verdicts that run on QNN but carry a documented caveat."""
        return tuple(v for v in self.verdicts if v.status == "hazard")

    def summary(self) -> str:
        """One line, e.g. ``htp (onnxruntime-qnn 2.7.0): 41/42 nodes supported; unsupported: Erf (n3)``."""
        n = len(self.verdicts)
        ok = n - len(self.unsupported)
        head = f"{self.backend} (onnxruntime-qnn {self.onnxruntime_qnn}): {ok}/{n} nodes supported"
        parts = [head]
        if self.unsupported:
            listed = ", ".join(f"{v.op_type} ({v.node_name})" for v in self.unsupported[:8])
            more = f" and {len(self.unsupported) - 8} more" if len(self.unsupported) > 8 else ""
            parts.append(f"unsupported: {listed}{more}")
        if self.hazards:
            parts.append(f"{len(self.hazards)} hazard(s)")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict: the fields, ``supported``, counts and every verdict."""
        return {
            "backend": self.backend,
            "onnxruntime_qnn": self.onnxruntime_qnn,
            "requested_onnxruntime_qnn": self.requested_onnxruntime_qnn,
            "soc_model": self.soc_model,
            "table_source": self.table_source,
            "supported": self.supported,
            "counts": {
                "nodes": len(self.verdicts),
                "supported": sum(v.status == "supported" for v in self.verdicts),
                "unsupported": len(self.unsupported),
                "hazard": len(self.hazards),
            },
            "summary": self.summary(),
            "notes": list(self.notes),
            "verdicts": [v.to_dict() for v in self.verdicts],
        }

    def raise_for_unsupported(self) -> None:
        """Raise :class:`~qnnx_opcheck.errors.UnsupportedOperatorsError` listing every unsupported node.

        Does nothing when the model is supported.
        """
        if self.unsupported:
            raise UnsupportedOperatorsError(self.unsupported, self.backend, self.onnxruntime_qnn)
