"""qnnx benchmark harness: torch.compile(backend="qnn") against raw ONNX Runtime, eager PyTorch, OpenVINO and Inductor.

Every figure comes from a fresh process (one child process per measurement, see _child.py); each run measures every
model x batch for qnnx (cold, warm, AOT save and AOT warm start, ONNX Runtime + QNN alone) and OpenVINO (cold), runs
repeat ``--runs`` times, so that each figure is a median
over runs and each ratio pairs figures from the same run. OpenVINO with ``model_caching`` and Inductor are measured in
the first ``--comparison-runs`` runs only (Inductor's cold compile alone takes 20-60 s per model on 2 cores). Results go to ``<out>/benchmarks.json``, ``benchmarks.md`` and
``benchmarks.png``. The JSON is rewritten after every child, so an interrupted run still leaves its data;
``--report-only`` rebuilds the Markdown and the plot from it.

On x86_64 the QNN HTP device is the simulator inside onnxruntime-qnn, 50-260x slower than a CPU: its latencies are
the simulator's, not a Snapdragon's.

Examples:
    python tools/bench/run.py --quick                      # 1 run, mlp and cnn, batch 1: a few minutes
    python tools/bench/run.py --runs 3 --max-minutes 30    # the full measurement behind docs/benchmarks.md
    python tools/bench/run.py --models bert,resnet --batches 16 --backends qnnx --runs 1 --out /tmp/b
    python tools/bench/run.py --report-only --out docs/    # redraw tables and plot from docs/benchmarks.json

Exit codes: 0 the harness ran (individual measurements may have failed: they are reported, not raised);
2 bad arguments; 3 --report-only without a results file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import _report  # noqa: E402  (a sibling module of this script)

MODEL_NAMES = ("mlp", "cnn", "transformer", "bert", "resnet", "mlp_large")
# The default set: the five benchmark models at every batch, plus one weight-heavy MLP at batch 1 only, which shows
# how compile memory grows with weight bytes once the fixed cost (QNN libraries, simulator, exporter) is paid.
DEFAULT_MODELS = ("mlp", "cnn", "transformer", "bert", "resnet", "mlp_large@1")
BACKENDS = ("qnnx", "openvino", "inductor")
DISTRIBUTIONS = (
    "torch",
    "onnxruntime",
    "onnxruntime-qnn",
    "onnx",
    "onnxscript",
    "openvino",
    "transformers",
    "numpy",
    "qnnx-backend",
    "qnnx-detection",
    "qnnx-export",
    "qnnx-opcheck",
    "qnnx-ctxcache",
)


def _model_list(text: str) -> tuple[str, ...]:
    """Comma list of model names, each optionally restricted to some batches: ``mlp,bert@1,resnet@1+16``."""
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of models")
    bad = []
    for item in items:
        name, _, batches = item.partition("@")
        if name not in MODEL_NAMES or (batches and not all(b.isdigit() and int(b) > 0 for b in batches.split("+"))):
            bad.append(item)
    if bad:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad)} not valid; accepted: {', '.join(MODEL_NAMES)}, each optionally with @BATCH[+BATCH]"
        )
    return items


def configs(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(model, batch) pairs in run order."""
    out = []
    for item in args.models:
        name, _, batches = item.partition("@")
        for batch in [int(b) for b in batches.split("+")] if batches else args.batches:
            out.append((name, batch))
    return out


def _csv(choices: tuple[str, ...] | None, kind: type = str):
    def parse(text: str) -> tuple[Any, ...]:
        items = tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        if choices is not None:
            bad = [x for x in items if x not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"{', '.join(bad)} not in {', '.join(choices)}")
        return items

    return parse


