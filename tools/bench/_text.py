"""How one figure is written in the report: numbers, verdicts against a target, MiB, Markdown tables, table cells."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _figures import Cells
from _targets import Target


def num(value: float | None, digits: int = 2, scale: float = 1.0) -> str:
    if value is None:
        return "–"
    v = value * scale
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.{digits}f}"


def verdict(value: float | None, target: Target) -> str:
    """The value and whether it is within the target (✓) or not (✗)."""
    if value is None:
        return "–"
    return f"{value:.2f} {'✓' if value <= target.bound else '✗'}"


def mib(value: float | None) -> str:
    return num(value, 1, 1 / 2**20)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def cell(cells: Cells, variant: str, phase: str, model: str, batch: int, get: Callable, **kw: Any) -> str:
    v = cells.value(variant, phase, model, batch, get)
    if v is None and cells.failure(variant, phase, model, batch):
        return "failed"
    return num(v, **kw) + cells.fallback(variant, phase, model, batch)


def aot_cell(cells: Cells, model: str, batch: int, get: Callable[[dict], Any]) -> str:
    v = cells.value("qnnx-aot", "warm", model, batch, get)
    if v is None:
        failed = cells.failure("qnnx-aot", "warm", model, batch) or cells.failure("qnnx-aot", "save", model, batch)
        return "failed" if failed else "–"
    return num(v)
