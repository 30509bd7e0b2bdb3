"""qnnx-opcheck's verdicts against the live QNN EP on attribute-complete cases (tools/opcheck/conformance.py).

The one outcome that must never happen: opcheck vouches for a node ("supported") that QNN HTP computes wrongly or
that crashes. CI runs a few families in full; the whole set (about 480 cases) is the opt-in slow test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "opcheck" / "conformance.py"


def _run(tmp_path: Path, only: str, timeout: float) -> dict:
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(TOOL), "--json", str(out)] + (["--only", only] if only else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def _assert_never_vouched_wrong(result: dict) -> None:
    bad = [c for c in result["cases"] if c["class"] in ("supported_but_wrong", "supported_but_crash")]
    assert not bad, "\n".join(f"{c['case']}: {c['outcome']} {c.get('err', c.get('rc'))}" for c in bad)


@pytest.mark.parametrize(
    "family",
    ["Resize/r4/nearest/floor/half_pixel/", "Resize/r5/linear/half_pixel/", "AveragePool/r4/k2s2", "Elements/"],
)
def test_opcheck_never_vouches_for_a_wrong_case(tmp_path: Path, family: str) -> None:
    """Over a family of attribute variants, every case opcheck supports runs right on QNN HTP."""
    result = _run(tmp_path, family, timeout=600)
    assert result["cases"], f"no case matches {family!r}"
    _assert_never_vouched_wrong(result)
    assert any(c["class"] == "agree" for c in result["cases"])


@pytest.mark.slow
def test_opcheck_conformance_full_set(tmp_path: Path) -> None:
    """All attribute-complete cases: no supported verdict on a wrong or crashing case."""
    _assert_never_vouched_wrong(_run(tmp_path, "", timeout=3600))
