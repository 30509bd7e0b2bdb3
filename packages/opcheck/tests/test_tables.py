"""The packaged tables: schema, provenance on every entry, selection rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import qnnx_opcheck as oc
from qnnx_opcheck import errors
from qnnx_opcheck._tables import parse_version

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


def _selected_from_all_tables(backend: str, version: str | None, soc: int | None) -> oc.OpTable:
    """The table the selection rules give when every packaged table is read (what load_table did before it chose
    from the file names)."""
    tables = oc.available_tables(backend)
    versions = sorted({t.version_tuple for t in tables})
    chosen = versions[-1]
    if version is not None:
        want = parse_version(version)
        distance = lambda v: (abs((v[0] - want[0]) * 10_000 + (v[1] - want[1]) * 100 + (v[2] - want[2])), v >= want)  # noqa: E731
        chosen = want if want in versions else min(versions, key=distance)
    same = [t for t in tables if t.version_tuple == chosen]
    by_soc = {t.soc_model: t for t in same}
    if backend == "htp":
        return by_soc[soc] if soc in by_soc else by_soc.get(60, same[0])
    return same[0]


@given(
    backend=st.sampled_from(["htp", "npu", "gpu"]),
    version=st.none() | st.builds("{}.{}.{}".format, st.integers(1, 3), st.integers(0, 12), st.integers(0, 3)),
    soc=st.none() | st.sampled_from([60, 61, 69, 73]),
)
def test_the_table_chosen_from_file_names_is_the_one_the_rules_choose_among_all_tables(
    backend: str, version: str | None, soc: int | None
) -> None:
    """load_table, which reads only the chosen file, returns the same table as the rules applied to every table,
    with a note exactly when it fell back from the release or SoC asked for."""
    table, notes = oc.load_table(backend, version, soc)
    expected = _selected_from_all_tables("gpu" if backend == "gpu" else "htp", version, soc)
    assert (table.backend, table.onnxruntime_qnn, table.soc_model) == (
        expected.backend,
        expected.onnxruntime_qnn,
        expected.soc_model,
    )
    exact_release = version is None or parse_version(version) == table.version_tuple
    exact_soc = soc is None or table.backend == "gpu" or soc == table.soc_model
    assert bool(notes) == (not exact_release or not exact_soc)


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
