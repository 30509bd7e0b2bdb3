"""The figures of run.py's raw results: results indexed by variant, phase, model and batch, the getters of one
result's figures, the stages of a first call, and the summary each target is judged on.

Medians over runs for each figure; each ratio is computed within one run (cold and warm of the same sweep, compiled
and raw ORT in the same process) and the median of those per-run ratios is reported.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from _targets import TARGETS

# Stages of a cold qnnx first call, in time order: (key, label).
STAGES = (
    ("dynamo_before", "Dynamo trace"),
    ("backend_call", "qnn_backend()"),
    ("dynamo_after", "Dynamo after backend"),
    ("lazy_imports", "lazy imports"),
    ("probe", "device probe"),
    ("analyze", "analyze"),
    ("fingerprint", "fingerprint"),
    ("cache_lookup", "cache lookup"),
    ("export", "ONNX export"),
    ("opcheck", "opcheck"),
    ("session", "QNN session"),
    ("other", "other (key, store)"),
    ("first_run", "first run"),
)


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


class Cells:
    """Successful results indexed by (variant, phase, model, batch) -> {run: result}; failures kept aside."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.ok: dict[tuple[str, str, str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
        self.failed: list[dict[str, Any]] = []
        for res in results:
            s = res["spec"]
            if res.get("ok"):
                # OpenVINO with aot_autograd=True is run.py's retry when the default options failed: it stands in
                # for OpenVINO in that run, and is marked.
                variant = "openvino" if s["variant"] == "openvino-aot" else s["variant"]
                self.ok[(variant, s["phase"], s["model"], s["batch"])][s["run"]] = res
            else:
                self.failed.append(res)
        self.configs = sorted(
            {(k[2], k[3]) for k in self.ok} | {(f["spec"]["model"], f["spec"]["batch"]) for f in self.failed},
            key=lambda mb: (_MODEL_ORDER.get(mb[0], 99), mb[1]),
        )

    def runs(self, variant: str, phase: str, model: str, batch: int) -> dict[int, dict[str, Any]]:
        return self.ok.get((variant, phase, model, batch), {})

    def value(self, variant: str, phase: str, model: str, batch: int, get: Callable[[dict], Any]) -> float | None:
        return median(safe(get, r) for r in self.runs(variant, phase, model, batch).values())

    def n(self, variant: str, phase: str, model: str, batch: int) -> int:
        return len(self.runs(variant, phase, model, batch))

    def ratio(
        self,
        num: tuple[str, str],
        den: tuple[str, str],
        model: str,
        batch: int,
        get: Callable[[dict], Any],
        get_den: Callable[[dict], Any] | None = None,
    ) -> float | None:
        """Median over runs of num/den, each pair from the same run."""
        a = self.runs(*num, model, batch)
        b = self.runs(*den, model, batch)
        vals = []
        for run in sorted(set(a) & set(b)):
            x, y = safe(get, a[run]), safe(get_den or get, b[run])
            if x is not None and y:
                vals.append(x / y)
        return median(vals)

    def fallback(self, variant: str, phase: str, model: str, batch: int) -> str:
        """Marks for figures that are not (all) the backend's own, in any run: † OpenVINO gave the graph back to
        eager PyTorch after an error, ‡ to Inductor; § no node was placed on OpenVINO / Inductor generated no
        kernel; ◐ only some nodes were placed on OpenVINO."""
        runs = self.runs(variant, phase, model, batch).values()
        msgs = [m for r in runs for m in r.get("fallback") or ()]
        parts = [p for r in runs for p in r.get("ov_partitions") or ()]
        marks = "ᵃ" if any(r["spec"]["variant"] == "openvino-aot" for r in runs) else ""
        marks += "†" if any(m.startswith("eager") for m in msgs) else ""
        marks += "‡" if any(m.startswith("inductor") for m in msgs) else ""
        if variant == "inductor":
            cold = self.runs(variant, "cold", model, batch).values()
            if any(r.get("inductor_kernels") == 0 for r in cold):
                marks += "§"
        if parts and all(p["openvino_partitions"] == 0 for p in parts):
            marks += "§"
        elif any(p["pytorch_ops"] > 0 for p in parts):
            marks += "◐"
        return marks

    def medians(
        self, variant: str, phase: str, figures: Callable[[dict[str, Any]], dict[str, float | None]]
    ) -> Iterator[tuple[str, int, dict[int, dict[str, Any]], dict[str, float | None]]]:
        """Per model x batch with results: (model, batch, its runs, the median over runs of each figure that
        ``figures`` reads from one result)."""
        for model, batch in self.configs:
            runs = self.runs(variant, phase, model, batch)
            if runs:
                per = [figures(r) for r in runs.values()]
                yield model, batch, runs, {k: median(p.get(k) for p in per) for k in per[0]}

    def failure(self, variant: str, phase: str, model: str, batch: int) -> str | None:
        for f in self.failed:
            s = f["spec"]
            if (s["variant"], s["phase"], s["model"], s["batch"]) == (variant, phase, model, batch):
                return f.get("error", "failed").splitlines()[0]
        return None


