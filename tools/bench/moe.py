"""Mixture-of-experts layers on QNN: transformers' default grouped_mm experts in qnnx's dense and gathered forms,
against transformers' batched_mm.

A one-layer Mixtral decoder (hidden 32, expert width 64, 2 experts per token, random init) with 4 to 128 experts,
at a prefill of 16 tokens and a decode-sized call of 1 token, compiled with ``torch.compile(backend="qnn")`` on the
HTP simulator three times: transformers' default experts implementation (``grouped_mm``) in qnnx's dense form (every
token-expert pair by every expert; forced with ``max_gathered_expert_bytes=0``), in its gathered form (each pair
gathers its expert's weights; forced with ``max_dense_experts=1``), and ``set_experts_implementation("batched_mm")``.
Per case: the first call, the fastest and the median of the steady calls, the ONNX nodes, whether the graph ran
wholly on QNN and the cosine of the logits against eager. The section replaces the one between the moe markers of
``<out>/benchmarks.md``. On x86_64 the simulator's latencies say nothing about a Snapdragon; the ratio between the
forms at the same size is what the choice between them and the default of ``max_dense_experts`` are read from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _report import write_section

ROOT = Path(__file__).resolve().parents[2]


# qnnx's form of the grouped product, forced by its options (the default chooses per graph).
FORMS = {
    "dense": {"max_dense_experts": 1024, "max_gathered_expert_bytes": 0},
    "gathered": {"max_dense_experts": 1},
    "batched_mm": {},
}


def _model(experts: int, implementation: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
        num_experts_per_tok=2,
        num_local_experts=experts,
    )
    model = transformers.MixtralForCausalLM(config).eval()
    if implementation == "batched_mm":
        model.set_experts_implementation(implementation)
    return model


def measure(experts: int, tokens: int, implementation: str, runs: int) -> dict[str, Any]:
    import torch

    import qnnx_backend

    model = _model(experts, implementation)
    ids = torch.randint(0, 128, (1, tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    options = {"soc_model": 60, "verify": False, **FORMS[implementation]}
    compiled = torch.compile(lambda t: model(input_ids=t).logits, backend="qnn", options=options)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        out = compiled(ids)
        first = time.perf_counter() - t0
        steady = []
        for _ in range(runs):
            t0 = time.perf_counter()
            compiled(ids)
            steady.append(time.perf_counter() - t0)
    reports = list(qnnx_backend.compile_reports())
    cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
    return {
        "experts": experts,
        "tokens": tokens,
        "implementation": implementation,
        "first_s": first,
        # The fastest call: the least disturbed by other processes on a shared machine (the median is kept too).
        "steady_ms": 1000 * min(steady),
        "median_ms": 1000 * statistics.median(steady),
        "onnx_nodes": sum(r.onnx_nodes or 0 for r in reports),
        "wholly_on_qnn": bool(reports) and all(r.device == "npu" and not r.cpu_nodes for r in reports),
        "cosine": float(cos),
    }


def _table(results: list[dict[str, Any]], started: str, minutes: float, load: float) -> str:
    by = {(r["experts"], r["tokens"], r["implementation"]): r for r in results}
    lines = [
        "## Mixture of experts: grouped_mm's dense and gathered forms against batched_mm (HTP simulator)",
        "",
        f"One run, {started}, {platform.machine()}, {minutes:.1f} min, load average {load:.1f} at the start (other "
        "processes on the machine make single timings noisy; the fastest of the steady calls is shown). A one-layer "
        "Mixtral (hidden 32, expert width 64, "
        '2 experts per token, random init) compiled with `torch.compile(backend="qnn")`: transformers\' default '
        "experts (`grouped_mm`) in qnnx's dense form (every token-expert pair by every expert) and in its gathered "
        "form (each pair gathers its expert's weights), each forced by the options, against "
        '`set_experts_implementation("batched_mm")`. By default qnnx gathers when a call has fewer pairs than '
        "experts (here: every 1-token call, and the 16-token calls from 64 experts on) and "
        "computes densely otherwise. Steady state: the fastest steady call, in ms on the simulator. Every case ran "
        "wholly on QNN unless marked.",
        "",
        "| experts | tokens | pairs | dense ms | gathered ms | batched_mm ms | dense / gathered | default form "
        "| gathered cosine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for experts, tokens in sorted({(r["experts"], r["tokens"]) for r in results}):
        if any((experts, tokens, form) not in by for form in FORMS):
            continue
        row = [by[(experts, tokens, form)] for form in FORMS]
        dense, gathered = row[0], row[1]
        cells = [f"{r['steady_ms']:.1f}" + ("" if r["wholly_on_qnn"] else " (not wholly on QNN)") for r in row]
        pairs = 2 * tokens
        default = "gathered" if pairs < experts or experts > 32 else "dense"
        lines.append(
            f"| {experts} | {tokens} | {pairs} | {' | '.join(cells)} "
            f"| {dense['steady_ms'] / gathered['steady_ms']:.2f} | {default} | {gathered['cosine']:.6f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--experts", default="4,8,16,32,64,128")
    parser.add_argument("--tokens", default="1,16")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    started, t0 = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), time.perf_counter()
    load = os.getloadavg()[0]
    results = []
    for experts in (int(x) for x in args.experts.split(",")):
        for tokens in (int(x) for x in args.tokens.split(",")):
            for implementation in FORMS:
                print(f"moe: {experts} experts, {tokens} tokens, {implementation} ...", file=sys.stderr, flush=True)
                result = measure(experts, tokens, implementation, args.runs)
                print(json.dumps(result), file=sys.stderr, flush=True)
                results.append(result)
    section = _table(results, started, (time.perf_counter() - t0) / 60, load)
    (args.out / "benchmarks-moe.json").write_text(json.dumps(results, indent=1) + "\n")
    print(write_section(args.out / "benchmarks.md", "moe", section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