def _public_args(args: list[str]) -> list[str]:
    """The command line as the docs print it: without --work-dir, a folder of the machine that ran it."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--work-dir":
            skip = True
        elif not arg.startswith("--work-dir="):
            out.append(arg)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python tools/bench/run.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Examples:") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="1 run, models mlp and cnn, batch 1 (a few minutes)")
    p.add_argument(
        "--models",
        type=_model_list,
        help=f"comma list of {', '.join(MODEL_NAMES)}, each optionally @BATCH[+BATCH] "
        f"(default {','.join(DEFAULT_MODELS)})",
    )
    p.add_argument("--batches", type=_csv(None, int), help="comma list of batch sizes (default 1,16)")
    p.add_argument("--backends", type=_csv(BACKENDS), help=f"comma list of {', '.join(BACKENDS)} (default all)")
    p.add_argument("--runs", type=int, help="sweeps over all models x batches x backends (default 3)")
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="output folder (default: docs/ of the repo)")
    p.add_argument(
        "--comparison-runs",
        type=int,
        default=1,
        help="runs that also measure OpenVINO with model_caching and Inductor (default 1; see the method)",
    )
    p.add_argument("--steady-seconds", type=float, default=2.0, help="time budget per steady-state measurement")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a child process is killed")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no new run when it would overrun this budget (estimated from the previous run's processes)",
    )
    p.add_argument("--work-dir", type=Path, help="where caches and logs go (default: a temporary folder, deleted)")
    p.add_argument("--report-only", action="store_true", help="rebuild benchmarks.md/png from <out>/benchmarks.json")
    p.add_argument("--json", action="store_true", help="print the aggregated results as JSON on stdout at the end")
    args = p.parse_args(argv)
    if args.quick:
        args.models = args.models or ("mlp", "cnn")
        args.batches = args.batches or (1,)
        args.runs = args.runs or 1
    args.models = args.models or DEFAULT_MODELS
    args.batches = args.batches or (1, 16)
    args.backends = args.backends or BACKENDS
    args.runs = args.runs or 3
    if args.runs < 1:
        p.error(f"--runs {args.runs} is not valid; accepted: an integer >= 1")
    if args.comparison_runs < 0:
        p.error(f"--comparison-runs {args.comparison_runs} is not valid; accepted: an integer >= 0")
    if any(b < 1 for b in args.batches):
        p.error(f"--batches {args.batches} is not valid; accepted: integers >= 1")
    return args


# --- machine ------------------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_flags() -> list[str]:
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "avx512_fp16")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    versions = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cores": os.cpu_count(),
        "memory_gib": _mem_total_gib(),
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "versions": versions,
        "virtualized": Path("/sys/hypervisor").exists() or "hypervisor" in Path("/proc/cpuinfo").read_text(),
    }


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


# --- children ----------------------------------------------------------------------------------------------------


def _plan(args: argparse.Namespace, run: int) -> list[dict[str, Any]]:
    """The child processes of one sweep, in order (cache folders are filled in by _run_child).

    qnnx (cold, warm) and OpenVINO without a cache (cold) are measured in every run: the targets need them. OpenVINO
    with ``model_caching`` and Inductor are context, and Inductor's cold compile alone costs 20-60 s per model on
    this machine, so they are measured in the first ``--comparison-runs`` runs only.
    """
    steady = {"steady_budget_s": args.steady_seconds, "steady_min_iters": 3, "steady_max_iters": 500}
    extras = run < args.comparison_runs
    plan: list[dict[str, Any]] = []
    for model, batch in configs(args):

        def add(variant: str, phase: str, cache: str | None, m: str = model, b: int = batch, **extra: Any) -> None:
            backend = variant.split("-")[0]
            spec = {"model": m, "batch": b, "backend": backend, "variant": variant, "phase": phase, "cache": cache}
            plan.append(spec | extra)

        if "qnnx" in args.backends:
            add("qnnx", "cold", "qnnx")
            add("qnnx", "warm", "qnnx", steady=True, **steady)
            # The AOT warm start: one process saves the compiled forward (aot_compile + save_compiled_function),
            # the next loads it (load_compiled_function) and makes the first call, with no Dynamo trace.
            add("qnnx-aot", "save", "aot")
            add("qnnx-aot", "warm", "aot")
            add("ortqnn", "cold", "ortqnn")  # ONNX Runtime + QNN alone on the same ONNX model: the floor
        if "openvino" in args.backends:
            add("openvino", "cold", None)
            if extras:
                add("openvino-cache", "cold", "ov")
                add("openvino-cache", "warm", "ov", steady=True, **steady)
        if "inductor" in args.backends and extras:
            add("inductor", "cold", "inductor")
            add("inductor", "warm", "inductor", steady=True, **steady)
    return plan


def child_environment(work: Path) -> dict[str, str]:
    """The environment of every child process.

    Bytecode is cached in ``<work>/pycache``: an installed qnnx has its ``.pyc`` files (pip compiles them), while the
    editable install of this repository under ``PYTHONDONTWRITEBYTECODE=1`` would compile every qnnx module from
    source in each process (0.15-0.2 s of a first call on this machine) and make the first calls slower than a
    user's. The probe cache goes to the work folder too, so no run reads what another left.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    env["QNNX_PROBE_CACHE_DIR"] = str(work / "probe-cache")
    return env


