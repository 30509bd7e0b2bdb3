"""The report's plot: first calls, steady state, a cold first call by stage, and peak memory (needs matplotlib)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from _figures import STAGES, Cells, get_first, get_mem, get_steady, median, stages


def plot(cells: Cells, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    configs = cells.configs
    labels = [f"{m}\nb{b}" for m, b in configs]
    x = list(range(len(configs)))
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))

    def bars(ax: Any, series: list[tuple[str, list[float | None]]], ylabel: str, title: str, log: bool) -> None:
        width = 0.8 / max(len(series), 1)
        for i, (name, values) in enumerate(series):
            xs = [xi + (i - (len(series) - 1) / 2) * width for xi in x]
            ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)

    def series(variant: str, phase: str, get: Callable) -> list[float | None]:
        return [cells.value(variant, phase, m, b, get) for m, b in configs]

    bars(
        axes[0][0],
        [
            ("qnnx cold", series("qnnx", "cold", get_first)),
            ("qnnx warm", series("qnnx", "warm", get_first)),
            ("qnnx AOT warm", series("qnnx-aot", "warm", get_first)),
            ("OpenVINO cold", series("openvino", "cold", get_first)),
            ("OpenVINO+cache warm", series("openvino-cache", "warm", get_first)),
            ("Inductor cold", series("inductor", "cold", get_first)),
            ("Inductor warm", series("inductor", "warm", get_first)),
        ],
        "seconds (log)",
        "First call of the compiled model (fresh process, imports excluded)",
        True,
    )
    bars(
        axes[0][1],
        [
            ("eager", series("qnnx", "warm", get_steady("eager"))),
            ("qnnx (HTP simulator)", series("qnnx", "warm", get_steady("compiled"))),
            ("raw ORT (HTP simulator)", series("qnnx", "warm", get_steady("raw_ort"))),
            ("OpenVINO CPU", series("openvino-cache", "warm", get_steady("compiled"))),
            ("Inductor CPU", series("inductor", "warm", get_steady("compiled"))),
        ],
        "ms per call (log)",
        "Steady-state latency (HTP figures are the host simulator's, not a Snapdragon's)",
        True,
    )
    ax = axes[1][0]
    bottom = [0.0] * len(configs)
    cmap = plt.get_cmap("tab20")
    for i, (key, label) in enumerate(STAGES):
        vals = []
        for m, b in configs:
            runs = cells.runs("qnnx", "cold", m, b)
            vals.append(median(stages(r).get(key) for r in runs.values()) or 0.0)
        ax.bar(x, vals, 0.6, bottom=bottom, label=label, color=cmap(i))
        bottom = [a + max(v, 0) for a, v in zip(bottom, vals)]
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("qnnx cold first call by stage", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    bars(
        axes[1][1],
        [
            (
                "weights",
                [
                    median(r["weight_bytes"] / 2**20 for r in cells.runs("qnnx", "cold", m, b).values())
                    for m, b in configs
                ],
            ),
            ("qnnx cold", [v / 2**20 if v else None for v in series("qnnx", "cold", get_mem)]),
            ("qnnx warm", [v / 2**20 if v else None for v in series("qnnx", "warm", get_mem)]),
            ("OpenVINO cold", [v / 2**20 if v else None for v in series("openvino", "cold", get_mem)]),
            ("Inductor cold", [v / 2**20 if v else None for v in series("inductor", "cold", get_mem)]),
        ],
        "MiB",
        "Peak memory of the first call above the baseline, and weight bytes",
        False,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
