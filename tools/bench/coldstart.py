"""Cold first call: qnnx's own host work, stage by stage, in CPU seconds over fresh processes.

Usage: ``python tools/bench/coldstart.py [--models mlp,bert@1] [--reps 3] [--out docs] [--write] [--profile DIR]
[--against DIR]``.

Each measurement is run.py's *qnnx cold* child (``_child.py``: empty context cache, ``device="npu"``, ``strict``,
``soc_model=60``) in a fresh process under ``python -X importtime``; the repetitions go round all model x batch in
turn, so that a slow spell of the machine spreads over all of them. Stage spans are read from the child's events in
CPU seconds of the calling thread (``time.thread_time``): the other jobs on the 2 cores stretch wall-clock spans of
single-threaded work, hardly its CPU time, and the QNN simulator's threads, which keep spinning after a session or a
run, do not count. Imports are placed in their stage by marks the child writes into ``-X importtime``'s stream
(seconds are importtime's, wall clock); garbage-collector pauses by the child's ``gc.callbacks``.

*qnnx host* is the first call without Dynamo's trace (before and after the backend call), ORT+QNN's session
creation and the first run: what qnnx itself does in a cold first call (the figure of ``docs/benchmarks.md``'s
stage table, here in CPU seconds, with the collector's pauses inside it counted in, not left out). With ``--write``
the section between the coldstart markers of ``<out>/benchmarks.md`` is replaced; ``--profile DIR`` writes a
cProfile of each first call there (those runs' figures then include cProfile's own cost). ``--against DIR`` measures
another version of the qnnx packages in the same run (``DIR`` holds its ``packages/*/src``, e.g. from
``git archive <commit> packages | tar -x -C DIR``): each repetition runs both versions' children back to back, in
alternating order, and a second table gives the paired differences, which a busy machine disturbs much less than
two runs apart. Nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from _report import write_section  # noqa: E402  (sibling modules of this script)
from run import MODEL_NAMES, child_environment, precompile, warm_bytecode  # noqa: E402

DEFAULT_MODELS = ("mlp", "cnn", "transformer", "bert", "resnet", "mlp_large@1")

# (key, column): the stages of a cold first call, in order; see stage_seconds.
COLUMNS = (
    ("first_call", "first call"),
    ("dynamo", "Dynamo trace"),
    ("backend", "qnn_backend()"),
    ("before_export", "probe, analyze, key"),
    ("export", "export"),
    ("check", "opcheck, split, staging"),
    ("session", "ORT+QNN session"),
    ("after_session", "store, program"),
    ("first_run", "first run"),
    ("imports", "imports in qnnx host"),
    ("gc_host", "GC in qnnx host"),
    ("gc_dynamo", "GC in Dynamo"),
    ("gc_first_run", "GC in first run"),
    ("host", "qnnx host (<= 0.15)"),
)


def _spans(res: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """(start, end) in thread CPU seconds of each stage of the child's first call."""
    at: dict[str, float] = {}
    for name, cpu in res["events_cpu"]:
        at.setdefault(name, cpu)

    def span(a: str, b: str) -> tuple[float, float]:
        return (at[a], at[b])

    return {
        "first_call": span("call_start", "call_end"),
        "dynamo_before": span("call_start", "backend_enter"),
        "backend": span("backend_enter", "backend_exit"),
        "dynamo_after": span("backend_exit", "compile_enter"),
        "before_export": span("compile_enter", "export_enter"),
        "export": span("export_enter", "export_exit"),
        "check": span("export_exit", "session_enter"),
        "session": span("session_enter", "session_exit"),
        "after_session": span("session_exit", "compile_exit"),
        "first_run": span("compile_exit", "call_end"),
    }


def _overlap(spans: list[tuple[float, float]], intervals: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(hi, b) - max(lo, a)) for lo, hi in spans for a, b in intervals)


def imports_by_event(log: str) -> list[tuple[str, str, float]]:
    """The top-level imports of ``-X importtime``'s stream with the child's event marks: (last event before the
    import, module, seconds)."""
    out = []
    last = ""
    for line in log.splitlines():
        if line.startswith("@@event "):
            last = line.removeprefix("@@event ").strip()
        elif line.startswith("import time:") and last:
            parts = line.removeprefix("import time:").split("|")
            if len(parts) != 3 or not parts[1].strip().isdigit():
                continue
            name = parts[2]
            if len(name) - len(name.lstrip()) <= 1:  # importtime indents nested imports by two more spaces
                out.append((last, name.strip(), int(parts[1]) / 1e6))
    return out


