"""Narrowing a QNN graph finalize failure: trials and seconds against the graph's size.

Usage: ``python tools/bench/narrowing.py [--out docs] [--nodes 16,64,256,1024]``. Each graph is a chain of
MatMul -> Add -> Relu blocks on a ``[5, 5, 5, 5]`` tensor with, half-way, the Gather of ``tensor.unfold(0, 3, 1)``
(windows along the first axis), which QNN HTP fails to finalize (``QNN_COMMON_ERROR_MEM_ALLOC``, onnxruntime-qnn
2.7.0). ``qnnx_opcheck.narrow_failure`` finds it; the section reports the trials (sessions of parts, each built in a
child process), their bound ``2 + 2 ceil(log2 nodes)``, the seconds, and whether the run found is that Gather
alone. The section replaces the one between the narrowing markers of ``<out>/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _report import write_section

ROOT = Path(__file__).resolve().parents[2]


def _chain(nodes: int) -> Any:
    """About ``nodes`` ONNX nodes: blocks of MatMul, Add, Relu, with the unfold's Gather in the middle."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = max(1, (nodes - 1) // 3)
    inits = [
        numpy_helper.from_array((rng.standard_normal((5, 5)) / 3).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(5, np.float32), "b"),
        numpy_helper.from_array(np.array([[0, 1, 2], [1, 2, 3], [2, 3, 4]], np.int64), "windows"),
    ]
    graph_nodes, value = [], "x"
    for k in range(blocks):
        if k == blocks // 2:
            graph_nodes.append(helper.make_node("Gather", [value, "windows"], ["unfolded"], name="unfold", axis=0))
            graph_nodes.append(helper.make_node("ReduceMean", ["unfolded"], ["folded"], keepdims=0, axes=[1]))
            value = "folded"
        graph_nodes += [
            helper.make_node("MatMul", [value, "w"], [f"m{k}"], name=f"matmul_{k}"),
            helper.make_node("Add", [f"m{k}", "b"], [f"a{k}"], name=f"add_{k}"),
            helper.make_node("Relu", [f"a{k}"], [f"r{k}"], name=f"relu_{k}"),
        ]
        value = f"r{k}"
    graph = helper.make_graph(
        graph_nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 5, 5, 5])],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, [3, 5, 5, 5])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def measure(nodes: int) -> dict[str, Any]:
    import qnnx_opcheck

    model = _chain(nodes)
    count = len(model.graph.node)
    t = time.perf_counter()
    report = qnnx_opcheck.narrow_failure(model, soc_model=60)
    seconds = time.perf_counter() - t
    return {
        "nodes": count,
        "trials": report.trials,
        "bound": 2 + 2 * math.ceil(math.log2(count)),
        "seconds": seconds,
        "found": list(report.nodes),
        "error": report.error,
    }


def _table(results: list[dict[str, Any]], started: str, minutes: float) -> str:
    lines = [
        "## Narrowing a QNN graph finalize failure (HTP simulator)",
        "",
        f"One run, {started}, {platform.machine()}, {minutes:.1f} min. A chain of MatMul -> Add -> Relu blocks with "
        "the Gather of `tensor.unfold(0, 3, 1)` half-way, which QNN fails to finalize; `qnnx_opcheck.narrow_failure` "
        "builds sessions of parts of the graph, each in a child process (starting it and importing onnxruntime take "
        "0.8 s of each trial here). *Bound*: `2 + 2 ceil(log2 nodes)`.",
        "",
        "| ONNX nodes | trials | bound | seconds | seconds per trial | found |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        found = ", ".join(r["found"]) or "nothing"
        per = r["seconds"] / max(r["trials"], 1)
        lines.append(f"| {r['nodes']} | {r['trials']} | {r['bound']} | {r['seconds']:.1f} | {per:.2f} | {found} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--nodes", default="16,64,256,1024")
    args = parser.parse_args(argv)
    started, t0 = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), time.perf_counter()
    results = []
    for nodes in (int(x) for x in args.nodes.split(",")):
        print(f"narrowing: about {nodes} nodes ...", file=sys.stderr, flush=True)
        results.append(measure(nodes))
    section = _table(results, started, (time.perf_counter() - t0) / 60)
    (args.out / "benchmarks-narrowing.json").write_text(json.dumps(results, indent=1) + "\n")
    print(write_section(args.out / "benchmarks.md", "narrowing", section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
