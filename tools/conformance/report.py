"""Turn a conformance JSONL (tools/conformance/run.py) into docs/conformance.md and docs/conformance.json.

Examples:
    python tools/conformance/report.py --jsonl build/conformance/cases.jsonl --out docs/
    python tools/conformance/run.py --report-only --jsonl build/conformance/cases.jsonl   # the same
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402  (a sibling module of this script)

DISTRIBUTIONS = ("torch", "onnxruntime", "onnxruntime-qnn", "qnnx-backend", "qnnx-export", "qnnx-opcheck")
DEFAULT_JSONL = ROOT / "build" / "conformance" / "cases.jsonl"
INTEREST = ("wrong", "crash", "error")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _cell(text: Any, limit: int | None = None) -> str:
    """Markdown table cell: sanitized, one line, pipes escaped."""
    if text is None or text == "":
        return ""
    s = harness.sanitize(str(text), limit) or ""
    return s.replace("|", "\\|")


def _graph_summary(graphs: list[dict[str, Any]]) -> str:
    parts = []
    for g in graphs:
        bits = [g.get("device", "?")]
        if g.get("exporter"):
            bits.append(f"exporter {g['exporter']}")
        if g.get("onnx_ops"):
            bits.append("ONNX " + ", ".join(g["onnx_ops"][:8]))
        elif g.get("fx_ops"):
            bits.append("FX " + ", ".join(g["fx_ops"][:8]))
        cpu = (g.get("placement") or {}).get("CPUExecutionProvider")
        if cpu:
            bits.append(f"{cpu} node(s) on the ORT CPU EP")
        if g.get("passes_applied"):
            bits.append("passes " + ", ".join(g["passes_applied"]))
        parts.append("; ".join(bits))
    return " / ".join(parts) if parts else "no graph"


_SHAPE = re.compile(r"\[([^\]]*)\]$")


def _only_empty(outputs: list[str]) -> bool:
    """Whether every output (``"float32[0, 5]"``; a Python scalar has no brackets) has a dimension of 0."""
    dims = [_SHAPE.search(o) for o in outputs]
    return bool(outputs) and all(m is not None and "0" in [d.strip() for d in m.group(1).split(",")] for m in dims)


def summarize(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    recs = sorted(records.values(), key=lambda r: (r["op"], r.get("sample", 0)))
    status = Counter(r["status"] for r in recs)
    categories = Counter(r.get("category", "?") for r in recs if r["status"] == "fallback")
    qnn_devices = Counter("+".join(sorted(set(r.get("devices") or []))) for r in recs if r["status"] == "qnn")
    errors = Counter(r.get("error_type", "?") for r in recs if r["status"] == "error")
    wrong_kinds = Counter((r.get("mismatch") or {}).get("kind", "?") for r in recs if r["status"] == "wrong")
    valid = len(recs) - status["invalid"]
    totals = {"cases": len(recs), **{s: status[s] for s in harness.STATUSES}, "valid": valid}
    empty_only = [r for r in recs if r["status"] != "invalid" and _only_empty(r.get("outputs") or [])]
    ops: dict[str, dict[str, Any]] = {}
    for r in recs:
        row = ops.setdefault(r["op"], {"cases": 0, **dict.fromkeys(harness.STATUSES, 0), "first_fallback_reason": None})
        row["cases"] += 1
        row[r["status"]] += 1
        if r["status"] == "fallback" and row["first_fallback_reason"] is None:
            reasons = r.get("reasons") or [r.get("category")]
            row["first_fallback_reason"] = harness.sanitize(f"[{r.get('category')}] {reasons[0]}", 200)
    interest = []
    for r in recs:
        if r["status"] not in INTEREST:
            continue
        item = {
            "id": r["id"],
            "status": r["status"],
            "detail": harness.sanitize(r.get("detail"), 300),
            "inputs": r.get("inputs"),
            "outputs": r.get("outputs"),
            "devices": r.get("devices"),
        }
        for key in ("rel_err", "error_type", "phase", "values_compared", "note"):
            if key in r:
                item[key] = r[key]
        if r.get("mismatch"):
            item["mismatch"] = r["mismatch"]
        if r.get("graphs"):
            item["graphs"] = [
                {
                    k: g.get(k)
                    for k in (
                        "device",
                        "exporter",
                        "fast_path_declined",
                        "fx_ops",
                        "onnx_ops",
                        "passes_applied",
                        "placement",
                        "reason",
                    )
                    if g.get(k) not in (None, [], {})
                }
                for g in r["graphs"]
            ]
        if r["status"] == "crash" and r.get("log_tail"):
            item["log_tail"] = harness.sanitize(r["log_tail"], 400)
        if r["status"] == "error" and r.get("where"):
            item["where"] = r["where"]
        interest.append(item)
    return {
        "totals": totals,
        "qnn_share_of_valid": round(status["qnn"] / valid, 4) if valid else None,
        # Valid cases whose every output has no elements: nothing to compute, and QNN holds no empty tensor.
        "empty_outputs_only": {
            "cases": len(empty_only),
            "qnn": sum(r["status"] == "qnn" for r in empty_only),
            "qnn_share_of_the_others": (
                round((status["qnn"] - sum(r["status"] == "qnn" for r in empty_only)) / (valid - len(empty_only)), 4)
                if valid > len(empty_only)
                else None
            ),
        },
        # Cases that passed only with the allowance for fp16's own error on the sample (harness.FP16_FUDGE).
        "fp16_sensitive": [
            {"id": r["id"], "status": r["status"], **r["fp16_sensitive"]} for r in recs if r.get("fp16_sensitive")
        ],
        "qnn_devices": dict(qnn_devices.most_common()),
        "fallback_by_category": dict(categories.most_common()),
        "errors_by_type": dict(errors.most_common()),
        "wrong_by_kind": dict(wrong_kinds.most_common()),
        "ops": ops,
        "cases_of_interest": interest,
        "case_status": {r["id"]: r["status"] for r in recs},
    }


def _regenerate_command(meta: dict[str, Any]) -> str:
    samples = meta.get("samples", 1)
    cmd = f"python tools/conformance/run.py --samples {samples or 'all'}"
    if meta.get("ops"):
        cmd += f" --ops '{meta['ops']}'"
    return cmd


def write(records: dict[str, dict[str, Any]], meta: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write ``out/conformance.md`` and ``out/conformance.json``; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(records)
    vers = meta.get("versions") or versions()
    date = (meta.get("finished") or meta.get("started") or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))[:10]
    command = _regenerate_command(meta)
    doc = {
        "generated_by": command,
        "date": date,
        "versions": vers,
        "settings": {
            "samples_per_op": meta.get("samples", 1),
            "ops_filter": meta.get("ops"),
            "options": {"device": "auto"},
            "soc_model": meta.get("soc_model", harness.DEFAULT_SOC_MODEL),
            "rtol": harness.RTOL,
            "atol": harness.ATOL,
            "fp16_fudge": harness.FP16_FUDGE,
            "timeout_s": meta.get("timeout"),
            "wall_minutes": meta.get("wall_minutes"),
            "segments": meta.get("segments"),
            "finished_segments": meta.get("finished_segments"),
        },
        **summary,
    }
    (out / "conformance.json").write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    (out / "conformance.md").write_text(_markdown(doc))
    return doc


def _markdown(doc: dict[str, Any]) -> str:
    t = doc["totals"]
    v = doc["versions"]
    s = doc["settings"]
    n = s["samples_per_op"]
    samples = (
        "every sample input"
        if n == harness.ALL_SAMPLES
        else "its first sample input"
        if n == 1
        else f"its first {n} sample inputs"
    )
    lines = [
        "# Operator conformance",
        "",
        f"_Generated by `{doc['generated_by']}` on {doc['date']}; do not edit by hand. "
        "`python tools/conformance/report.py --jsonl <cases.jsonl>` rebuilds this page and `conformance.json` "
        "from a run's JSONL._",
        "",
        f"torch {v.get('torch')}, onnxruntime {v.get('onnxruntime')}, onnxruntime-qnn {v.get('onnxruntime-qnn')}, "
        f"qnnx-backend {v.get('qnnx-backend')}, qnnx-export {v.get('qnnx-export')}; QNN HTP simulator on x86_64, "
        f"soc_model {s['soc_model']}.",
        "",
        "Every entry of PyTorch's OpInfo database (`torch.testing._internal.common_methods_invocations.op_db`) that "
        f"supports float32 on the CPU, with {samples} (made from a fixed seed), is called through "
        '`torch.compile(fn, backend="qnn", options={"device": "auto"})` under `torch.no_grad()` and compared with '
        "eager PyTorch. Each case is one of:",
        "",
        "- **qnn**: every graph of the call ran on QNN and the outputs match eager PyTorch;",
        "- **fallback**: the outputs match, but at least one graph ran in PyTorch (or Dynamo made no graph at all);",
        "- **wrong**: an output differs from eager PyTorch: structure, shape, dtype, NaN or inf positions, integer "
        f"or bool values, or float values beyond max\\|got-ref\\| <= {s['rtol']:g} * max\\|ref\\| + {s['atol']:g} "
        "(compared in float64 over the finite elements), plus, for a sample fp16 itself cannot meet that on, "
        f"{s.get('fp16_fudge', harness.FP16_FUDGE):g} times the error that rounding its float inputs to fp16 causes "
        "in eager PyTorch (such cases are listed below). Ops whose outputs are random or undefined are compared "
        "on structure, shape and dtype only;",
        "- **error**: the compiled call raised where eager PyTorch did not;",
        "- **crash**: the process died or hung (over "
        f"{(s.get('timeout_s') or harness.DEFAULT_TIMEOUT):.0f} s) on the case;",
        "- **invalid**: eager PyTorch itself raised on the sample: not counted as valid.",
        "",
        "The QNN HTP simulator computes float graphs in fp16, so the tolerance is fp16-level. A case id is "
        "`<op>[.<variant>]#<sample index>`.",
        "",
        "## Totals",
        "",
        "| cases | valid | qnn | fallback | wrong | error | crash | invalid | qnn share of valid |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {t['cases']} | {t['valid']} | {t['qnn']} | {t['fallback']} | {t['wrong']} | {t['error']} | {t['crash']} "
        f"| {t['invalid']} | "
        + (f"{100 * doc['qnn_share_of_valid']:.1f}%" if doc["qnn_share_of_valid"] is not None else "-")
        + " |",
        "",
    ]
    empty = doc.get("empty_outputs_only") or {}
    if empty.get("cases"):
        share = empty.get("qnn_share_of_the_others")
        lines += [
            f"Of the valid cases, {empty['cases']} return only empty tensors (every output has a dimension of 0): "
            "there is nothing to compute, and QNN HTP cannot hold an empty tensor, so qnnx runs such a graph in "
            f"PyTorch ({empty['qnn']} of them on QNN). Without them the qnn share of valid cases is "
            + (f"{100 * share:.1f}%." if share is not None else "-.")
            + "",
            "",
        ]
    if s.get("wall_minutes") is not None:
        segments, finished = s.get("segments") or 1, s.get("finished_segments") or 1
        if segments <= 1:
            lines += [f"The run took {s['wall_minutes']} minutes.", ""]
        else:
            stopped = segments - finished
            lines += [
                f"The run was resumed: {segments} segments, {s['wall_minutes']} minutes in the {finished} that "
                "finished" + (f" ({stopped} stopped segment(s) recorded no time)." if stopped else ".") + "",
                "",
            ]
    if doc["qnn_devices"]:
        lines += ["Cases on QNN by device: " + ", ".join(f"{k}: {n}" for k, n in doc["qnn_devices"].items()) + ".", ""]
    lines += [
        "### Fallbacks by reason",
        "",
        "`analysis: <kind>`: the backend's graph analysis found something QNN cannot compute faithfully; `exporter`: "
        "the ONNX export failed; `export check`: the exported ONNX model, run on ONNX Runtime's CPU EP, does not "
        "compute what PyTorch computes; `opcheck`: an ONNX node is outside the QNN op tables; `session`: QNN "
        "refused the graph when the session was built; `no graph`: Dynamo captured no graph (the call ran in "
        "PyTorch).",
        "",
        "| reason | cases |",
        "| --- | ---: |",
        *[f"| {_cell(k)} | {n} |" for k, n in doc["fallback_by_category"].items()],
        "",
    ]
    if doc["errors_by_type"]:
        lines += [
            "### Errors by exception type",
            "",
            "| exception | cases |",
            "| --- | ---: |",
            *[f"| {_cell(k)} | {n} |" for k, n in doc["errors_by_type"].items()],
            "",
        ]
    lines += [
        "## Wrong, crashed and failed cases",
        "",
    ]
    interest = doc["cases_of_interest"]
    if not interest:
        lines += ["None.", ""]
    for status in INTEREST:
        items = [c for c in interest if c["status"] == status]
        if not items:
            continue
        lines += [
            f"### {status} ({len(items)})",
            "",
            "| case | what differs / what happened | graphs | inputs -> outputs |",
            "| --- | --- | --- | --- |",
        ]
        for c in items:
            io = ", ".join(c.get("inputs") or []) + " -> " + ", ".join(c.get("outputs") or [])
            if c.get("note"):
                io = f"{c['note']}: {io}"
            detail = c.get("detail") or ""
            if c.get("values_compared") is False:
                detail += " (values not compared: random or undefined)"
            if status == "error" and c.get("where"):
                detail += " (at " + " < ".join(reversed(c["where"])) + ")"
            if status == "crash" and c.get("log_tail"):
                detail += f"; log: {c['log_tail'][-200:]}"
            lines.append(
                f"| `{_cell(c['id'])}` | {_cell(detail, 400)} | {_cell(_graph_summary(c.get('graphs') or []), 300)} "
                f"| {_cell(io, 200)} |"
            )
        lines.append("")
    sensitive = doc.get("fp16_sensitive") or []
    if sensitive:
        lines += [
            f"### Within fp16's own error ({len(sensitive)})",
            "",
            "These cases miss the fixed bound but not the error fp16 itself causes on them: rounding only the "
            "inputs to fp16 moves eager PyTorch's output by the figure in the last column.",
            "",
            "| case | status | error (of max\\|ref\\|) | inputs rounded to fp16, in eager (of max\\|ref\\|) |",
            "| --- | --- | ---: | ---: |",
        ]
        for c in sensitive:
            rounding = c.get("input_rounding_rel_err")
            lines.append(
                f"| `{_cell(c['id'])}` | {c['status']} | {c['rel_err']:.3g} | "
                + (f"{rounding:.3g}" if rounding is not None else "-")
                + " |"
            )
        lines.append("")
    lines += [
        "## Per op",
        "",
        "| op | cases | qnn | fallback | wrong | error | crash | invalid | first fallback reason |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for op, row in doc["ops"].items():
        lines.append(
            f"| `{_cell(op)}` | {row['cases']} | {row['qnn']} | {row['fallback']} | {row['wrong']} | {row['error']} "
            f"| {row['crash']} | {row['invalid']} | {_cell(row['first_fallback_reason'], 200)} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python tools/conformance/report.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Examples:") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--jsonl", type=Path, default=DEFAULT_JSONL, help="the run's JSONL (default build/conformance/)")
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="output folder (default: docs/ of the repo)")
    args = p.parse_args(argv)
    if not args.jsonl.exists():
        print(f"no results at {args.jsonl}; run tools/conformance/run.py first", file=sys.stderr)
        return 3
    records = harness.read_jsonl(args.jsonl)
    doc = write(records, harness.read_meta(args.jsonl), args.out)
    print(json.dumps({"totals": doc["totals"], "fallback_by_category": doc["fallback_by_category"]}, indent=1))
    print(f"wrote {args.out / 'conformance.md'} and {args.out / 'conformance.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