# The events after which an import belongs to qnnx's host work (the others: Dynamo, the session, the first run).
_HOST_EVENTS = {
    "backend_enter",
    "compile_enter",
    "probe_enter",
    "probe_exit",
    "fingerprint_enter",
    "fingerprint_exit",
    "export_enter",
    "export_exit",
    "opcheck_enter",
    "opcheck_exit",
    "session_exit",
}


def stage_seconds(res: dict[str, Any]) -> dict[str, float]:
    """The stages of one child's first call in thread CPU seconds (``imports`` in importtime's seconds)."""
    sp = _spans(res)
    s = {k: b - a for k, (a, b) in sp.items()}
    gcs = [(a, b) for a, b, _gen in res["gc_pauses_cpu"]]
    # qnn_backend(), the compile up to the session, the compile after it
    host_spans = [sp["backend"], (sp["before_export"][0], sp["session"][0]), sp["after_session"]]
    out = {
        "first_call": s["first_call"],
        "dynamo": s["dynamo_before"] + s["dynamo_after"],
        "backend": s["backend"],
        "before_export": s["before_export"],
        "export": s["export"],
        "check": s["check"],
        "session": s["session"],
        "after_session": s["after_session"],
        "first_run": s["first_run"],
        "gc_host": _overlap(host_spans, gcs),
        "gc_dynamo": _overlap([sp["dynamo_before"], sp["dynamo_after"]], gcs),
        "gc_first_run": _overlap([sp["first_run"]], gcs),
        "imports": sum(sec for event, _, sec in res.get("imports", ()) if event in _HOST_EVENTS),
    }
    out["host"] = out["first_call"] - out["dynamo"] - out["session"] - out["first_run"]
    return out


def _run_child(spec: dict[str, Any], work: Path, tag: str, against: Path | None = None) -> dict[str, Any]:
    result = work / "results" / f"{tag}.json"
    log = work / "logs" / f"{tag}.log"
    result.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-X", "importtime", str(HERE / "_child.py"), json.dumps(spec), str(result)]
    env = child_environment(work)
    if against is not None:  # the other version's packages come first on the path
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted(against.glob("packages/*/src")))
    with open(log, "wb") as err:
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT, check=False)
    if not result.exists():
        return {"spec": spec, "ok": False, "error": log.read_text(errors="replace")[-1500:]}
    res = json.loads(result.read_text())
    return _staged(res, log)


def _staged(res: dict[str, Any], log: Path) -> dict[str, Any]:
    """A child's result with its imports (from its importtime log) and its stages."""
    if res.get("ok"):
        res["imports"] = imports_by_event(log.read_text(errors="replace"))
        res["stages"] = stage_seconds(res)
    return res


def rebuild(work: Path) -> list[dict[str, Any]]:
    """The results a finished or interrupted run left in ``work`` (its ``results/`` and ``logs/``)."""
    results = []
    for path in sorted((work / "results").glob("r*.json")):
        results.append(_staged(json.loads(path.read_text()), work / "logs" / f"{path.stem}.log"))
    return results


def _plan(models: tuple[str, ...], batches: tuple[int, ...]) -> list[tuple[str, int]]:
    plan = []
    for item in models:
        name, _, only = item.partition("@")
        for batch in [int(b) for b in only.split("+")] if only else batches:
            plan.append((name, batch))
    return plan


def measure(
    plan: list[tuple[str, int]], reps: int, work: Path, profile: Path | None, against: Path | None = None
) -> list[dict[str, Any]]:
    precompile(work)
    warm_bytecode(work)
    if against is not None:
        _run_child(_spec("mlp", 1, -1, work / "warmup-against"), work, "warmup-against", against)
    versions: list[Path | None] = [None] if against is None else [None, against]
    results = []
    for rep in range(reps):
        order = plan[rep % len(plan) :] + plan[: rep % len(plan)]
        for model, batch in order:
            for version in versions if rep % 2 == 0 else versions[::-1]:
                which = "against" if version is not None else "this"
                tag = f"r{rep}-{model}-b{batch}" + ("-against" if version is not None else "")
                spec = _spec(model, batch, rep, work / tag)
                spec["version"] = which
                if profile is not None:
                    spec["profile"] = str(profile / f"{tag}.prof")
                res = _run_child(spec, work, tag, version)
                results.append(res)
                if res.get("ok"):
                    st = res["stages"]
                    print(
                        f"{tag}: host {st['host']:.3f} s (export {st['export']:.3f}, imports {st['imports']:.3f}, "
                        f"gc in host {st['gc_host']:.3f}), first call {st['first_call']:.3f} s cpu",
                        file=sys.stderr,
                        flush=True,
                    )
                else:
                    print(f"{tag}: FAILED {res.get('error', '?')[-300:]}", file=sys.stderr, flush=True)
    return results


