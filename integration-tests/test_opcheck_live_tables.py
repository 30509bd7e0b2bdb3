"""The packaged HTP table agrees with the live QNN EP on this machine's HTP simulator.

Each case runs in its own child process (tools/opcheck/probe.py), because some crash the process.
The default run checks a fixed sample covering every outcome kind; the whole table runs with
``-m slow`` (nox session ``slow``) or with QNNX_OPCHECK_LIVE_ALL=1.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os

import pytest

import qnnx_opcheck as oc

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime_qnn")

# tools/opcheck/probe.py and tables.py: on sys.path through pytest's pythonpath option (root pyproject.toml).
import probe as opcheck_probe
import tables as opcheck_tables

VERSION = importlib.metadata.version("onnxruntime-qnn")
SOC = 60
ARGS = argparse.Namespace(soc_model=str(SOC), backend="htp", case_timeout=120.0)


def _table() -> oc.OpTable:
    table, notes = oc.load_table("htp", VERSION, SOC)
    if notes or table.source != "probed":
        pytest.skip(f"no probed table for onnxruntime-qnn {VERSION} soc {SOC}")
    return table


def _cells() -> list[tuple[str, str, str]]:
    """Every (variant, dtype, table status) of the probed table for the installed release."""
    try:
        table, notes = oc.load_table("htp", VERSION, SOC)
    except Exception:
        return []
    if notes or table.source != "probed":
        return []
    return [
        (v["name"], dtype, cell["status"])
        for entry in table.ops.values()
        for v in entry["variants"]
        for dtype, cell in v["dtypes"].items()
    ]


def _sample() -> list[tuple[str, str, str]]:
    """A fixed spread: the first cell of each outcome kind, plus a few common ops."""
    cells = _cells()
    picked: dict[str, tuple[str, str, str]] = {}
    for c in cells:
        picked.setdefault(c[2], c)
    wanted = {
        ("Conv", "float32"),
        ("Gather", "int64"),
        ("Erf", "float32"),
        ("GatherND", "bool"),
        ("LayerNormalization", "qdq_uint8"),
    }
    extra = [c for c in cells if (c[0], c[1]) in wanted]
    return sorted(set(picked.values()) | set(extra))


def _live(variant: str, dtype: str) -> str:
    res = opcheck_probe.run_case(variant, dtype, ARGS)
    cell = opcheck_tables._cell(res, "live")
    assert cell is not None, f"probe harness error for {variant}/{dtype}: {res}"
    return cell["status"]


@pytest.mark.parametrize(("variant", "dtype", "status"), _sample())
def test_sampled_entries_match_live_ep(variant: str, dtype: str, status: str) -> None:
    """A sample of table cells (one per outcome kind) matches a fresh run on the live QNN EP."""
    _table()
    assert _live(variant, dtype) == status


@pytest.mark.parametrize("pattern", ["add_const1_layernorm", "rmsnorm_mul_weight", "gelu_erf_div"])
def test_pattern_hazards_match_live_ep(pattern: str) -> None:
    """The multi-node hazards in the table still behave that way on the live EP."""
    table = _table()
    res = opcheck_probe.run_case(f"pattern:{pattern}", "float32", ARGS)
    if pattern == "add_const1_layernorm":
        assert "add_const_broadcast_layernorm" in table.patterns
        assert res["status"] == "Y" and res["err"] > opcheck_tables.WRONG_RESULT_ERR
    elif pattern == "rmsnorm_mul_weight":
        assert table.patterns["rmsnorm_mul_weight"]["kind"] == res["status"]
    else:
        assert "erf_gelu_fusion" in table.patterns
        assert res["status"] == "Y" and res["err"] < opcheck_tables.WRONG_RESULT_ERR


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "dtype", "status"), _cells())
def test_every_entry_matches_live_ep(request: pytest.FixtureRequest, variant: str, dtype: str, status: str) -> None:
    """Every table cell matches the live QNN EP (about 17 minutes on the 2-core bench)."""
    if not request.config.option.markexpr and os.environ.get("QNNX_OPCHECK_LIVE_ALL") != "1":
        pytest.skip("slow: run with -m slow or QNNX_OPCHECK_LIVE_ALL=1")
    assert _live(variant, dtype) == status
