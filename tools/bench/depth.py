"""Depth scaling: qnnx's own compile steps against a decoder's depth (tiny Llama, 2 to 24 layers).

Usage: ``python tools/bench/depth.py [--out docs] [--layers 2,4,8,16,24]``. Each depth runs in a fresh process
(``--child N``): ``compile_for_generation`` with a static cache, then a greedy ``generate`` of two new tokens, so that
both the prefill and the decode graph compile on QNN. The section it writes replaces the one between the depth
markers of ``<out>/benchmarks.md``.

What it reports per graph (prefill, decode), from each graph's ``CompileReport.timings``: qnnx's export (ATen trace,
write lifting, translation and rewrite passes) and its operator check, in total and per layer, and ORT+QNN's session
creation beside them. The steps of ours must grow linearly with depth: a flat time per layer.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _report import write_section

ROOT = Path(__file__).resolve().parents[2]
GRAPHS = ("prefill", "decode")


def child(layers: int) -> dict[str, Any]:
    """Compile and run a ``layers``-deep tiny Llama; return each graph's compile timings."""
    import torch
    import transformers

    import qnnx_backend
    from qnnx_backend.hf import compile_for_generation

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    compile_for_generation(model, max_cache_len=32, options={"soc_model": 60})
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=2, do_sample=False)
    reports = qnnx_backend.compile_reports()
    graphs = {}
    for name, report in zip(GRAPHS, reports, strict=False):
        t = dict(report.timings)
        ours = t.get("analyze", 0.0) + t.get("export", 0.0) + sum(v for k, v in t.items() if k.startswith("opcheck"))
        session = sum(v for k, v in t.items() if k.startswith("session"))
        graphs[name] = {"ours_s": ours, "session_s": session, "onnx_nodes": report.onnx_nodes, "on_qnn": report.on_qnn}
    return {"layers": layers, "graphs": graphs}


def _run_child(layers: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(layers)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(results: list[dict[str, Any]], started: str, minutes: float) -> str:
    lines = [
        "## Depth scaling (tiny Llama, hidden 32, 2 to 24 layers)",
        "",
        f"One run, {started}, {platform.machine()}, {minutes:.1f} min; one fresh process per depth. *Ours* is "
        "qnnx's analysis, export (ATen trace, write lifting, translation, passes) and operator check of the graph; "
        "*session* is ONNX Runtime + QNN creating the session (the HTP simulator here). Per layer: ours / layers.",
        "",
        "| layers | graph | ONNX nodes | on QNN | ours (s) | ours per layer (ms) | session (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for name in GRAPHS:
            g = r["graphs"].get(name)
            if g is None:
                continue
            per = 1000 * g["ours_s"] / r["layers"]
            lines.append(
                f"| {r['layers']} | {name} | {g['onnx_nodes']} | {'yes' if g['on_qnn'] else 'no'} | "
                f"{g['ours_s']:.2f} | {per:.0f} | {g['session_s']:.2f} |"
            )
    first, last = results[0], results[-1]
    for name in GRAPHS:
        a, b = first["graphs"].get(name), last["graphs"].get(name)
        if a and b:
            ratio = (b["ours_s"] / last["layers"]) / (a["ours_s"] / first["layers"])
            lines.append("")
            lines.append(
                f"{name}: time per layer at {last['layers']} layers / at {first['layers']} layers = {ratio:.2f}."
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--layers", default="2,4,8,16,24")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    depths = [int(x) for x in args.layers.split(",")]
    started, t0 = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), time.perf_counter()
    results = []
    for layers in depths:
        print(f"depth: {layers} layers ...", file=sys.stderr, flush=True)
        results.append(_run_child(layers))
    section = _table(results, started, (time.perf_counter() - t0) / 60)
    (args.out / "benchmarks-depth.json").write_text(json.dumps(results, indent=1) + "\n")
    print(write_section(args.out / "benchmarks.md", "depth", section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
