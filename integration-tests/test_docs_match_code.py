"""The figures and tables the docs quote about the code are the code's: the README's options table names every
backend option with its default, and the translator's op count in the docs is its registry's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _options_table() -> dict[str, str]:
    """``{option: default column}`` of the README's "Options" table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n### Options\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), f"an option is listed twice: {names}"
    return {name: default.strip() for name, default in rows}


def test_readme_options_table_lists_exactly_the_backend_options() -> None:
    """Every option torch.compile(..., options=...) accepts has a row in the README's table, and every row is one."""
    from qnnx_backend import BackendOptions

    assert sorted(_options_table()) == sorted(BackendOptions.option_names())


def test_readme_options_table_gives_the_literal_defaults() -> None:
    """Where the table's default is a Python literal, it is the option's default (factories and prose such as
    "detected" are described, not compared)."""
    import attrs

    from qnnx_backend import BackendOptions

    table = _options_table()
    wrong = []
    for field in attrs.fields(BackendOptions):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            continue
        try:
            documented = ast.literal_eval(table[field.name].strip("`"))
        except (ValueError, SyntaxError):
            continue
        if documented != field.default:
            wrong.append(f"{field.name}: README {documented!r}, code {field.default!r}")
    assert not wrong, wrong


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
