"""The figures the docs quote about the code are the code's: the translator's op count in the docs is its
registry's. (The README's options table is written from the options: packages/backend/tests/test_options.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_quote_the_translators_op_count() -> None:
    """Every "lists the N it has" of the fast path in the docs is the number of ops the translator registers."""
    import qnnx_export

    count = len(qnnx_export.fast_path_ops())
    quoted = [
        (doc.relative_to(ROOT), int(n))
        for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for n in re.findall(r"fast_path_ops\(\)` lists the (\d+)", doc.read_text(encoding="utf-8"))
    ]
    assert quoted, "the docs no longer quote the translator's op count: update this test"
    assert all(n == count for _, n in quoted), (quoted, count)
