"""The opcheck table tooling in tools/opcheck/: the generated docs are current, derived tables follow the rules.

These tests read the repository's tools/, so they live here rather than in packages/opcheck/tests (the package is
tested on its own).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import gen_operators_doc  # tools/opcheck/gen_operators_doc.py, like tables.py
import tables as opcheck_tables  # tools/opcheck/tables.py: on sys.path through pytest's pythonpath option
from hypothesis import given
from hypothesis import strategies as st

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


def _expand(compact: str) -> set[str]:
    """The class keys a compact key of docs/operators.md stands for (``{a,b}`` is either part)."""
    parts = [p[1:-1].split(",") if p.startswith("{") else [p] for p in compact.split("/")]
    return {"/".join(combo) for combo in itertools.product(*parts)}


@given(
    st.sets(
        st.lists(st.sampled_from(["r1", "r2", "const", "runtime", "float32", "x"]), min_size=1, max_size=4).map(tuple)
    )
)
def test_compact_class_keys_stand_for_exactly_the_keys(parts: set[tuple[str, ...]]) -> None:
    """Written compactly, a set of class keys expands back to exactly that set."""
    keys = sorted({"/".join(p) for p in parts})
    compact = gen_operators_doc._compact(keys)
    expanded = [key for c in compact for key in _expand(c)]
    assert sorted(expanded) == keys


def test_operators_doc_lists_every_measured_shape_class() -> None:
    """Each op's row of the shape-class table in docs/operators.md holds every class the newest HTP table measured:
    the right ones as vouched for, the others under their outcome as refused."""
    table = json.loads((TABLES / "htp-2.7.0-soc60.json").read_text())
    doc = (ROOT / "docs" / "operators.md").read_text(encoding="utf-8")
    start = doc.index("| op | vouched for (measured right) | refused |")
    section = doc[start : doc.index("\n\n", start)]
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^\| (\S+) \| (.*) \| (.*) \|$", section, re.M)}
    for op, classes in table["patterns"]["measured_conditions"]["ops"].items():
        vouched, refused = rows[op]
        listed_right = {key for c in re.findall(r"`([^`]+)`", vouched) for key in _expand(c)}
        assert listed_right == {k for k, o in classes.items() if o == "right"}, op
        for outcome in ("wrong", "refused", "crash"):
            found = re.search(rf"{outcome}: ((?:`[^`]+`(?:, )?)+)", refused)
            listed = {key for c in re.findall(r"`([^`]+)`", found.group(1)) for key in _expand(c)} if found else set()
            assert listed == {k for k, o in classes.items() if o == outcome}, (op, outcome)


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
