"""The int4 decoder recipe at a published 0.5B-class width: every graph quantized on the NPU (the HTP simulator here).

Usage: ``python tools/bench/large_quant.py [--out docs] [--layers 2] [--max-graph-mib 256] [--new-tokens 4]
[--float-from docs/benchmarks-large-quant.json]``.
Two fresh processes (``--child``), each building the same random-init decoder with Qwen2.5-0.5B's published
configuration (``large.py``'s; ``--layers`` may cut its 24 layers to fit a machine, and the report says so):

- ``llm-a16w4``: ``compile_for_generation`` with ``quantize="llm-a16w4"`` and the context cache on (in a temporary
  folder, to measure the contexts' bytes), ``calibrate(model)`` over a few short prompts through ``generate()``,
  then ``generate(max_new_tokens=...)`` on a held-out prompt;
- ``float``: the same model, options and prompt without ``quantize``, for its contexts' bytes.

What it reports per graph (prefill, decode): on QNN or not, whether it runs as a QDQ graph, its weights by scheme
(int4 blocks, int4 per channel, 8-bit, 16-bit, and the Linear layers left in float), its SQNR and cosine against
float eager PyTorch on the calibration samples, its contexts' bytes against the float graph's, and the compile time
per stage; then peak RSS and the generated tokens' agreement with eager PyTorch (teacher forcing). The section it
writes replaces the one between the ``large-quant`` markers of ``<out>/benchmarks.md``. Random weights say little of
a quantized model's quality: the SQNR is the figure, not the tokens.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _report import write_section
from large import CONFIG, _Peaks, _rss, _status_kib, _teacher_forcing

ROOT = Path(__file__).resolve().parents[2]
SCHEME = "llm-a16w4"
LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down
_WEIGHT = re.compile(r"^(?P<type>[a-z0-9]+)(?P<form>[^:]*): (?P<count>\d+) (?P<op>\w+) in (?P<module>\S+)$")


def _schemes(weights: tuple[str, ...] | list[str], layers: int) -> dict[str, int]:
    """Count a graph's MatMul/Gemm weights by scheme from its ``QuantizationReport.weights`` lines; the decoder's
    Linear layers (7 per layer and the head) that no line names are the ones left in float."""
    counts = {"int4 blocks": 0, "int4 per-channel": 0, "8-bit": 0, "16-bit": 0, "other": 0}
    linear = 0
    for line in weights:
        m = _WEIGHT.match(line)
        if m is None or m["op"] not in ("MatMul", "Gemm"):
            continue
        n = int(m["count"])
        linear += n
        if m["type"] == "int4":
            counts["int4 blocks" if m["form"].startswith(" blocks") else "int4 per-channel"] += n
        elif m["type"] in ("int8", "uint8"):
            counts["8-bit"] += n
        elif m["type"] in ("int16", "uint16"):
            counts["16-bit"] += n
        else:
            counts["other"] += n
    counts["float"] = max(0, LINEARS_PER_LAYER * layers + 1 - linear)
    return counts


def child(
    layers: int,
    quantize: bool,
    max_graph_bytes: int | None,
    new_tokens: int,
    samples: int,
    module_weight_types: dict[str, str] | None = None,
) -> dict[str, Any]:
    import torch
    import transformers

    import qnnx_backend
    from qnnx_backend.hf import compile_for_generation

    torch.manual_seed(0)
    config = transformers.Qwen2Config(**{**CONFIG, "num_hidden_layers": layers}, attn_implementation="sdpa")
    model = transformers.Qwen2ForCausalLM(config).eval()
    eager_forward = model.forward
    params = sum(p.numel() for p in model.parameters())
    loaded_rss, loaded_anon = _rss(), _status_kib("RssAnon")
    peaks = _Peaks()
    gen = torch.Generator().manual_seed(1)
    calibration = [torch.randint(3, config.vocab_size, (1, n), generator=gen) for n in (7, 10, 12)]
    prompt = torch.randint(3, config.vocab_size, (1, 9), generator=gen)
    generate = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}

    cache_dir = Path(tempfile.mkdtemp(prefix="qnnx-bench-large-quant-"))
    options: dict[str, Any] = {"soc_model": 60, "cache": True, "cache_dir": str(cache_dir)}
    if quantize:
        options["quantize"] = {"scheme": SCHEME, "module_weight_types": module_weight_types or {}}
    if max_graph_bytes is not None:
        options["max_graph_bytes"] = max_graph_bytes
    compile_for_generation(model, max_cache_len=32, options=options)
    calibrate_s = 0.0
    with torch.no_grad():
        if quantize:
            t0 = time.perf_counter()
            with qnnx_backend.calibrate(model, max_samples=samples):
                for ids in calibration:
                    model.generate(ids, **generate)
            calibrate_s = time.perf_counter() - t0  # eager generation, then quantize + compile + check each graph
        calibrate_peak_anon, after_calibrate_anon = peaks.anon, _status_kib("RssAnon")
        t0 = time.perf_counter()
        got = model.generate(prompt, **generate, output_logits=True, return_dict_in_generate=True)
        first_generate = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peaks.stop()
        t0 = time.perf_counter()
        warm = model.generate(prompt, **generate, output_logits=True, return_dict_in_generate=True)
        warm_generate = time.perf_counter() - t0
        # eager PyTorch on the sequence generated (teacher forcing): its logits at the generated positions
        logits = eager_forward(input_ids=got.sequences).logits[0, prompt.shape[1] - 1 : -1]
    eager = type("Eager", (), {"logits": [row[None] for row in logits]})()
    agreement = _teacher_forcing(got, eager)

    graphs = []
    for name, report in zip(("prefill", "decode"), qnnx_backend.compile_reports(), strict=False):
        t = dict(report.timings)
        q = report.quantization
        graphs.append({
            "graph": name,
            "input_shapes": [list(s) for s in report.input_shapes],
            "on_qnn": report.on_qnn,
            "reason": report.reason,
            "placement": dict(report.placement),
            "cpu_nodes": dict(report.cpu_nodes),
            "onnx_nodes": report.onnx_nodes,
            "parts": [p.weight_bytes for p in report.parts],
            "weight_bytes": report.weight_bytes,
            "context_bytes": report.context_bytes,
            "quantized": None if q is None else q.used,
            "quant_reason": None if q is None else q.reason,
            "sqnr_db": None if q is None else q.sqnr_db,
            "cosine": None if q is None else q.cosine,
            "calibration_samples": None if q is None else q.samples,
            "weights": [] if q is None else list(q.weights),
            "schemes": _schemes(() if q is None else q.weights, layers),
            "timings": t,
        })  # fmt: skip
    context_bytes = sum(p.stat().st_size for p in cache_dir.rglob("*") if p.is_file())
    shutil.rmtree(cache_dir, ignore_errors=True)  # about 1 GB per run at 2 layers
    return {
        "scheme": SCHEME if quantize else "float",
        "layers": layers,
        "params": params,
        "max_graph_bytes": max_graph_bytes,
        "loaded_rss": loaded_rss,
        "peak_rss": peak,
        "loaded_anon": loaded_anon,
        "peak_anon": peaks.anon,
        "calibrate_peak_anon": calibrate_peak_anon,
        "after_calibrate_anon": after_calibrate_anon,
        "graphs": graphs,
        "context_bytes": context_bytes,
        "calibrate_s": calibrate_s,
        "first_generate_s": first_generate,
        "warm_generate_s": warm_generate,
        "warm_same": bool(torch.equal(warm.sequences, got.sequences)),
        **agreement,
    }


def _stages(t: dict[str, float]) -> str:
    ours = t.get("analyze", 0.0) + t.get("export", 0.0) + sum(v for k, v in t.items() if k.startswith("opcheck"))
    session = sum(v for k, v in t.items() if k.startswith("session"))
    return (
        f"{ours:.0f} / {t.get('quantize', 0.0):.0f} / {t.get('plan_parts', 0.0):.0f} / {session:.0f} / "
        f"{t.get('quantize_check', 0.0):.0f} / {t.get('total', 0.0):.0f}"
    )


def _table(
    q: dict[str, Any], f: dict[str, Any] | None, started: str, minutes: float, float_started: str | None = None
) -> str:
    gib, mib = 2**30, 2**20
    cut = q["layers"] < 24
    floats = {g["graph"]: g for g in (f or {}).get("graphs", [])}
    budget = "default" if q["max_graph_bytes"] is None else f"{q['max_graph_bytes'] / mib:.0f} MiB"
    lines = [
        f"## The int4 recipe at 0.5B-class width (`{SCHEME}`, Qwen2.5-0.5B configuration, {q['layers']} of 24 layers, "
        "random init)",
        "",
        f"One run, {started}, {platform.machine()} (HTP simulator, soc 60), {minutes:.1f} min; each scheme in one "
        f"fresh process. {q['params'] / 1e6:.0f}M parameters, `max_graph_bytes` {budget}, context cache on. "
        f"Calibration: `calibrate(model, max_samples=...)` over 3 prompts of 7-12 tokens through `generate()`; "
        "SQNR and cosine are each graph's worst output against float eager PyTorch on those samples. Random weights "
        "say little of a quantized model's quality: the SQNR is the figure here, not the tokens."
        + (" Layers were cut to fit the machine's time." if cut else "")
        + (
            f" The float figures are reused from the float run of {float_started} (`--float-from`)."
            if float_started
            else ""
        ),
        "",
        "| graph | on QNN | QDQ | weights: int4 blocks / int4 per-channel / 8-bit / 16-bit / float | SQNR (dB) | "
        "cosine | weights MiB as held (float) | context MiB (float) | ratio | stages (s): ours / quantize / parts / session / check / total |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in q["graphs"]:
        s = g["schemes"]
        fl = floats.get(g["graph"])
        ctx, fctx = g["context_bytes"], (fl or {}).get("context_bytes")
        ratio = f"{ctx / fctx:.2f}" if ctx and fctx else "–"
        where = "wholly" if set(g["placement"]) == {"QNNExecutionProvider"} else json.dumps(g["placement"])
        where += f", {len(g['parts'])} parts" if g["parts"] else ""
        sqnr = "–" if g["sqnr_db"] is None else f"{g['sqnr_db']:.1f}"
        cos = "–" if g["cosine"] is None else f"{g['cosine']:.5f}"
        qdq = "yes" if g["quantized"] else f"no ({g['quant_reason']})"
        lines.append(
            f"| {g['graph']} | {where} | {qdq} | {s['int4 blocks']} / {s['int4 per-channel']} / {s['8-bit']} / "
            f"{s['16-bit']} / {s['float']} | {sqnr} | {cos} | "
            f"{(g['weight_bytes'] or 0) / mib:.0f} ({((fl or {}).get('weight_bytes') or 0) / mib:.0f}) | "
            f"{(ctx or 0) / mib:.0f} ({(fctx or 0) / mib:.0f}) | {ratio} | {_stages(g['timings'])} |"
        )
    above = q["peak_rss"] - q["loaded_rss"]
    lines += [
        "",
        "- Weights by scheme and module (prefill; decode alike): "
        + "; ".join(f"`{w}`" for w in q["graphs"][0]["weights"])
        + ".",
    ]
    if f is not None:
        table = CONFIG["vocab_size"] * CONFIG["hidden_size"]
        blocks = q["graphs"][-1]["weight_bytes"] - table - table - 4 * CONFIG["vocab_size"]
        blocks_float = f["graphs"][-1]["weight_bytes"] - 2 * table
        lines.append(
            f"- The decoder blocks' weights as held (the graph's, less the vocabulary's {table / 1e6:.0f}M-entry table "
            "as uint8 and the head as int8 with a float32 scale per row; in float, less the one fp16 table that "
            f"the tied head shares): {blocks / mib:.1f} MiB against {blocks_float / mib:.1f} MiB in fp16, "
            f"{blocks / blocks_float:.2f}. The vocabulary's table and head hold the rest: at this width they are "
            "most of a graph's bytes."
        )
        lines.append(
            f"- Contexts on disk, both graphs: {q['context_bytes'] / gib:.2f} GiB quantized against "
            f"{f['context_bytes'] / gib:.2f} GiB float (fp16 weights): {q['context_bytes'] / f['context_bytes']:.2f}."
        )
    lines += [
        f"- Memory: {q['loaded_rss'] / gib:.2f} GiB after building the model, peak {q['peak_rss'] / gib:.2f} GiB "
        f"({above / gib:.2f} GiB above it; {above / (q['params'] * 4):.2f} bytes per float32 weight byte)"
        + (f"; the float run peaked at {f['peak_rss'] / gib:.2f} GiB." if f is not None else ".")
        + (
            f" The process's own (anonymous) memory peaked at {q['calibrate_peak_anon'] / gib:.2f} GiB inside the "
            "calibration block (quantization, compile and check of both graphs) and held "
            f"{q['after_calibrate_anon'] / gib:.2f} GiB after it (the model, both quantized sessions)."
            if "calibrate_peak_anon" in q
            else ""
        ),
        f"- Calibration block (eager generation, then each graph quantized, compiled and checked): "
        f"{q['calibrate_s']:.0f} s; first quantized `generate()` ({q['steps']} tokens): {q['first_generate_s']:.0f} s; "
        f"warm: {q['warm_generate_s']:.1f} s (same tokens: {'yes' if q['warm_same'] else 'no'}).",
        f"- Against eager PyTorch by teacher forcing: argmax agrees on {q['argmax_agree']}/{q['steps']} steps, "
        f"lowest logits cosine {q['min_cosine']:.4f}"
        + (f" (float: {f['argmax_agree']}/{f['steps']}, {f['min_cosine']:.5f})." if f is not None else "."),
    ]
    return "\n".join(lines)


def _run_child(args: argparse.Namespace, quantize: bool) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", "--layers", str(args.layers), "--max-graph-mib",
           str(args.max_graph_mib), "--new-tokens", str(args.new_tokens), "--samples", str(args.samples)]  # fmt: skip
    if not quantize:
        cmd.append("--float")
    if args.module_weight_types:
        cmd += ["--module-weight-types", args.module_weight_types]
    print(f"large_quant: {'float' if not quantize else SCHEME}, {args.layers} layers ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        print(out.stderr[-4000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--layers", type=int, default=2, help="of 24; 2 fit this machine's time (see the section)")
    parser.add_argument("--max-graph-mib", type=int, default=256, help="0: the default budget")
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4, help="calibration samples kept per graph")
    parser.add_argument("--no-float", action="store_true", help="skip the float run (no context ratio)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the section from <out>'s JSON")
    parser.add_argument("--float-from", type=Path, help="reuse the float run of this earlier JSON (same layers)")
    parser.add_argument(
        "--module-weight-types", help='JSON on top of the recipe\'s, e.g. \'{"embed_tokens": "uint16"}\''
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--float", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    budget = args.max_graph_mib * 2**20 if args.max_graph_mib else None
    if args.child:
        types = json.loads(args.module_weight_types) if args.module_weight_types else None
        print(json.dumps(child(args.layers, not args.float, budget, args.new_tokens, args.samples, types)))
        return 0
    if args.report_only:
        run = json.loads((args.out / "benchmarks-large-quant.json").read_text())
        section = _table(run["quantized"], run["float"], run["started"], run["minutes"], run.get("float_started"))
        print(write_section(args.out / "benchmarks.md", "large-quant", section))
        return 0
    started, t0 = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), time.perf_counter()
    quant = _run_child(args, quantize=True)
    if quant is None:
        return 1
    float_started = None
    if args.float_from is not None:
        earlier = json.loads(args.float_from.read_text())
        flt, float_started = earlier["float"], earlier.get("float_started", earlier["started"])
        if flt is None or flt["layers"] != args.layers:
            print(f"large_quant: {args.float_from} holds no float run at {args.layers} layers", file=sys.stderr)
            return 1
    else:
        flt = None if args.no_float else _run_child(args, quantize=False)
        if flt is None and not args.no_float:
            return 1
    minutes = (time.perf_counter() - t0) / 60
    run = {"started": started, "minutes": minutes, "quantized": quant, "float": flt, "float_started": float_started}
    (args.out / "benchmarks-large-quant.json").write_text(json.dumps(run, indent=1) + "\n")
    section = _table(quant, flt, started, minutes, float_started)
    print(write_section(args.out / "benchmarks.md", "large-quant", section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
