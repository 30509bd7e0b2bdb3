"""The packaged tables: schema, provenance on every entry, selection rules, generated docs up to date."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

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


def test_operators_doc_is_up_to_date() -> None:
    """docs/operators.md matches what tools/gen_operators_doc.py generates from the tables."""
    r = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_operators_doc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_derive_marks_later_non_function_ops_unsupported() -> None:
    """tools/opcheck_tables.derive: an op the release notes add later (Shape, 2.5.0) is rejected in 2.4.0."""
    import json

    sys.path.insert(0, str(REPO / "tools"))
    import opcheck_tables

    path = REPO / "packages" / "opcheck" / "src" / "qnnx_opcheck" / "tables" / "htp-2.7.0-soc60.json"
    table = json.loads(path.read_text())
    derived = opcheck_tables.derive(table, "2.4.0")
    cells = derived["ops"]["::Shape"]["variants"][-1]["dtypes"]
    assert {c["status"] for c in cells.values()} == {"rejected"}
    assert all("2.5.0" in c["evidence"] for c in cells.values())
    swish = derived["ops"]["::Swish"]["variants"][-1]["dtypes"]["float32"]
    assert swish["status"] == table["ops"]["::Swish"]["variants"][-1]["dtypes"]["float32"]["status"]
    assert derived["source"] == "derived" and derived["onnxruntime_qnn"] == "2.4.0"
