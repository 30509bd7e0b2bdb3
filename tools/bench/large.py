"""A decoder at a published 0.5B-class width on the NPU (the HTP simulator here): compile, memory, parts, tokens.

Usage: ``python tools/bench/large.py [--out docs] [--layers 24] [--max-graph-mib 256] [--new-tokens 8]``. One fresh
process (``--child``) builds a random-init decoder with Qwen2.5-0.5B's published configuration (hidden 896,
intermediate 4864, 14 heads / 2 KV heads, vocab 151936, tied embeddings; ``--layers`` may cut its 24 layers to fit
a machine, and the report says so), compiles it with ``compile_for_generation`` (context cache on, in a temporary
folder, to measure the contexts' bytes) and generates greedily, then runs the same prompt in eager PyTorch.

What it reports: the cold compile per stage (qnnx's analysis, export and operator check; ORT+QNN's session
creation), peak RSS above the loaded model (against 2.5 bytes per float32 weight byte), the parts of each graph
and the contexts' bytes on disk, time to first token and per token on the simulator (and qnnx's host time per
decode step above ``InferenceSession.run``), eager's per-token time, and agreement with eager by teacher forcing.
The section it writes replaces the one between the ``large`` markers of ``<out>/benchmarks.md``. Simulator
figures say nothing about a device's speed; they show that the compile and the parts work at this size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {  # Qwen2.5-0.5B's published configuration
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in bytes (Linux): RssAnon (the process's own memory) or RssFile (mapped files,
    such as the staged model's weight file that ONNX Runtime maps; the kernel can drop those pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


class _Peaks:
    """Peak anonymous and file-backed RSS, sampled every 0.2 s on a thread."""

    def __init__(self) -> None:
        import threading

        self.anon = self.file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.anon = max(self.anon, _status_kib("RssAnon"))
            self.file = max(self.file, _status_kib("RssFile"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def child(layers: int, max_graph_bytes: int | None, new_tokens: int, prompt_len: int) -> dict[str, Any]:
    import onnxruntime
    import torch
    import transformers

    import qnnx_backend
    from qnnx_backend.hf import compile_for_generation, generation_memory

    torch.manual_seed(0)
    config = transformers.Qwen2Config(**{**CONFIG, "num_hidden_layers": layers}, attn_implementation="sdpa")
    model = transformers.Qwen2ForCausalLM(config).eval()
    params = sum(p.numel() for p in model.parameters())
    loaded_rss = _rss()
    loaded_anon = _status_kib("RssAnon")
    peaks = _Peaks()
    prompt = torch.randint(3, config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    generate = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}

    # eager first (the reference), timed per forward call
    eager_times: list[float] = []
    forward = model.forward

    def timed_eager(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = forward(*a, **k)
        eager_times.append(time.perf_counter() - t)
        return out

    model.forward = timed_eager
    with torch.no_grad():
        eager = model.generate(prompt, **generate, cache_implementation="static", output_logits=True,
                               return_dict_in_generate=True)  # fmt: skip
    model.forward = forward

    cache_dir = Path(tempfile.mkdtemp(prefix="qnnx-bench-large-"))
    options: dict[str, Any] = {"soc_model": 60, "cache": True, "cache_dir": str(cache_dir)}
    if max_graph_bytes is not None:
        options["max_graph_bytes"] = max_graph_bytes
    compile_for_generation(model, max_cache_len=prompt_len + new_tokens + 4, options=options)
    compiled = model.forward
    run_s = [0.0]
    real_run = onnxruntime.InferenceSession.run

    def counted_run(self: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return real_run(self, *a, **k)
        finally:
            run_s[0] += time.perf_counter() - t

    onnxruntime.InferenceSession.run = counted_run  # type: ignore[method-assign]
    calls: list[tuple[float, float]] = []  # (seconds, of which in InferenceSession.run)

    def timed(*a: Any, **k: Any) -> Any:
        t, r = time.perf_counter(), run_s[0]
        out = compiled(*a, **k)
        calls.append((time.perf_counter() - t, run_s[0] - r))
        return out

    model.forward = timed
    t0 = time.perf_counter()
    with torch.no_grad():
        got = model.generate(prompt, **generate, output_logits=True, return_dict_in_generate=True)
    first_generate = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peaks.stop()
    cold_calls = list(calls)
    calls.clear()
    t0 = time.perf_counter()
    with torch.no_grad():
        warm = model.generate(prompt, **generate, output_logits=True, return_dict_in_generate=True)
    warm_generate = time.perf_counter() - t0
    onnxruntime.InferenceSession.run = real_run  # type: ignore[method-assign]

    reports = qnnx_backend.compile_reports()
    graphs = []
    for name, report in zip(("prefill", "decode"), reports, strict=False):
        t = dict(report.timings)
        ours = t.get("analyze", 0.0) + t.get("export", 0.0) + sum(v for k, v in t.items() if k.startswith("opcheck"))
        graphs.append({
            "graph": name,
            "on_qnn": report.on_qnn,
            "reason": report.reason,
            "attempts": [f"{a.device}: {'ok' if a.ok else a.reason}" for a in report.attempts],
            "placement": dict(report.placement),
            "onnx_nodes": report.onnx_nodes,
            "parts": [p.weight_bytes for p in report.parts],
            "ours_s": ours,
            "session_s": sum(v for k, v in t.items() if k.startswith("session")),
            "total_s": t.get("total", 0.0),
            "timings": t,
        })  # fmt: skip
    agreement = _teacher_forcing(got, eager)
    context_bytes = sum(p.stat().st_size for p in cache_dir.rglob("*") if p.is_file())
    memory = {k: v for k, v in generation_memory(model).to_dict().items() if k != "graphs"}
    shutil.rmtree(cache_dir, ignore_errors=True)  # about 2.5 GB of contexts per run at 24 layers
    return {
        "memory": memory,
        "layers": layers,
        "params": params,
        "max_graph_bytes": max_graph_bytes,
        "loaded_rss": loaded_rss,
        "peak_rss": peak,
        "loaded_anon": loaded_anon,
        "peak_anon": peaks.anon,
        "peak_file": peaks.file,
        "graphs": graphs,
        "context_bytes": context_bytes,
        "first_generate_s": first_generate,
        "warm_generate_s": warm_generate,
        "cold_calls": cold_calls,
        "first_token_s": calls[0][0] if calls else None,
        "per_token_s": sorted(c[0] for c in calls[1:])[len(calls[1:]) // 2] if len(calls) > 1 else None,
        "host_per_step_s": sorted(c[0] - c[1] for c in calls[1:])[len(calls[1:]) // 2] if len(calls) > 1 else None,
        "eager_first_token_s": eager_times[0],
        "eager_per_token_s": sorted(eager_times[1:])[len(eager_times[1:]) // 2],
        "same_tokens": bool(torch.equal(got.sequences, eager.sequences)),
        "warm_same": bool(torch.equal(warm.sequences, got.sequences)),
        **agreement,
    }


def _teacher_forcing(got: Any, eager: Any) -> dict[str, Any]:
    """Token agreement with eager where the sequences agree so far, and logits cosine per step."""
    import torch

    cosines, matches = [], 0
    for a, b in zip(got.logits, eager.logits, strict=True):
        a, b = a[0].double(), b[0].double()
        cosines.append(float(torch.nn.functional.cosine_similarity(a, b, dim=0)))
        matches += int(a.argmax() == b.argmax())
    return {"min_cosine": min(cosines), "argmax_agree": matches, "steps": len(cosines)}


def _table(r: dict[str, Any], started: str, minutes: float, cut: bool, load: float) -> str:
    gib = 2**30
    budget = "default" if r["max_graph_bytes"] is None else f"{r['max_graph_bytes'] / 2**20:.0f} MiB"
    above = r["peak_rss"] - r["loaded_rss"]
    weights_fp32 = r["params"] * 4
    m = r["memory"]
    lines = [
        f"## A 0.5B-class decoder (Qwen2.5-0.5B configuration, {r['layers']} of 24 layers, random init)",
        "",
        f"One run, {started}, {platform.machine()} (HTP simulator, soc 60), {minutes:.1f} min, 15-minute load "
        f"average {load:.1f} at the end (other processes on the machine stretch the times, not the memory); one "
        "fresh process. "
        f"{r['params'] / 1e6:.0f}M parameters, `max_graph_bytes` {budget}, context cache on. Simulator times show "
        "that the compile and the parts work at this size, not a device's speed."
        + (" Layers were cut to fit the machine." if cut else ""),
        "",
        "| graph | on QNN | ONNX nodes | parts (MiB of weights each) | ours (s) | ORT+QNN session (s) | total (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in r["graphs"]:
        parts = ", ".join(f"{b / 2**20:.0f}" for b in g["parts"]) or "1 context"
        lines.append(
            f"| {g['graph']} | {'wholly' if set(g['placement']) == {'QNNExecutionProvider'} else g['placement']} | "
            f"{g['onnx_nodes']} | {parts} | {g['ours_s']:.1f} | {g['session_s']:.1f} | {g['total_s']:.1f} |"
        )
    lines += [
        "",
        f"- Memory: {r['loaded_rss'] / gib:.2f} GiB after building the model, peak {r['peak_rss'] / gib:.2f} GiB: "
        f"{above / gib:.2f} GiB above it, {above / weights_fp32:.2f} bytes per float32 weight byte (bound 2.5). "
        f"Of the process's own (anonymous) memory the peak is {(r['peak_anon'] - r['loaded_anon']) / gib:.2f} GiB "
        f"above the loaded model ({(r['peak_anon'] - r['loaded_anon']) / weights_fp32:.2f} bytes per float32 weight "
        f"byte); mapped files peak at {r['peak_file'] / gib:.2f} GiB (the staged weight files ONNX Runtime maps, "
        "pages the kernel can drop).",
        f"- Contexts on disk (both graphs, every part): {r['context_bytes'] / gib:.2f} GiB; "
        f"`generation_memory`: {m['weight_bytes'] / gib:.2f} GiB of weights as the NPU holds them, "
        f"{m['weight_copies']} weight copies, contexts {m['context_bytes'] / gib:.2f} GiB; weight sharing: "
        f"{m['weight_sharing']}.",
        f"- Cold first `generate()` (both compiles and {r['steps']} tokens): {r['first_generate_s']:.0f} s; "
        f"warm: {r['warm_generate_s']:.1f} s.",
        f"- Warm, on the simulator: first token {r['first_token_s']:.2f} s, then {r['per_token_s']:.2f} s per token "
        f"(qnnx's host time per decode step above `InferenceSession.run`: {1000 * r['host_per_step_s']:.1f} ms). "
        f"Eager PyTorch on the same CPU: {r['eager_first_token_s']:.2f} s, then {r['eager_per_token_s']:.3f} s.",
        f"- Agreement with eager: same tokens {'yes' if r['same_tokens'] else 'no'}; argmax agrees on "
        f"{r['argmax_agree']}/{r['steps']} steps; lowest logits cosine {r['min_cosine']:.5f}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--max-graph-mib", type=int, default=256, help="0: the default budget")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    budget = args.max_graph_mib * 2**20 if args.max_graph_mib else None
    if args.child:
        print(json.dumps(child(args.layers, budget, args.new_tokens, args.prompt)))
        return 0
    started, t0 = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), time.perf_counter()
    cmd = [sys.executable, __file__, "--child", "--layers", str(args.layers), "--max-graph-mib",
           str(args.max_graph_mib), "--new-tokens", str(args.new_tokens), "--prompt", str(args.prompt)]  # fmt: skip
    print(f"large: {args.layers} layers, budget {budget} ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        print(out.stderr[-4000:], file=sys.stderr)
        return 1
    result = json.loads(out.stdout.strip().splitlines()[-1])
    (args.out / "benchmarks-large.json").write_text(json.dumps(result, indent=1) + "\n")
    minutes = (time.perf_counter() - t0) / 60
    section = _table(result, started, minutes, cut=args.layers < 24, load=os.getloadavg()[2])
    print(write_section(args.out / "benchmarks.md", "large", section))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