_MODEL_ORDER = {"mlp": 0, "cnn": 1, "transformer": 2, "bert": 3, "resnet": 4}


def safe(get: Callable[[dict], Any], res: dict[str, Any]) -> Any:
    try:
        return get(res)
    except (KeyError, TypeError, IndexError):
        return None


def get_first(res: dict[str, Any]) -> float:
    return res["first_call_s"]


def get_with_imports(res: dict[str, Any]) -> float:
    """The first call plus the imports before it (torch and the backend's package): time to first output."""
    return res["first_call_s"] + sum(res["imports_s"].values())


def get_qnnx_part(res: dict[str, Any]) -> float:
    """The qnnx compile alone (QnnGraph._compile): no Dynamo, no first run."""
    return stages(res)["compile_total"]  # type: ignore[return-value]


def get_qnnx_host(res: dict[str, Any]) -> float:
    """qnnx's host work in the first call, above Dynamo and the ORT+QNN floor (see :func:`stages`)."""
    return stages(res)["qnnx_host"]  # type: ignore[return-value]


def get_host(res: dict[str, Any]) -> float:
    """The first call without its first ``run()``: what the simulator's slowness does not inflate."""
    run = stages(res)["first_run"]
    return res["first_call_s"] - run if run is not None else None  # type: ignore[return-value]


def get_steady(name: str) -> Callable[[dict], float]:
    return lambda res: res["steady"][name]["median_ms"]


def get_mem(res: dict[str, Any]) -> float:
    return res["peak_delta_bytes"]


def get_mem_ratio(res: dict[str, Any]) -> float:
    return res["peak_delta_bytes"] / res["weight_bytes"]


def get_steady_ratio(res: dict[str, Any]) -> float:
    return res["steady"]["compiled"]["median_ms"] / res["steady"]["raw_ort"]["median_ms"]


def _timing_sum(res: dict[str, Any], prefix: str) -> float | None:
    vals = [v for g in res.get("graphs") or () for k, v in g["timings"].items() if k.startswith(prefix)]
    return sum(vals) if vals else None


def _marks(res: dict[str, Any]) -> dict[str, tuple[int, float, int | None, int | None]]:
    """First occurrence of each event of the first call: name -> (index, seconds, rss KiB, segment peak KiB)."""
    out: dict[str, tuple[int, float, int | None, int | None]] = {}
    for i, (name, t, rss, hwm) in enumerate(res.get("events") or ()):
        out.setdefault(name, (i, t, rss, hwm))
    return out


