"""Turn the raw results of run.py into docs/benchmarks.md, docs/benchmarks.png and a summary dict, and keep the
sections other tools write into benchmarks.md.

The figures are read by ``_figures``, judged against ``_targets.TARGETS``, written as prose and tables by
``_sections`` (and ``_sections_detail``) and drawn by ``_plots``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from _figures import Cells, summarize
from _plots import plot
from _sections import markdown

__all__ = ["kept_sections", "model_table", "summarize", "write", "write_section"]


def model_table(names: Iterable[str]) -> dict[str, str]:
    """Model name -> its one-line description."""
    import _models

    return {name: _models.MODELS[name][2] for name in names}


# Sections that other tools write at the end of benchmarks.md, each between its own markers (generation.py:
# ``<!-- generation:start -->`` ... ``<!-- generation:end -->``; quantization.py likewise).
_SECTION = re.compile(r"<!-- ([a-z0-9_-]+):start -->.*?<!-- \1:end -->", re.DOTALL)


def kept_sections(text: str) -> str:
    """Every marked section of an existing benchmarks.md, markers included, in order ("" when it has none)."""
    return "\n\n".join(m.group(0) for m in _SECTION.finditer(text))


def write_section(md: Path, name: str, body: str) -> str:
    """Put ``body`` between the ``name`` markers of ``md`` (in place of what is there, or appended), and return
    the section with its markers."""
    section = f"<!-- {name}:start -->\n{body}\n<!-- {name}:end -->"
    text = md.read_text() if md.exists() else "# qnnx benchmarks\n"
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start in text and end in text:
        text = text[: text.index(start)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    md.write_text(text)
    return section


def write(data: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write benchmarks.md and benchmarks.png into ``out``; returns the summary.

    The sections other tools wrote into benchmarks.md between their markers (``<!-- generation:start -->`` and
    ``<!-- generation:end -->`` from generation.py, and the like) are kept at the end of the new file.
    """
    summary = summarize(data)
    cells = Cells(data["results"])
    png = out / "benchmarks.png"
    plotted = plot(cells, png)
    md = out / "benchmarks.md"
    kept = kept_sections(md.read_text(encoding="utf-8")) if md.exists() else ""
    text = "\n".join(markdown(data, cells, summary, png.name if plotted else None)) + "\n"
    md.write_text(text + ("\n" + kept + "\n" if kept else ""), encoding="utf-8")
    return summary