def precompile(work: Path) -> None:
    """Write the bytecode of the qnnx packages into ``<work>/pycache`` before the first child (see child_environment)."""
    sources = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *sources],
        env=child_environment(work),
        check=False,
        stdout=subprocess.DEVNULL,
    )


def warm_bytecode(work: Path) -> None:
    """Fill ``<work>/pycache`` with the bytecode of every module a cold qnnx compile imports, by one throwaway cold
    child (mlp, batch 1).

    Under PYTHONPYCACHEPREFIX Python reads no ``__pycache__`` beside the sources, not even pip's in site-packages:
    without this, the first child would compile torch.onnx, torch.export, onnx_ir, onnxscript and the rest from
    source inside its first call (about 0.4 s here, CPU) and its figures would not be a user's.
    """
    spec = {"backend": "qnnx", "variant": "qnnx", "phase": "cold", "model": "mlp", "batch": 1, "run": -1}
    with tempfile.TemporaryDirectory(prefix="qnnx-bench-warmup-") as tmp:
        spec["cache_dir"] = str(Path(tmp) / "cache")
        subprocess.run(
            [sys.executable, str(HERE / "_child.py"), json.dumps(spec), str(Path(tmp) / "result.json")],
            env=child_environment(work),
            cwd=ROOT,
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


# The third-party packages a cold compile imports inside its first call, in the order it does (ml_dtypes comes with
# onnx, and is measured on its own first so that its share shows).
DEPENDENCY_IMPORTS = ("ml_dtypes", "onnx", "onnx_ir", "onnxruntime")


def dependency_imports(work: Path, processes: int = 3) -> dict[str, Any]:
    """Seconds each of DEPENDENCY_IMPORTS takes to import in a fresh process after torch and Dynamo (median of
    ``processes``; each after the ones before it, as ``python -X importtime`` reports it), with the installed
    versions."""
    # torch and Dynamo first, as in a first call: what they import already (sympy, numpy) is not counted again.
    code = "import torch, torch._dynamo; " + "; ".join(f"import {name}" for name in DEPENDENCY_IMPORTS)
    seconds: dict[str, list[float]] = {name: [] for name in DEPENDENCY_IMPORTS}
    for _ in range(processes):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            env=child_environment(work),
            capture_output=True,
            text=True,
            check=False,
        )
        for line in proc.stderr.splitlines():
            parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
            if len(parts) == 3 and parts[2] in seconds and parts[1].isdigit():
                seconds[parts[2]].append(int(parts[1]) / 1e6)
    versions = {}
    for name in ("ml_dtypes", "numpy", "onnx", "onnx-ir", "onnxruntime"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "seconds": {k: statistics.median(v) for k, v in seconds.items() if v},
        "versions": versions,
        "processes": processes,
    }