def stages(res: dict[str, Any]) -> dict[str, float | None]:
    """The time of each stage of one qnnx first call (seconds), from the child's events and CompileReport.timings."""
    m = _marks(res)
    out: dict[str, float | None] = {}

    def span(a: str, b: str) -> float | None:
        return m[b][1] - m[a][1] if a in m and b in m else None

    out["dynamo_before"] = span("call_start", "backend_enter")
    out["backend_call"] = span("backend_enter", "backend_exit")
    out["dynamo_after"] = span("backend_exit", "compile_enter")
    out["lazy_imports"] = span("compile_enter", "probe_enter")
    out["probe"] = span("probe_enter", "probe_exit")
    for key in ("analyze", "fingerprint", "cache_lookup", "export"):
        out[key] = _timing_sum(res, key)
    out["opcheck"] = _timing_sum(res, "opcheck_")
    out["session"] = _timing_sum(res, "session_")
    total = _timing_sum(res, "total")
    known = ("lazy_imports", "probe", "analyze", "fingerprint", "cache_lookup", "export", "opcheck", "session")
    out["other"] = total - sum(out[k] or 0.0 for k in known) if total is not None else None
    out["compile_total"] = span("compile_enter", "compile_exit")
    out["first_run"] = span("compile_exit", "call_end")
    out["first_call"] = res.get("first_call_s")
    # Garbage-collector pauses: where a full collection lands is chance (see _child._GC_PAUSES).
    pauses = res.get("gc_pauses")
    out["gc"] = sum(b - a for a, b in pauses) if pauses is not None else None
    # qnnx's own host work: the first call without Dynamo (before and after the backend call), the QNN session
    # (graph finalization, or loading a context), the first run and the collector's pauses in what remains, i.e.
    # above Dynamo and the ORT+QNN floor.
    parts = ("dynamo_before", "dynamo_after", "session", "first_run")
    if out["first_call"] is not None and all(out[k] is not None for k in parts):
        host_gc = _gc_within(res, m, ("backend_enter", "backend_exit"), ("compile_enter", "compile_exit"))
        host_gc -= _gc_within(res, m, ("session_enter", "session_exit"))
        out["qnnx_host"] = out["first_call"] - sum(out[k] or 0.0 for k in parts) - host_gc
    else:
        out["qnnx_host"] = None
    # The AOT warm start: torch.compiler.load_compiled_function (sessions from the saved contexts), then the call.
    out["aot_load"] = span("call_start", "aot_loaded")
    if out["aot_load"] is not None:  # no compile step: the first session and the first run from the call's events
        out["session"] = span("session_enter", "session_exit")
        out["first_run"] = span("aot_loaded", "call_end")
    return out


def _gc_within(res: dict[str, Any], marks: dict[str, Any], *spans: tuple[str, str]) -> float:
    """Seconds of garbage-collector pauses inside the given (start event, end event) spans of the first call."""
    total = 0.0
    for a, b in spans:
        if a in marks and b in marks:
            lo, hi = marks[a][1], marks[b][1]
            total += sum(max(0.0, min(hi, end) - max(lo, start)) for start, end in res.get("gc_pauses") or ())
    return total


# Memory spans of a first call: (key, label, first event, last event).
MEM_STAGES = (
    ("dynamo", "Dynamo trace", "call_start", "backend_enter"),
    ("lazy_imports", "lazy imports", "compile_enter", "probe_enter"),
    ("probe", "device probe", "probe_enter", "probe_exit"),
    ("fingerprint", "fingerprint", "fingerprint_enter", "fingerprint_exit"),
    ("export", "ONNX export", "export_enter", "export_exit"),
    ("opcheck", "opcheck", "opcheck_enter", "opcheck_exit"),
    ("session", "QNN session", "session_enter", "session_exit"),
    ("first_run", "first run", "compile_exit", "call_end"),
)


def mem_stages(res: dict[str, Any]) -> dict[str, float | None]:
    """Peak RSS above the pre-call baseline during each span of the first call (bytes), and what stays after it.

    Each event holds the peak of the segment that ends at it, so a span's peak is the max over its segments.
    """
    events = res.get("events") or ()
    m = _marks(res)
    base = res.get("rss_baseline_kib")
    out: dict[str, float | None] = {}
    for key, _, a, b in MEM_STAGES:
        if a not in m or b not in m or base is None:
            out[key] = None
            continue
        peaks = [e[3] for e in events[m[a][0] + 1 : m[b][0] + 1] if e[3] is not None]
        out[key] = (max(peaks) - base) * 1024 if peaks else None
    after_gc = res.get("rss_after_gc_kib")
    out["retained"] = (after_gc - base) * 1024 if after_gc is not None and base is not None else None
    out["peak"] = res.get("peak_delta_bytes")
    return out


