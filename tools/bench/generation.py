"""Generation benchmark: greedy decoding of a tiny Llama with a static KV cache, qnnx on QNN HTP vs eager PyTorch.

Usage: ``python tools/bench/generation.py [--out docs] [--new-tokens 32] [--cache-lens 128,1024]``. Each measurement
runs in a fresh process (``--child``). The section it writes replaces the one between the generation markers at the
end of ``<out>/benchmarks.md`` (run it after ``run.py``, as ``nox -s bench`` does); ``<out>/benchmarks-generation.json``
keeps the raw figures.

What it measures, per ``max_cache_len``:

- tokens per second of the decode steps, qnnx against eager PyTorch on the CPU (on x86_64 the QNN device is the HTP
  simulator: its speed says nothing about a Snapdragon);
- the host time qnnx spends around each decode step's ``InferenceSession.run`` (feeds, write-backs, outputs) and
  the same for the whole compiled ``forward`` (Dynamo's guards included);
- the write-back of the new keys and values into the cache, which grows with the tokens written, not with
  ``max_cache_len``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _report import write_section

ROOT = Path(__file__).resolve().parents[2]


def _model(seed: int = 0) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return transformers.LlamaForCausalLM(config).eval()


class _Timed:
    """Wraps a callable and records the duration of each call."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.times = fn, []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.times.append(time.perf_counter() - t0)


class _TimedSession:
    """An InferenceSession whose ``run`` is timed."""

    def __init__(self, session: Any) -> None:
        self._session, self.run = session, _Timed(session.run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _forward_timer(model: Any) -> _Timed:
    """Times each forward of ``model`` with hooks (``generate()`` reads ``forward``'s signature: keep it)."""
    timer = _Timed(None)
    starts: list[float] = []
    model.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter()))
    model.register_forward_hook(lambda *_: timer.times.append(time.perf_counter() - starts.pop()))
    return timer


def _isolated_host_ms(variant: Any, args: list[Any], session: Any) -> float:
    """qnnx's host time per decode step alone: the step's call with the session answering at once (its last
    outputs again), so the simulator's long run does not evict the host code from the CPU caches between steps.

    The cache tensors receive the same rows again; the model is not used afterwards."""
    real = session._session
    outs = real.run(variant._program._output_names, _feed(variant._program, args))

    class Instant:
        def run(self, names: Any, feed: Any) -> Any:
            return outs

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    variant._program.session = Instant()
    times = []
    for _ in range(300):
        t0 = time.perf_counter()
        variant(args)
        times.append(time.perf_counter() - t0)
    variant._program.session = session
    return statistics.median(times) * 1e3


def _feed(program: Any, args: list[Any]) -> dict[str, Any]:
    feed = {}
    for name, want, tensor in zip(program._input_names, program._input_types, program.signature.onnx_inputs(args)):
        array = tensor.numpy()
        feed[name] = array.astype(want) if want is not None and array.dtype != want else array
    return feed


def child(backend: str, cache_len: int, new_tokens: int) -> dict[str, Any]:
    """One measurement in this process: ``backend`` is ``qnnx`` or ``eager``."""
    import torch

    model = _model()
    prompt = torch.randint(3, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    result: dict[str, Any] = {"backend": backend, "max_cache_len": cache_len, "new_tokens": new_tokens}
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    if backend == "qnnx":
        import qnnx_backend
        import qnnx_backend.hf
        from qnnx_backend import _compiled
        from qnnx_export import RowWriteback

        qnnx_backend.hf.compile_for_generation(model, max_cache_len=cache_len, options={"soc_model": 60})
        with torch.no_grad():  # compile the prefill and decode graphs, and warm them up
            model.generate(prompt, **kwargs)
        variants = [v for g in _compiled.live_graphs() for v in g._variants.values() if hasattr(v, "_program")]
        # The decode graph takes one token; the prefill graph the padded prompt.
        decode = next(v for v in variants if v.report.input_shapes and v.report.input_shapes[0] == (1, 1))
        session = _TimedSession(decode._program.session)
        decode._program.session = session
        steps: list[float] = []
        call = _compiled._QnnVariant.__call__

        captured: list[Any] = []

        def timed_call(self: Any, *args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return call(self, *args)
            finally:
                if self is decode:
                    steps.append(time.perf_counter() - t0)
                    captured[:] = [list(args[0])]

        _compiled._QnnVariant.__call__ = timed_call  # type: ignore[method-assign]
        forward = _forward_timer(model)
        apply = RowWriteback.apply
        writes: list[float] = []

        def timed_apply(self: Any, *args: Any) -> None:
            t0 = time.perf_counter()
            apply(self, *args)
            writes.append(time.perf_counter() - t0)

        RowWriteback.apply = timed_apply  # type: ignore[method-assign]
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, **kwargs)
        total = time.perf_counter() - t0
        RowWriteback.apply = apply  # type: ignore[method-assign]
        _compiled._QnnVariant.__call__ = call  # type: ignore[method-assign]
        isolated = _isolated_host_ms(decode, captured[-1], session)
        # The first forward of generate() is the prefill; every later one is a decode step.
        runs = session.run.times[-(new_tokens - 1) :]
        steps = steps[-(new_tokens - 1) :]
        forwards = forward.times[-(new_tokens - 1) :]
        result.update(
            reports=[r.summary() for r in qnnx_backend.compile_reports()],
            decode_step_ms=statistics.median(steps) * 1e3,
            session_run_ms=statistics.median(runs) * 1e3,
            host_overhead_ms=statistics.median(s - r for s, r in zip(steps, runs, strict=True)) * 1e3,
            forward_overhead_ms=statistics.median(f - r for f, r in zip(forwards, runs, strict=True)) * 1e3,
            writeback_ms=statistics.median(writes) * 1e3 * len(decode._program.signature.row_writebacks),
            isolated_host_ms=isolated,
        )
    else:
        model.generation_config.cache_implementation = "static"
        model.generation_config.max_cache_len = cache_len
        forward = _forward_timer(model)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, **kwargs)
        total = time.perf_counter() - t0
        result["decode_step_ms"] = statistics.median(forward.times[1:]) * 1e3
    result["tokens_per_second"] = new_tokens / total
    result["decode_tokens_per_second"] = 1e3 / result["decode_step_ms"]
    return result