def _run_child(spec: dict[str, Any], work: Path, run: int, timeout: float) -> dict[str, Any]:
    tag = f"r{run}-{spec['model']}-b{spec['batch']}"
    cache_root = work / tag
    env = child_environment(work)
    # Inductor's on-disk caches (FX graph, AOTAutograd, compiled C++) live here: a fresh folder per run and model
    # makes its cold compile really cold, and its warm process reuses what its cold process left.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / "inductor")
    env.setdefault("PYTHONUNBUFFERED", "1")
    spec = dict(spec, run=run)
    spec["cache_dir"] = str(cache_root / spec["cache"]) if spec.get("cache") and spec["backend"] != "inductor" else None
    result_file = work / "results" / f"{tag}-{spec['variant']}-{spec['phase']}.json"
    log_file = work / "logs" / f"{tag}-{spec['variant']}-{spec['phase']}.log"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE / "_child.py"), json.dumps(spec), str(result_file)]
    started = time.perf_counter()
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: the simulator's threads too
            proc.wait()
    wall = time.perf_counter() - started
    if result_file.exists():
        res = json.loads(result_file.read_text())
    else:
        tail = log_file.read_text(errors="replace")[-1500:]
        why = f"timed out after {timeout:.0f} s" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}"
        res = {"spec": spec, "ok": False, "error": f"child died ({why}) without a result; log tail:\n{tail}"}
    res["wall_s"] = wall
    if res.get("spec", {}).get("cache_dir"):  # recorded relative to the work folder: no path of this machine
        res["spec"] = dict(res["spec"], cache_dir=os.path.relpath(res["spec"]["cache_dir"], work))
    if "trace" in res:  # keep the end of a failure's traceback: where it was raised, without this machine's paths
        res["trace"] = re.sub(r"[^\s\"']*/site-packages/", "<site-packages>/", res["trace"][-1500:])
    return res


