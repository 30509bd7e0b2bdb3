"""The report's later sections: memory, the stages of a cold first call, imports, accuracy, failures, method."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from _figures import MEM_STAGES, STAGES, Cells, get_accuracy, get_mem, get_mem_ratio, median, mem_stages, safe, stages
from _targets import TARGETS
from _text import cell, mib, num, table, verdict


def memory_section(cells: Cells) -> list[str]:
    rows = []
    for model, batch in cells.configs:
        c = cells
        weights = median(
            r["weight_bytes"] for runs in c.ok.values() for r in runs.values() if r["spec"]["model"] == model
        )
        rows.append(
            [
                model,
                str(batch),
                mib(weights),
                cell(c, "qnnx", "cold", model, batch, get_mem, digits=1, scale=1 / 2**20),
                verdict(c.value("qnnx", "cold", model, batch, get_mem_ratio), TARGETS["mem_weights"]),
                cell(c, "qnnx", "warm", model, batch, get_mem, digits=1, scale=1 / 2**20),
                cell(c, "ortqnn", "cold", model, batch, get_mem, digits=1, scale=1 / 2**20),
                num(c.value("ortqnn", "cold", model, batch, get_mem_ratio)),
                cell(c, "openvino", "cold", model, batch, get_mem, digits=1, scale=1 / 2**20),
                num(c.value("openvino", "cold", model, batch, get_mem_ratio)),
                cell(c, "inductor", "cold", model, batch, get_mem, digits=1, scale=1 / 2**20),
                num(c.value("inductor", "cold", model, batch, get_mem_ratio)),
            ]
        )
    return [
        "## Peak memory of the first call (MiB above the baseline)",
        "",
        "Peak resident memory during the first call minus the resident memory just before it (after imports, model",
        "construction and one eager call). The kernel's high-water mark is reset through `/proc/self/clear_refs`",
        "just before the call, so the peak is the compile's own and not that of `import torch`; the peak is the",
        "kernel's VmHWM (what `getrusage(RUSAGE_SELF).ru_maxrss` reports), read and reset at each stage boundary",
        "of the qnnx call (below). The model's own weights are in the baseline, not in the figure.",
        "*ORT+QNN alone*: the peak of ONNX Runtime creating the QNN session (and writing its context) on the same",
        "ONNX model, weights memory-mapped from `model.onnx.data` as qnnx writes them, and running it once; what",
        "any backend built on ONNX Runtime and QNN needs, whatever it does before.",
        "",
        *_slope_lines(cells),
        *table(
            [
                "model",
                "batch",
                "weights",
                "qnnx cold",
                f"qnnx cold / weights (<= {TARGETS['mem_weights'].bound})",
                "qnnx warm",
                "ORT+QNN alone",
                "ORT+QNN / weights",
                "OpenVINO cold",
                "OV / weights",
                "Inductor cold",
                "Ind. / weights",
            ],
            rows,
        ),
        "",
        *_mem_stage_lines(cells),
    ]


def _slope_lines(cells: Cells) -> list[str]:
    """Fixed cost and cost per weight byte of the qnnx cold peak, from the smallest and the largest model."""
    points = []
    for model, batch in cells.configs:
        runs = cells.runs("qnnx", "cold", model, batch)
        peak = cells.value("qnnx", "cold", model, batch, get_mem)
        if runs and peak is not None:
            points.append((median(r["weight_bytes"] for r in runs.values()), peak, model, batch))
    if len(points) < 2:
        return []
    # Same architecture at two sizes when available (mlp and mlp_large at batch 1), else the extremes.
    by_name = {(m, b): pt for pt in points for m, b in [(pt[2], pt[3])]}
    if ("mlp", 1) in by_name and ("mlp_large", 1) in by_name:
        small, large = by_name[("mlp", 1)], by_name[("mlp_large", 1)]
    else:
        small, large = min(points), max(points)
    if large[0] - small[0] < 50 * 2**20:
        return []
    slope = (large[1] - small[1]) / (large[0] - small[0])
    return [
        f"From {small[2]} (batch {small[3]}, {mib(small[0])} MiB of weights) to {large[2]} (batch {large[3]}, "
        f"{mib(large[0])} MiB) the qnnx cold peak grows by {mib(large[1] - small[1])} MiB: about {slope:.1f} bytes "
        f"per weight byte on top of a fixed {mib(small[1] - slope * small[0])} MiB (QNN libraries and the simulator,",
        f"the imports of the compile). The {TARGETS['mem_weights'].bound}x target can only hold for weight-dominated models, and only if the",
        f"per-byte cost itself is below {TARGETS['mem_weights'].bound}.",
        *_floor_lines(cells, small, large),
        "",
    ]


def _floor_lines(cells: Cells, small: tuple[Any, ...], large: tuple[Any, ...]) -> list[str]:
    """The same slope for ONNX Runtime + QNN alone on the same ONNX models: what no ORT-based backend avoids."""
    lo = cells.value("ortqnn", "cold", small[2], small[3], get_mem)
    hi = cells.value("ortqnn", "cold", large[2], large[3], get_mem)
    if lo is None or hi is None:
        return []
    slope = (hi - lo) / (large[0] - small[0])
    return [
        f"ONNX Runtime + QNN alone, on the same ONNX models, peak at {mib(lo)} and {mib(hi)} MiB: {slope:.1f} bytes",
        f"per weight byte on top of {mib(lo - slope * small[0])} MiB, i.e. {hi / large[0]:.2f}x the weights of "
        f"{large[2]} before any Dynamo or export work.",
    ]


def _mem_stage_lines(cells: Cells) -> list[str]:
    lines = [
        "Where the qnnx peak comes from: the peak above the same baseline reached *during* each span of the first",
        "call (the high-water mark is read and reset at each span boundary), and the memory still held after the",
        "call and a `gc.collect()` (*held after*: live objects, sessions and libraries, not garbage). Spans are",
        "cumulative: a stage's figure includes what earlier stages left in memory.",
        "",
    ]
    for phase in ("cold", "warm"):
        rows = []
        for model, batch, _, med in cells.medians("qnnx", phase, mem_stages):
            rows.append(
                [model, str(batch)] + [mib(med[k]) for k, *_ in MEM_STAGES] + [mib(med["retained"]), mib(med["peak"])]
            )
        if rows:
            lines += [
                f"**qnnx {phase}**, MiB",
                "",
                *table(["model", "batch"] + [label for _, label, *_ in MEM_STAGES] + ["held after", "peak"], rows),
                "",
            ]
    return lines


def stage_section(cells: Cells) -> list[str]:
    lines = ["## Where the qnnx first call spends its time (seconds, medians)", ""]
    lines += [
        "*Dynamo trace*: from the call to the moment Dynamo calls the `qnn` backend; *qnn_backend()*: the backend",
        "function (option parsing; compilation is deferred to the first call of the graph); *Dynamo after backend*:",
        "guards and bytecode until the compiled graph is first called; *lazy imports*: qnnx-export and the other",
        "packages the compile imports on first use; *device probe*: qnnx-detection's once-per-process probe of the",
        "QNN backends (it creates a small session on each); *analyze* ... *QNN session*: `CompileReport.timings`",
        "(the export stage includes the first import of torch.onnx/onnxscript; *QNN session* is graph",
        "finalization plus writing the context on a miss, loading the context on a hit); *other*: the rest of the",
        "compile (cache key, versions, single-flight lock, staging and publishing the entry); *first run*: the first",
        "`run()` and the conversion of outputs. *GC pauses*: the garbage collector's pauses during the call, inside",
        "the stages before them (a full collection of a heap holding torch takes 0.1-0.2 s and lands wherever an",
        "allocation crosses its threshold). *qnnx host work*: the first call without Dynamo (trace and after the",
        "backend), the QNN session, the first run and GC pauses: qnnx's own work above Dynamo and the ORT+QNN floor.",
        "",
    ]
    for phase in ("cold", "warm"):
        rows = []
        for model, batch, runs, med in cells.medians("qnnx", phase, stages):
            ngraphs = max(len(r.get("graphs") or ()) for r in runs.values())
            rows.append(
                [model, str(batch), str(ngraphs), num(med["first_call"])]
                + [num(med[k]) for k, _ in STAGES]
                + [num(med["gc"]), num(med["qnnx_host"])]
            )
        if rows:
            lines += [
                f"**{phase}** ({'empty cache: export, check, compile, write the context' if phase == 'cold' else 'context cache hit: load the context'})",
                "",
                *table(
                    ["model", "batch", "graphs", "first call"]
                    + [label for _, label in STAGES]
                    + ["GC pauses (in the stages)", f"qnnx host work (<= {TARGETS['qnnx_host_s'].bound})"],
                    rows,
                ),
                "",
            ]
    return lines


def import_section(cells: Cells, deps: dict[str, Any] | None = None) -> list[str]:
    by_module: dict[str, list[float]] = defaultdict(list)
    for runs in cells.ok.values():
        for res in runs.values():
            for mod, secs in (res.get("imports_s") or {}).items():
                by_module[mod].append(secs)
    rows = [[f"`import {m}`", num(median(v)), num(min(v)), num(max(v)), str(len(v))] for m, v in by_module.items()]
    lines = [
        "## Imports",
        "",
        "Seconds to import, in each fresh child process (not part of the first-call figures). `import qnnx_backend`",
        "does no work by design; the packages the compile needs are imported during the first call and counted there.",
        "",
        *table(["import", "median", "min", "max", "processes"], rows),
        "",
    ]
    if deps and deps.get("seconds"):
        versions = deps.get("versions") or {}
        dep_rows = [
            [f"`import {m}`", versions.get(m) or versions.get(m.replace("_", "-")) or "–", num(secs, 3)]
            for m, secs in deps["seconds"].items()
        ]
        lines += [
            "The third-party packages a cold compile imports inside its first call (the *ONNX export* and *device",
            "probe* stages), each after torch, Dynamo and the ones above it; median of "
            f"{deps.get('processes', '?')} fresh processes (`python -X importtime`). A context-cache hit and a",
            "loaded saved function import none of onnx, onnx-ir or ml_dtypes.",
            "",
            *table(["import", "version", "seconds"], dep_rows),
            "",
        ]
    return lines


def accuracy_section(cells: Cells) -> list[str]:
    rows = []
    for model, batch in cells.configs:
        c = cells

        def worst(variant: str, phase: str, m: str = model, b: int = batch) -> str:
            vals = [safe(get_accuracy, r) for r in cells.runs(variant, phase, m, b).values()]
            vals = [v for v in vals if v is not None]
            return f"{max(vals):.1e}" if vals else "–"

        raw = [
            safe(lambda r: r["raw_vs_compiled"]["max_rel_err"], r)
            for r in c.runs("qnnx", "warm", model, batch).values()
        ]
        raw = [v for v in raw if v is not None]
        rows.append(
            [
                model,
                str(batch),
                worst("qnnx", "cold"),
                worst("qnnx", "warm"),
                f"{max(raw):.1e}" if raw else "–",
                worst("openvino", "cold"),
                worst("inductor", "cold"),
            ]
        )
    return [
        "## Accuracy of the first call against eager PyTorch",
        "",
        "max |out - eager| / max |eager| over all outputs, worst over runs. HTP computes float graphs in fp16",
        "(QAIRT >= 2.35), so about 1e-3 is expected there. OpenVINO's CPU plugin runs in bf16 by default on CPUs",
        "with AMX/AVX512-BF16 (this one has them), hence its 1e-3 to 1e-2.",
        "",
        *table(
            ["model", "batch", "qnnx cold", "qnnx warm (cache hit)", "raw ORT vs qnnx", "OpenVINO", "Inductor"], rows
        ),
        "",
    ]


def failures_section(cells: Cells) -> list[str]:
    if not cells.failed:
        return []
    seen: dict[tuple[str, str, str, int], tuple[int, str]] = {}
    for f in cells.failed:
        s = f["spec"]
        key = (s["model"], s["batch"], s["variant"], s["phase"])
        count, _ = seen.get(key, (0, ""))
        seen[key] = (count + 1, f.get("error", "?").splitlines()[0][:300])
    rows = [[m, str(b), v, p, str(n), e.replace("|", "\\|")] for (m, b, v, p), (n, e) in sorted(seen.items())]
    return [
        "## Failed measurements",
        "",
        *table(["model", "batch", "backend", "phase", "runs failed", "error"], rows),
        "",
    ]


def method_section(data: dict[str, Any], args: dict[str, Any]) -> list[str]:
    models = data.get("models", {})
    runs = data["meta"].get("runs_completed", args["runs"])
    comparison = min(args.get("comparison_runs", runs), runs)
    return [
        "## Method",
        "",
        "- Models (fixed seeds, no downloads; `tools/bench/_models.py`): "
        + "; ".join(f"**{k}**: {v}" for k, v in models.items())
        + f". Batches {', '.join(map(str, args['batches']))} (mlp_large: 1). float32, `.eval()`, under "
        "`torch.no_grad()`.",
        "- One child process per measurement (`tools/bench/_child.py`), one after the other. Per run and model x",
        "  batch, in this order: qnnx cold, qnnx warm (+ steady state), qnnx AOT save (`aot_compile`, first call,",
        "  `save_compiled_function`) and AOT warm (`load_compiled_function` + first call), ORT+QNN alone (the",
        "  exported model's QNN session and first run, `_child._ort_qnn_alone`), OpenVINO cold without a cache; and in the",
        f"  first {comparison} of the {runs} run(s) also OpenVINO cold with `model_caching`, OpenVINO warm (+ steady",
        "  state), Inductor cold, Inductor warm (+ steady state): they are context, not targets, and Inductor's cold",
        "  compile alone takes 20-60 s per model on 2 cores. Each run starts from empty caches (a new qnnx",
        "  `cache_dir`, OpenVINO `cache_dir`, `TORCHINDUCTOR_CACHE_DIR`).",
        "- qnnx: `torch.compile(model, backend='qnn', options={'device': 'npu', 'strict': True, 'cache': True,",
        "  'cache_dir': DIR, 'soc_model': 60})`; OpenVINO: `import openvino.torch`, `backend='openvino'`,",
        "  `options={'device': 'CPU'}` (+ `'model_caching': True, 'cache_dir': DIR`); Inductor: `torch.compile(model)`.",
        "- First call: `time.perf_counter()` around the first call of the compiled model. Figures are medians over",
        "  runs; ratios are computed within a run (cold and warm of the same run, compiled and raw ORT in the same",
        "  process) and the median of those is shown.",
        "- Steady state: 3 rounds; in each, a block of calls per function (compiled model, raw ORT, eager) in",
        "  rotating order, each block after a 0.2 s pause and one untimed call; "
        + f"{args['steady_seconds']} s in all (at least 3 calls each). Not call by call: right after a simulator run",
        "  its 11 threads keep spinning, and an eager call squeezed in then took 128 ms instead of 0.5 ms (CNN).",
        "- Peak memory: see its section. Weight bytes: parameters and buffers of the PyTorch model.",
        "- Children read the bytecode of the qnnx packages from a cache the harness fills first (`PYTHONPYCACHEPREFIX`",
        "  in its work folder), as an installed qnnx has its `.pyc` files: compiling this repository's editable",
        "  sources in every process would add 0.15-0.2 s to each first call. Every process imports `torch` and",
        "  `torch._dynamo` before its measured call (listed under [Imports](#imports)).",
        "- The stage breakdown wraps `qnnx_backend.qnn_backend`, `QnnGraph._compile`, `qnnx_detection.probe` and",
        "  `.create_session`, `qnnx_export.fingerprint` and `.export` and `qnnx_opcheck.check_model` (patched right",
        "  after their lazy import, so no import moves out of the first call) with timestamps and RSS readings at the",
        "  first entry and exit, and reads `CompileReport.timings`.",
        "- OpenVINO's backend hands graphs it cannot convert to Inductor, and partitions that fail to run to eager",
        "  PyTorch, logging this at DEBUG only; the harness listens to its logger and marks such figures.",
        "- Benchmarks are not tests: nothing here asserts a time.",
        "",
    ]
