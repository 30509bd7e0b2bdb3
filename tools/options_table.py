"""Rewrite the README's options table from the backend's option definitions.

The table is ``qnnx_backend._options.options_table()``: a row per field of ``BackendOptions``, with its name, its
default and its docstring. It stands in README.md between the ``options-table`` markers, and
packages/backend/tests/test_options.py fails, printing the table it expects, while the README's differs.

Run: `python tools/options_table.py` (exit 0; it says whether the README changed).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from qnnx_backend._options import options_table

README = Path(__file__).resolve().parent.parent / "README.md"
# The markers around the table; packages/backend/tests/test_options.py reads the same ones.
TABLE = re.compile(r"<!-- options-table:start [^\n]*-->\n\n(.*?)\n<!-- options-table:end -->", re.DOTALL)


def main() -> int:
    text = README.read_text(encoding="utf-8")
    match = TABLE.search(text)
    if match is None:
        print(f"{README.name}: no options-table markers; put the table between them", file=sys.stderr)
        return 1
    new = text[: match.start(1)] + options_table() + text[match.end(1) :]
    if new == text:
        print(f"{README.name}: the options table is up to date")
    else:
        README.write_text(new, encoding="utf-8")
        print(f"{README.name}: options table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