def floor_ratio(cells: Cells, model: str, batch: int) -> float | None:
    """(Dynamo's part of the cold qnnx first call + ONNX Runtime and QNN alone) / OpenVINO's cold first call, per
    run: what any torch.compile backend that hands the graph to ORT+QNN pays before any work of its own, against a
    backend that pays Dynamo too."""
    q, o, v = (cells.runs(kind, "cold", model, batch) for kind in ("qnnx", "ortqnn", "openvino"))
    vals = []
    for run in sorted(set(q) & set(o) & set(v)):
        st = stages(q[run])
        dynamo = (st["dynamo_before"], st["dynamo_after"])
        alone, ov = safe(get_first, o[run]), safe(get_first, v[run])
        if None not in dynamo and alone is not None and ov:
            vals.append((sum(dynamo) + alone) / ov)  # type: ignore[arg-type]
    return median(vals)


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """Per model x batch figures and the verdict of each target (what --json prints)."""
    cells = Cells(data["results"])
    rows = []
    for model, batch in cells.configs:
        row = {
            "model": model,
            "batch": batch,
            "qnnx_cold_s": cells.value("qnnx", "cold", model, batch, get_first),
            "qnnx_warm_s": cells.value("qnnx", "warm", model, batch, get_first),
            "warm_cold": cells.ratio(("qnnx", "warm"), ("qnnx", "cold"), model, batch, get_first),
            "qnnx_aot_s": cells.value("qnnx-aot", "warm", model, batch, get_first),
            "aot_cold": cells.ratio(("qnnx-aot", "warm"), ("qnnx", "cold"), model, batch, get_first),
            "qnnx_host_s": cells.value("qnnx", "cold", model, batch, get_qnnx_host),
            "warm_cold_host": cells.ratio(("qnnx", "warm"), ("qnnx", "cold"), model, batch, get_host),
            "warm_cold_qnnx_part": cells.ratio(("qnnx", "warm"), ("qnnx", "cold"), model, batch, get_qnnx_part),
            "openvino_cold_s": cells.value("openvino", "cold", model, batch, get_first),
            "qnnx_ov_cold": cells.ratio(("qnnx", "cold"), ("openvino", "cold"), model, batch, get_first),
            "qnnx_ov_cold_host": cells.ratio(("qnnx", "cold"), ("openvino", "cold"), model, batch, get_host, get_first),
            "ortqnn_ov_cold": cells.ratio(("ortqnn", "cold"), ("openvino", "cold"), model, batch, get_first),
            "floor_ov_cold": floor_ratio(cells, model, batch),
            "qnnx_ovcache_cold": cells.ratio(("qnnx", "cold"), ("openvino-cache", "cold"), model, batch, get_first),
            "qnnx_ov_cold_with_imports": cells.ratio(
                ("qnnx", "cold"), ("openvino", "cold"), model, batch, get_with_imports
            ),
            "compiled_ms": cells.value("qnnx", "warm", model, batch, get_steady("compiled")),
            "raw_ort_ms": cells.value("qnnx", "warm", model, batch, get_steady("raw_ort")),
            "compiled_raw": cells.value("qnnx", "warm", model, batch, get_steady_ratio),
            "mem_bytes": cells.value("qnnx", "cold", model, batch, get_mem),
            "mem_weights": cells.value("qnnx", "cold", model, batch, get_mem_ratio),
        }
        rows.append(row)
    verdicts = {}
    for key, target in TARGETS.items():
        vals = [(r["model"], r["batch"], r[key]) for r in rows if r[key] is not None]
        verdicts[key] = {
            "target": target.bound,
            "met": sum(v <= target.bound for _, _, v in vals),
            "measured": len(vals),
            "worst": max(vals, key=lambda t: t[2]) if vals else None,
        }
    return {"rows": rows, "targets": verdicts}


def stage_share(cells: Cells, phase: str, keys: tuple[str, ...]) -> tuple[float, float] | None:
    """Range over model x batch of the median share of the qnnx first call spent in the given stages."""
    shares = []
    for model, batch in cells.configs:
        per = []
        for r in cells.runs("qnnx", phase, model, batch).values():
            st = stages(r)
            if st["first_call"]:
                per.append(sum(st[k] or 0.0 for k in keys) / st["first_call"])
        if per:
            shares.append(statistics.median(per))
    return (min(shares), max(shares)) if shares else None


def aot_floor_share(cells: Cells, model: str, batch: int) -> float | None:
    """Median share of the AOT warm start spent in its QNN sessions and first run."""

    def share(res: dict[str, Any]) -> float | None:
        st = stages(res)
        if st["session"] is None or st["first_run"] is None or not st["first_call"]:
            return None
        return (st["session"] + st["first_run"]) / st["first_call"]

    return cells.value("qnnx-aot", "warm", model, batch, share)


def get_overhead(kind: str) -> Callable[[dict], float]:
    return lambda res: res["host_overhead"][kind]["median_us"]


def get_accuracy(res: dict[str, Any]) -> float:
    return res["accuracy"]["max_rel_err"]
