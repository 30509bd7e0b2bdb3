"""Fakes for downstream tests (e.g. the backend's strict/auto mode) that need a report without a model."""

from __future__ import annotations

from collections.abc import Sequence

from qnnx_opcheck._report import NodeVerdict, OpCheckReport

__all__ = ["fake_report"]


def fake_report(
    *,
    supported: Sequence[str] = ("Relu",),
    unsupported: Sequence[str] = (),
    hazards: Sequence[str] = (),
    backend: str = "htp",
    onnxruntime_qnn: str = "2.7.0",
    soc_model: int | None = 60,
) -> OpCheckReport:
    """Build a report whose nodes have the given op types, in the order supported, unsupported, hazards.

    Nodes are named ``n0``, ``n1``, ... in that order; reasons and evidence say they are fakes.

    Args:
        supported: Op types of supported nodes.
        unsupported: Op types of unsupported nodes (kind ``rejected``).
        hazards: Op types of hazard nodes (kind ``caveat``).
        backend: ``"htp"`` or ``"gpu"``.
        onnxruntime_qnn: The table version the report claims.
        soc_model: The SoC the report claims (None for GPU).

    Returns:
        A frozen report, indistinguishable in type from a real one.
    """
    verdicts: list[NodeVerdict] = []
    groups = (
        ("supported", "supported", supported),
        ("unsupported", "rejected", unsupported),
        ("hazard", "caveat", hazards),
    )
    for status, kind, ops in groups:
        for op in ops:
            i = len(verdicts)
            verdicts.append(
                NodeVerdict(
                    node_name=f"n{i}",
                    op_type=op,
                    status=status,  # type: ignore[arg-type]
                    kind=kind,
                    reason=None if status == "supported" else f"fake {status} verdict for {op}",
                    evidence="qnnx_opcheck.testing.fake_report",
                )
            )
    return OpCheckReport(
        backend=backend,
        onnxruntime_qnn=onnxruntime_qnn,
        soc_model=soc_model if backend == "htp" else None,
        verdicts=tuple(verdicts),
        requested_onnxruntime_qnn=onnxruntime_qnn,
        table_source="fake",
    )