def _describe(res: dict[str, Any]) -> str:
    s = res["spec"]
    head = f"run {s['run']} {s['model']:<11} b{s['batch']:<3} {s['variant']:<15} {s['phase']:<4}"
    if not res.get("ok"):
        return f"{head} FAILED: {res.get('error', '?').splitlines()[0][:150]}"
    extra = ""
    if res.get("graphs"):
        caches = ",".join(sorted({g["cache"] for g in res["graphs"]}))
        extra = f" graphs={len(res['graphs'])} cache={caches}"
    acc = res.get("accuracy", {})
    if "max_rel_err" in acc:
        extra += f" relerr={acc['max_rel_err']:.2g}"
    if res.get("fallback"):
        extra += f" FELL BACK to {res['fallback'][0].split(':')[0]}"
    if res.get("host_overhead") and res["host_overhead"].get("run_stubbed"):
        extra += f" overhead={res['host_overhead']['run_stubbed']['median_us']:.0f}us"
    if res.get("steady"):
        extra += " steady " + " ".join(f"{k}={v['median_ms']:.2f}ms" for k, v in res["steady"].items())
    if "save_s" in res:
        extra += f" aot_compile={res['aot_compile_s']:.2f}s save={res['save_s']:.2f}s"
    if "aot_file_bytes" in res:
        extra += f" file={res['aot_file_bytes'] / 2**20:.1f}MB"
    if "aot_vs_saver" in res:
        extra += f" identical_to_saver={res['aot_vs_saver'].get('identical')}"
    mem = res.get("peak_delta_bytes", 0) / 2**20
    return f"{head} first={res['first_call_s']:.2f}s mem=+{mem:.0f}MB{extra} ({res['wall_s']:.0f}s)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "benchmarks.json"
    if args.report_only:
        if not json_path.exists():
            print(f"no results at {json_path}; run without --report-only first", file=sys.stderr)
            return 3
        data = json.loads(json_path.read_text())
        summary = _report.write(data, out)
        if args.json:
            print(json.dumps(summary, indent=1))
        return 0

    if "openvino" in args.backends and importlib.util.find_spec("openvino") is None:
        print("openvino is not installed: skipping it (pip install openvino)", file=sys.stderr)
        args.backends = tuple(b for b in args.backends if b != "openvino")

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="qnnx-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "meta": {
            "machine": machine_info(),
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "loadavg_start": _loadavg(),
            "args": {
                "runs": args.runs,
                "comparison_runs": min(args.comparison_runs, args.runs),
                "models": list(args.models),
                "batches": list(args.batches),
                "backends": list(args.backends),
                "steady_seconds": args.steady_seconds,
                "quick": args.quick,
            },
            "command": " ".join(
                ["python", "tools/bench/run.py", *_public_args(argv if argv is not None else sys.argv[1:])]
            ),
            "runs_completed": 0,
        },
        "models": _report.model_table(sorted({m for m, _ in configs(args)}, key=MODEL_NAMES.index)),
        "results": [],
    }
    total = sum(len(_plan(args, r)) for r in range(args.runs))
    print(f"qnnx bench: {args.runs} run(s), {total} processes; work dir {work}", flush=True)
    precompile(work)
    warm_bytecode(work)
    data["meta"]["dependency_imports"] = dependency_imports(work)
    t_all = time.perf_counter()
    last_wall: dict[tuple[str, str, str, int], float] = {}
    try:
        for run in range(args.runs):
            queue = _plan(args, run)
            while queue:
                spec = queue.pop(0)
                res = _run_child(spec, work, run, args.timeout)
                last_wall[(spec["variant"], spec["phase"], spec["model"], spec["batch"])] = res["wall_s"]
                data["results"].append(res)
                print(_describe(res), flush=True)
                json_path.write_text(json.dumps(data, indent=1, default=str))
                if spec["variant"] == "qnnx-aot" and spec["phase"] == "save" and not res.get("ok"):
                    # Nothing to load: record the loading process as failed for the same reason, without running it.
                    for queued in [q for q in queue if q["variant"] == "qnnx-aot" and q["model"] == spec["model"]]:
                        if queued["batch"] == spec["batch"]:
                            queue.remove(queued)
                            why = res.get("error", "?").splitlines()[0]
                            skipped = {"spec": dict(queued, run=run), "ok": False, "wall_s": 0.0}
                            data["results"].append(skipped | {"error": f"not run: the saving process failed ({why})"})
                            print(_describe(data["results"][-1]), flush=True)
                if spec["variant"] == "openvino" and not res.get("ok"):
                    # openvino 2026.4 + torch 2.13: the default path (make_fx on fake tensors inside the backend)
                    # breaks Dynamo's guards on BatchNorm models; its aot_autograd path works. Measure that too, so
                    # the qnnx/OpenVINO ratio exists for those models (marked in the report).
                    queue.insert(0, dict(spec, variant="openvino-aot"))
            data["meta"]["runs_completed"] = run + 1
            if args.max_minutes is not None and run + 1 < args.runs:
                nxt = _plan(args, run + 1)
                guess = sum(last_wall.get((p["variant"], p["phase"], p["model"], p["batch"]), 60.0) for p in nxt)
                if (time.perf_counter() - t_all + guess) / 60 > args.max_minutes:
                    print(
                        f"stopping after {run + 1} run(s): the next one (about {guess / 60:.1f} min) would overrun "
                        f"--max-minutes {args.max_minutes}",
                        flush=True,
                    )
                    break
    finally:
        data["meta"]["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        data["meta"]["loadavg_end"] = _loadavg()
        data["meta"]["wall_minutes"] = round((time.perf_counter() - t_all) / 60, 1)
        json_path.write_text(json.dumps(data, indent=1, default=str))
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    summary = _report.write(data, out)
    print(f"wrote {json_path}, {out / 'benchmarks.md'}, {out / 'benchmarks.png'}")
    if args.json:
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