def _run_child(backend: str, cache_len: int, new_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", backend, str(cache_len), str(new_tokens)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"backend": backend, "max_cache_len": cache_len, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def _table(results: list[dict[str, Any]], started: str, minutes: float) -> str:
    by = {(r["backend"], r["max_cache_len"]): r for r in results}
    lens = sorted({r["max_cache_len"] for r in results})
    rows = []
    for n in lens:
        q, e = by.get(("qnnx", n), {}), by.get(("eager", n), {})

        def f(d: dict[str, Any], key: str, fmt: str = "{:.2f}") -> str:
            return fmt.format(d[key]) if key in d else "failed"

        rows.append(
            f"| {n} | {f(q, 'decode_tokens_per_second', '{:.1f}')} | {f(e, 'decode_tokens_per_second', '{:.1f}')} "
            f"| {f(q, 'decode_step_ms')} | {f(q, 'session_run_ms')} | {f(q, 'host_overhead_ms', '{:.3f}')} "
            f"| {f(q, 'isolated_host_ms', '{:.3f}')} | {f(q, 'forward_overhead_ms')} | {f(q, 'writeback_ms', '{:.3f}')} |"
        )
    small, large = by.get(("qnnx", lens[0]), {}), by.get(("qnnx", lens[-1]), {})
    ratio = (
        f"{large['writeback_ms'] / small['writeback_ms']:.2f}"
        if "writeback_ms" in small and "writeback_ms" in large and small["writeback_ms"]
        else "n/a"
    )
    return "\n".join(
        [
            "## Generation (tiny Llama, static KV cache)",
            "",
            f"Measured {started} ({minutes:.1f} min) by `python tools/bench/generation.py`, each figure in a fresh "
            "process: greedy `generate()` of a 2-layer Llama (hidden 64) from a 16-token prompt, the forward compiled "
            "with `qnnx_backend.hf.compile_for_generation` (`soc_model=60`). **The QNN figures come from the HTP "
            "simulator**; eager is PyTorch on this machine's CPU. Medians over the decode steps.",
            "",
            "| max_cache_len | qnnx tokens/s (simulator) | eager tokens/s (CPU) | qnnx decode step (ms) "
            "| of which `InferenceSession.run` (ms) | qnnx host time around the run (ms) "
            "| the same, isolated (ms) | compiled `forward` above the run, Dynamo included (ms) "
            "| KV write-back per step (ms) |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"- Write-back per step at the largest cache / at the smallest: {ratio} (the new token's keys and values "
            "only, written with `index_copy_`: it does not grow with `max_cache_len`).",
            "- *qnnx host time around the run* is the compiled decode graph's call minus its `InferenceSession.run`: "
            "feeds, the write-back and the outputs (target: at most 0.2 ms). Between simulator runs (tens of ms of "
            "host CPU work) that code starts with cold CPU caches; *isolated* is the same call repeated with the "
            "session answering at once, which is what a device, whose NPU does not run on the host CPU, sees more "
            "closely. The compiled `forward` adds Dynamo's guard checks and the output structure.",
            "- The session's own time grows with the cache, since attention reads every cached position.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--cache-lens", default="128,1024")
    p.add_argument("--child", nargs=3, metavar=("BACKEND", "CACHE_LEN", "NEW_TOKENS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        backend, cache_len, new_tokens = args.child
        print(json.dumps(child(backend, int(cache_len), int(new_tokens))))
        return 0
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    results = []
    for n in (int(x) for x in args.cache_lens.split(",")):
        for backend in ("qnnx", "eager"):
            res = _run_child(backend, n, args.new_tokens)
            print(f"{backend:5} max_cache_len={n}: {json.dumps(res)[:300]}", flush=True)
            results.append(res)
    section = _table(results, started, (time.perf_counter() - t0) / 60)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "benchmarks-generation.json").write_text(
        json.dumps({"started": started, "python": platform.python_version(), "results": results}, indent=2) + "\n"
    )
    print(write_section(args.out / "benchmarks.md", "generation", section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