def _spec(model: str, batch: int, rep: int, folder: Path) -> dict[str, Any]:
    """run.py's qnnx cold child for ``model`` at ``batch``, its context cache in ``folder``."""
    return {
        "backend": "qnnx",
        "variant": "qnnx",
        "phase": "cold",
        "model": model,
        "batch": batch,
        "run": rep,
        "cache_dir": str(folder / "cache"),
    }


def medians(results: list[dict[str, Any]], version: str = "this") -> dict[tuple[str, int], dict[str, float]]:
    """The median of each stage over the repetitions, per (model, batch), of one version's children."""
    by: dict[tuple[str, int], list[dict[str, float]]] = {}
    for res in results:
        if res.get("ok") and res["spec"].get("version", "this") == version:
            by.setdefault((res["spec"]["model"], res["spec"]["batch"]), []).append(res["stages"])
    return {
        key: {k: statistics.median(st[k] for st in runs) for k in runs[0]} | {"n": len(runs)}
        for key, runs in by.items()
    }


def top_imports(results: list[dict[str, Any]], n: int = 8) -> list[tuple[str, float]]:
    """The slowest top-level imports inside qnnx's host work (median seconds over the processes that import them)."""
    seen: dict[str, list[float]] = {}
    for res in results:
        if res.get("spec", {}).get("version", "this") != "this":
            continue
        for event, name, sec in res.get("imports", ()):
            if event in _HOST_EVENTS:
                seen.setdefault(name, []).append(sec)
    ranked = sorted(((name, statistics.median(v)) for name, v in seen.items()), key=lambda x: -x[1])
    return ranked[:n]


def section(results: list[dict[str, Any]], started: str, minutes: float, loadavg: tuple[float, ...]) -> str:
    table = medians(results)
    reps = max((m["n"] for m in table.values()), default=0)
    lines = [
        "## Cold first call: qnnx's host work in CPU time",
        "",
        f"{started}, {platform.machine()}, {minutes:.1f} min, load average {loadavg[0]:.2f} at the start; "
        f"`python tools/bench/coldstart.py`: run.py's qnnx cold child (empty context cache) in {reps} fresh "
        "processes per model x batch, medians. Seconds of CPU time of the calling thread (the QNN simulator's "
        "threads excluded), which other jobs on the cores change much less than wall-clock time. *probe, analyze, "
        "key*: from the compile's start to the export (lazy imports, device probe, graph analysis, the float16 "
        "range check's eager run, fingerprint, cache lookup); *export*: the ATen trace, the translation and the "
        "rewrite passes; *opcheck, split, staging*: from the export to the session; *store, program*: publishing "
        "the context and building the program; *first run*: the first QNN run and the accuracy guard; *imports in "
        "qnnx host*: top-level imports inside the host work (`-X importtime`, wall clock); *GC*: the garbage "
        "collector's pauses. *qnnx host*: the first call without Dynamo's trace, the ORT+QNN session and the first "
        "run, GC pauses included.",
        "",
    ]
    lines += _stage_table(table)
    hosts = [m["host"] for m in table.values()]
    if hosts:
        met = sum(h <= 0.15 for h in hosts)
        lines += [
            "",
            f"qnnx host work <= 0.15 s on {met} of {len(hosts)} model x batch (largest {max(hosts):.3f} s).",
        ]
    other = medians(results, "against")
    if other:
        lines += ["", "The other version (`--against`), measured in the same run:", "", *_stage_table(other)]
    lines += _comparison(results)
    imports = top_imports(results)
    if imports:
        lines += ["", "Slowest imports inside the host work: " + ", ".join(f"`{n}` {s:.3f} s" for n, s in imports)]
    return "\n".join(lines)


