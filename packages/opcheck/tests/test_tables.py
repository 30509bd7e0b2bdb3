"""The packaged tables: schema, provenance on every entry, selection rules."""

from __future__ import annotations

import pytest

import qnnx_opcheck as oc
from qnnx_opcheck import errors

KINDS = {
    "supported",
    "rejected",
    "finalize_error",
    "session_error",
    "crash",
    "wrong_result",
    "run_error",
    "error",
    "unverified",
}
CONDITIONS = {
    "rank",
    "output_rank",
    "attr",
    "const_inputs",
    "dynamic_inputs",
    "input_dtype",
    "const_input_not_all",
    "opset",
}


def test_tables_exist_for_each_backend_and_release() -> None:
    """HTP and GPU tables exist for onnxruntime-qnn 2.4-2.7; HTP 2.7.0 soc 60 is probed."""
    have = {(t.backend, t.onnxruntime_qnn) for t in oc.available_tables()}
    for backend in ("htp", "gpu"):
        for version in ("2.4.0", "2.5.0", "2.6.0", "2.7.0"):
            assert (backend, version) in have
    t, notes = oc.load_table("htp", "2.7.0", 60)
    assert t.source == "probed" and not notes


@pytest.mark.parametrize("table", oc.available_tables(), ids=lambda t: f"{t.backend}-{t.onnxruntime_qnn}-{t.soc_model}")
def test_table_schema_and_evidence(table: oc.OpTable) -> None:
    """Every entry has a domain, an opset range, variants with known conditions, and evidence on every cell."""
    assert table.provenance.get("summary")
    assert table.ops
    for key, entry in table.ops.items():
        assert key == f"{entry['domain']}::{entry['op_type']}"
        lo, hi = entry["opset"]
        assert lo >= 1 and (hi is None or hi >= lo)
        assert entry["type_from"].split(":")[0] in ("input", "output")
        assert entry["variants"], key
        # The unconditional variant, when present, is last: the checker takes the first match.
        plain = [i for i, v in enumerate(entry["variants"]) if not v["when"]]
        assert all(i == len(entry["variants"]) - 1 for i in plain), key
        for v in entry["variants"]:
            assert set(v["when"]) <= CONDITIONS, (key, v["when"])
            for dtype, cell in v["dtypes"].items():
                assert cell["status"] in KINDS, (key, dtype, cell)
                assert cell.get("evidence"), (key, dtype)
    for pid, p in table.patterns.items():
        assert p["status"] in ("supported", "unsupported", "hazard"), pid
        assert p["evidence"] and p["reason"], pid


def test_probed_table_covers_the_brief_dtypes() -> None:
    """The probed HTP table has float, int32, int64, bool and QDQ uint8/uint16 results."""
    t, _ = oc.load_table("htp", "2.7.0", 60)
    keys = {k for e in t.ops.values() for v in e["variants"] for k in v["dtypes"]}
    assert {"float32", "float16", "int32", "int64", "bool", "qdq_uint8", "qdq_uint16"} <= keys


def test_version_selection_rules() -> None:
    """Exact release first, else the nearest (older on a tie); None means the newest."""
    assert oc.load_table("htp", None)[0].onnxruntime_qnn == max(
        (t.onnxruntime_qnn for t in oc.available_tables("htp")), key=lambda v: tuple(map(int, v.split(".")))
    )
    assert oc.load_table("htp", "2.6")[0].onnxruntime_qnn == "2.6.0"
    t, notes = oc.load_table("htp", "2.3.0")
    assert t.onnxruntime_qnn == "2.4.0" and notes
    t, notes = oc.load_table("gpu", "3.0.0")
    assert t.onnxruntime_qnn == "2.7.0" and notes


def test_load_table_rejects_bad_backend() -> None:
    """load_table validates the backend like check_model."""
    with pytest.raises(errors.UnknownBackendError):
        oc.load_table("dsp")


def test_qdq_cells_are_measured_with_their_weights() -> None:
    """HTP 2.7.0 QDQ cells come from the tooling-quantized probe: ops with weights name the weights they were
    measured with, and other weight types have cells of their own."""
    t, _ = oc.load_table("htp", "2.7.0", 60)
    assert "qdq_tooling" in t.provenance
    ln = t.ops["::LayerNormalization"]["variants"][-1]["dtypes"]
    assert ln["qdq_uint16"]["weights"] == "uint8" and ln["qdq_uint16"]["status"] == "supported"
    assert ln["qdq_uint16/w=int8"]["status"] == "rejected"
    assert {"com.microsoft::QuantizeLinear", "com.microsoft::DequantizeLinear"} <= set(t.ops)


@pytest.mark.parametrize("version", ["2.4.0", "2.5.0", "2.6.0"])
def test_older_releases_mark_their_qdq_cells_derived(version: str) -> None:
    """Releases whose QDQ form was not probed with the tooling say, cell by cell, that their QDQ cells are derived."""
    t, _ = oc.load_table("htp", version, 60)
    cells = [c for e in t.ops.values() for v in e["variants"] for k, c in v["dtypes"].items() if k.startswith("qdq_")]
    assert cells and all("derived for" in c["evidence"] or "not probed" in c["evidence"] for c in cells)
    assert any("QDQ" in n and "derived" in n for n in t.notes)
