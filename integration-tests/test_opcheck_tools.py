"""The opcheck table tooling in tools/opcheck/: the generated docs are current, derived tables follow the rules.

These tests read the repository's tools/, so they live here rather than in packages/opcheck/tests (the package is
tested on its own).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import tables as opcheck_tables  # tools/opcheck/tables.py: on sys.path through pytest's pythonpath option

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools" / "opcheck"
TABLES = ROOT / "packages" / "opcheck" / "src" / "qnnx_opcheck" / "tables"


def test_operators_doc_is_up_to_date() -> None:
    """docs/operators.md matches what tools/opcheck/gen_operators_doc.py generates from the tables."""
    r = subprocess.run(
        [sys.executable, str(TOOLS / "gen_operators_doc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_derive_marks_later_non_function_ops_unsupported() -> None:
    """tools/opcheck/tables.derive: an op the release notes add later (Shape, 2.5.0) is rejected in 2.4.0."""
    table = json.loads((TABLES / "htp-2.7.0-soc60.json").read_text())
    derived = opcheck_tables.derive(table, "2.4.0")
    cells = derived["ops"]["::Shape"]["variants"][-1]["dtypes"]
    assert {c["status"] for c in cells.values()} == {"rejected"}
    assert all("2.5.0" in c["evidence"] for c in cells.values())
    swish = derived["ops"]["::Swish"]["variants"][-1]["dtypes"]["float32"]
    assert swish["status"] == table["ops"]["::Swish"]["variants"][-1]["dtypes"]["float32"]["status"]
    assert derived["source"] == "derived" and derived["onnxruntime_qnn"] == "2.4.0"


def test_tools_run_from_their_folder() -> None:
    """Every tool in tools/opcheck/ starts with --help from any working directory (its imports resolve)."""
    for name in ("probe.py", "tables.py", "conformance.py", "bench.py", "gen_operators_doc.py"):
        r = subprocess.run(
            [sys.executable, str(TOOLS / name), "--help"], capture_output=True, text=True, check=False, cwd="/"
        )
        assert r.returncode == 0 and "usage" in r.stdout.lower(), f"{name}: {r.stderr[-500:]}"
