"""Quantization benchmark: float against a16w8 and a8w8 QDQ graphs, per model, on QNN HTP.

Usage: ``python tools/bench/quantization.py [--out docs] [--models resnet18,bert]``. Each measurement runs in a
fresh process (``--child``). Its section replaces the one between the quantization markers at the end of
``<out>/benchmarks.md`` (run it after ``run.py``, as ``nox -s bench`` does); ``<out>/benchmarks-quantization.json``
keeps the raw figures.

Per model and scheme: the first call's compile time (for a quantized graph: calibration on 16 inputs, quantization,
the accuracy check and the QNN compile), the compiled context's bytes (what the context cache stores), the median
latency of a compiled call (on x86_64 the HTP simulator's: it says nothing about a Snapdragon) and the SQNR and
cosine against float eager PyTorch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _report import write_section

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("float", "a16w8", "a8w8")
SAMPLES = 16


def _model(name: str) -> tuple[Any, Any]:
    """The model and a maker of its inputs by seed."""
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "resnet18":
        config = transformers.ResNetConfig(
            embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic"
        )
        inner, key, shape, vocab = transformers.ResNetModel(config), "pooler_output", (1, 3, 64, 64), None
    elif name == "bert":
        config = transformers.BertConfig(
            vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
        )
        inner, key, shape, vocab = transformers.BertModel(config), "last_hidden_state", (1, 64), 1000
    else:
        raise SystemExit(f"unknown model {name!r}; accepted: resnet18, bert")

    class Field(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return getattr(self.inner(x), key)

    def make(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        if vocab is not None:
            return torch.randint(1, vocab, shape, generator=generator)
        return torch.randn(shape, generator=generator)

    return Field().eval(), make


def child(name: str, scheme: str) -> dict[str, Any]:
    """One measurement in this process."""
    import torch

    import qnnx_backend

    model, make = _model(name)
    cache = tempfile.mkdtemp(prefix="qnnx-bench-q-")
    options: dict[str, Any] = {"soc_model": 60, "cache": True, "cache_dir": cache}
    if scheme != "float":
        options["quantize"] = scheme
    compiled = torch.compile(model, backend="qnn", options=options)
    x = make(1000)
    t0 = time.perf_counter()
    with torch.no_grad():
        if scheme != "float":
            with qnnx_backend.calibrate(compiled):
                for seed in range(SAMPLES):
                    compiled(make(seed))
        compiled(x)
    first = time.perf_counter() - t0
    times = []
    with torch.no_grad():
        for _ in range(10):
            t = time.perf_counter()
            compiled(x)
            times.append(time.perf_counter() - t)
    (report,) = qnnx_backend.compile_reports()
    quant = report.quantization
    return {
        "model": name,
        "scheme": scheme,
        "first_call_s": first,
        "context_bytes": sum(p.stat().st_size for p in Path(cache).rglob("*.bin")),
        "latency_ms": statistics.median(times) * 1e3,
        "placement": report.placement,
        "sqnr_db": quant.sqnr_db if quant else None,
        "cosine": quant.cosine if quant else None,
        "quantized": bool(quant and quant.used),
    }


def _run_child(name: str, scheme: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, scheme]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"model": name, "scheme": scheme, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def _section(results: list[dict[str, Any]], started: str, minutes: float) -> str:
    by = {(r["model"], r["scheme"]): r for r in results}
    rows = []
    for model in dict.fromkeys(r["model"] for r in results):
        base = by.get((model, "float"), {})
        for scheme in SCHEMES:
            r = by.get((model, scheme), {})
            if "error" in r or not r:
                rows.append(f"| {model} | {scheme} | failed | | | | | |")
                continue
            ratio = r["context_bytes"] / base["context_bytes"] if base.get("context_bytes") else float("nan")
            on_qnn = r["placement"].get("QNNExecutionProvider", 0)
            nodes = sum(r["placement"].values())
            sqnr = f"{r['sqnr_db']:.1f}" if r["sqnr_db"] is not None else "–"
            cos = f"{r['cosine']:.5f}" if r["cosine"] is not None else "–"
            rows.append(
                f"| {model} | {scheme}{'' if scheme == 'float' or r['quantized'] else ' (fell back to float)'} "
                f"| {r['first_call_s']:.1f} | {r['context_bytes'] / 1e6:.2f} ({ratio:.2f}x) | {r['latency_ms']:.1f} "
                f"| {on_qnn}/{nodes} | {sqnr} | {cos} |"
            )
    return "\n".join(
        [
            "## Quantized graphs (float against a16w8 and a8w8)",
            "",
            f"Measured {started} ({minutes:.1f} min) by `python tools/bench/quantization.py`, each row in a fresh "
            f"process, `soc_model=60`, calibration on {SAMPLES} random inputs. **Latencies are the HTP simulator's** "
            "(a functional model running on the host CPU; integer graphs are not faster there as they are on a "
            "Snapdragon). The first call of a quantized model includes calibration (eager PyTorch), quantization "
            "with onnxruntime's QNN tooling, the accuracy check and the QNN compile.",
            "",
            "| model | scheme | first call (s) | context MB (vs float) | call (ms, simulator) | nodes on QNN "
            "| SQNR (dB) | cosine |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "- The float context already holds fp16 weights (HTP computes float in fp16), so 8-bit weights halve it; "
            "against the float32 weights a quantized context is about a quarter.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    p.add_argument("--models", default="resnet18,bert")
    p.add_argument("--child", nargs=2, metavar=("MODEL", "SCHEME"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    results = []
    for name in args.models.split(","):
        for scheme in SCHEMES:
            res = _run_child(name, scheme)
            print(f"{name} {scheme}: {json.dumps(res)[:300]}", flush=True)
            results.append(res)
    section = _section(results, started, (time.perf_counter() - t0) / 60)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "benchmarks-quantization.json").write_text(
        json.dumps({"started": started, "results": results}, indent=2) + "\n"
    )
    print(write_section(args.out / "benchmarks.md", "quantization", section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