def _stage_table(table: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    lines = [
        "| model | batch | " + " | ".join(label for _, label in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for (model, batch), m in table.items():
        lines.append(f"| {model} | {batch} | " + " | ".join(f"{m[k]:.3f}" for k, _ in COLUMNS) + " |")
    return lines


_COMPARED = (("host", "qnnx host"), ("export", "export"), ("imports", "imports in qnnx host"))


def _comparison(results: list[dict[str, Any]]) -> list[str]:
    """The table of paired differences against the other version (``--against``), or nothing."""
    pairs: dict[tuple[str, int], list[tuple[dict[str, float], dict[str, float]]]] = {}
    done: dict[tuple[str, int, int, str], dict[str, float]] = {}
    for res in results:
        if res.get("ok"):
            s = res["spec"]
            done[(s["model"], s["batch"], s["run"], s.get("version", "this"))] = res["stages"]
    for (model, batch, rep, version), stages in done.items():
        other = done.get((model, batch, rep, "against"))
        if version == "this" and other is not None:
            pairs.setdefault((model, batch), []).append((other, stages))
    if not pairs:
        return []
    head = " | ".join(f"{label}: against / this / change" for _, label in _COMPARED)
    lines = [
        "",
        "Against the other version (`--against`), the same processes' pairs: medians of each, and the median of "
        "the paired changes (negative: this version does less).",
        "",
        f"| model | batch | pairs | {head} |",
        "|---|---|---|" + "---|" * len(_COMPARED),
    ]
    for (model, batch), got in pairs.items():
        cells = []
        for key, _ in _COMPARED:
            before = statistics.median(a[key] for a, _ in got)
            after = statistics.median(b[key] for _, b in got)
            change = statistics.median(b[key] - a[key] for a, b in got)
            cells.append(f"{before:.3f} / {after:.3f} / {change:+.3f}")
        lines.append(f"| {model} | {batch} | {len(got)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma list, e.g. mlp,bert@1 (@ batches)")
    parser.add_argument("--batches", default="1,16", help="batch sizes of models without @ (default 1,16)")
    parser.add_argument("--reps", type=int, default=3, help="fresh processes per model x batch (default 3)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder of benchmarks.md and the JSON")
    parser.add_argument("--write", action="store_true", help="replace the coldstart section of benchmarks.md")
    parser.add_argument("--profile", type=Path, help="write a cProfile of each first call into this folder")
    parser.add_argument("--work-dir", type=Path, help="caches and logs (default: a temporary folder, deleted)")
    parser.add_argument("--against", type=Path, help="a folder with another version's packages/*/src to compare")
    parser.add_argument("--rebuild", action="store_true", help="no measurement: the tables from --work-dir's results")
    args = parser.parse_args(argv)
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    bad = [m for m in models if m.partition("@")[0] not in MODEL_NAMES]
    if bad or args.reps < 1:
        parser.error(f"unknown model(s) {bad} (known: {', '.join(MODEL_NAMES)}) or --reps < 1 ({args.reps})")
    if args.against is not None and not list(args.against.glob("packages/*/src")):
        parser.error(
            f"--against {args.against}: no packages/*/src there; e.g. git archive HEAD~1 packages | tar -x -C DIR"
        )
    plan = _plan(models, tuple(int(b) for b in args.batches.split(",")))
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.rebuild:
        if args.work_dir is None or not (args.work_dir / "meta.json").exists():
            parser.error("--rebuild needs the --work-dir of an earlier run (with its meta.json)")
        meta = json.loads((args.work_dir / "meta.json").read_text())
        results = rebuild(args.work_dir)
        minutes = (max(p.stat().st_mtime for p in (args.work_dir / "results").glob("r*.json")) - meta["t0"]) / 60
    else:
        work = args.work_dir or Path(tempfile.mkdtemp(prefix="qnnx-coldstart-"))
        work.mkdir(parents=True, exist_ok=True)
        meta = {
            "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "loadavg": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
            "t0": time.time(),
        }
        (work / "meta.json").write_text(json.dumps(meta))
        try:
            results = measure(plan, args.reps, work, args.profile, args.against)
        finally:
            if args.work_dir is None:
                shutil.rmtree(work, ignore_errors=True)
        minutes = (time.time() - meta["t0"]) / 60
    text = section(results, meta["started"], minutes, tuple(meta["loadavg"]))
    print(text)
    if args.write:
        kept = [{k: v for k, v in r.items() if k in ("spec", "ok", "stages", "error")} for r in results]
        (args.out / "benchmarks-coldstart.json").write_text(json.dumps(kept, indent=1) + "\n")
        write_section(args.out / "benchmarks.md", "coldstart", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
