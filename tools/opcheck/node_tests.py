"""Hold qnnx-opcheck's HTP verdicts against the live QNN EP on ONNX's own node tests.

ONNX ships one small model per operator behaviour, with inputs and the expected outputs
(``onnx.backend.test.case.node.collect_testcases``). For each case this tool asks opcheck for its whole-model verdict
(``qnnx_opcheck.check_model``: supported when no node is unsupported, hazards included) and runs the model on QNN HTP
(tools/opcheck/batch.py: child processes taking the cases in order, CPU fallback disabled, soc_model set; a native
crash costs one case). The live outcome is ``refused`` (session creation or the run failed), ``crash``, ``right``
(every output matches the expected one: same shape, integers and bools equal, floats within 1e-2 of the output's
scale plus 1e-3, NaN and inf at the same positions) or ``wrong``.

Classes: ``agree`` (supported and right, or unsupported and not right), ``supported_but_wrong`` and
``supported_but_crash`` (the outcomes that must never happen: qnnx would put a wrong or fatal graph on the NPU),
``supported_but_refused`` (one failed session attempt before the fallback), ``unsupported_but_right`` (coverage
left on the table) and ``skipped``: a case whose graph carries a type outside the tables (double, string,
sequences, 4-bit and 8-bit floats...) that opcheck refuses is not run; it counts as agreement.

Usage (the full set takes about an hour on the 2-core bench; run it at nice 15):
    python tools/opcheck/node_tests.py --every 10            # a sample: every 10th case
    python tools/opcheck/node_tests.py --only gather         # cases whose name contains a string (repeatable)
    python tools/opcheck/node_tests.py --record              # all cases; writes tools/opcheck/data/node-tests-...
    python tools/opcheck/node_tests.py --reverdict           # recompute opcheck's verdicts of the record, no runs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import batch  # noqa: E402

# Element types the HTP tables have cells for; any other type in a graph's inputs, outputs or initializers is
# outside what QNN can take in principle.
TABLE_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.INT16,
        onnx.TensorProto.BOOL,
    }
)
CLASSES = (
    "agree",
    "skipped",
    "supported_but_wrong",
    "supported_but_crash",
    "supported_but_refused",
    "unsupported_but_right",
    "fp16_inherent",
    "nonfinite_input",
    "not_measured",
)


def record_path(soc_model: int) -> Path:
    return HERE / "data" / f"node-tests-htp-{metadata.version('onnxruntime-qnn')}-soc{soc_model}.json"


def collect(only: Iterable[str] = (), every: int = 1) -> list[Any]:
    """ONNX's node test cases, sorted by name; ``only`` keeps names containing one of the strings, ``every`` keeps
    every n-th case of the sorted list."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():  # the cases' own generators overflow casts on purpose
        warnings.simplefilter("ignore")
        cases = sorted(collect_testcases(None), key=lambda c: c.name)
    cases = cases[::every]
    only = list(only)
    return [c for c in cases if not only or any(part in c.name for part in only)]


def _value_types(model: onnx.ModelProto) -> list[onnx.TypeProto]:
    g = model.graph
    return [v.type for v in (*g.input, *g.output)]


def outside_tables(model: onnx.ModelProto) -> str | None:
    """Why the graph cannot be taken by QNN in principle (a type the tables have no cell for), or None."""
    for t in _value_types(model):
        which = t.WhichOneof("value")
        if which != "tensor_type":
            return f"a {which} value"
        if t.tensor_type.elem_type not in TABLE_TYPES:
            return f"element type {onnx.TensorProto.DataType.Name(t.tensor_type.elem_type)}"
    for init in model.graph.initializer:
        if init.data_type not in TABLE_TYPES:
            return f"an initializer of {onnx.TensorProto.DataType.Name(init.data_type)}"
    return None


def verdict(model: onnx.ModelProto, soc_model: int) -> tuple[bool, str]:
    """opcheck's whole-model HTP verdict: (supported, the first unsupported node's op and reason)."""
    import qnnx_opcheck

    try:
        report = qnnx_opcheck.check_model(model, "htp", soc_model=soc_model)
    except qnnx_opcheck.errors.QnnxOpcheckError as exc:
        return False, f"opcheck error: {str(exc)[:200]}"
    first = next(iter(report.unsupported), None)
    return report.supported, "" if first is None else f"{first.op_type}: {(first.reason or first.kind)[:200]}"


def classify(supported: bool, outcome: str, row: dict[str, Any] | None = None) -> str:
    """The agreement class of one case. Two kinds of wrong case are what HTP is for any op, with runtime data a
    static check cannot see, and are documented rather than guarded (as conformance.py's ``fp16_range``):
    ``fp16_inherent`` (the outputs match the reference computed on the inputs rounded to fp16) and
    ``nonfinite_input`` (a feed holds inf or NaN, and the outputs match wherever the expected one is finite)."""
    row = row or {}
    if supported and outcome == "wrong" and row.get("fp16_inputs"):
        return "fp16_inherent"
    if supported and outcome == "wrong" and row.get("nonfinite_inputs"):
        return "nonfinite_input"
    if outcome in ("no_reference", "probe_error"):
        return "not_measured"
    if outcome == "skipped":
        return "skipped"
    if supported:
        return {"right": "agree", "refused": "supported_but_refused"}.get(outcome, f"supported_but_{outcome}")
    return "unsupported_but_right" if outcome == "right" else "agree"


def _array(value: Any) -> Any:
    """A feed ONNX Runtime takes: some cases give a numpy scalar or a TensorProto."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return np.asarray(value) if isinstance(value, np.generic) else value


def _item(case: Any) -> batch.LiveItem:
    inputs, outputs = case.data_sets[0]
    names = [i.name for i in case.model.graph.input]
    feeds = {k: _array(v) for k, v in zip(names, inputs, strict=False)}
    return batch.LiveItem(case.name, case.model.SerializeToString(), feeds, [_array(o) for o in outputs])


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by class and by live outcome, and the agreement share of the measured cases."""
    by_class = {k: sum(r["class"] == k for r in rows) for k in CLASSES}
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    measured = len(rows) - by_class["not_measured"]
    agreed = by_class["agree"] + by_class["skipped"]
    return {
        "cases": len(rows),
        "measured": measured,
        "agreement": round(100.0 * agreed / measured, 2) if measured else 0.0,
        "classes": by_class,
        "outcomes": dict(sorted(outcomes.items())),
    }


def run(cases: list[Any], soc_model: int, timeout: float, chunk: int) -> list[dict[str, Any]]:
    """Verdicts and live outcomes of ``cases`` (the live side in batches of ``chunk`` cases)."""
    rows: dict[str, dict[str, Any]] = {}
    todo: list[batch.LiveItem] = []
    for case in cases:
        supported, reason = verdict(case.model, soc_model)
        row: dict[str, Any] = {"case": case.name, "supported": supported, "reason": reason}
        outside = outside_tables(case.model)
        if outside and not supported:
            row.update(outcome="skipped", why=outside)
        else:
            todo.append(_item(case))
        rows[case.name] = row
    print(f"{len(cases)} cases, {len(todo)} to run on QNN HTP", flush=True)
    t0 = time.monotonic()
    for k in range(0, len(todo), chunk):
        part = todo[k : k + chunk]
        for name, result in batch.run_batch(part, str(soc_model), timeout).items():
            rows[name].update(result)
        print(f"[{min(k + chunk, len(todo))}/{len(todo)}] {time.monotonic() - t0:.0f} s", flush=True)
    out = []
    for row in rows.values():
        row["class"] = classify(row["supported"], row["outcome"], row)
        if isinstance(row.get("err"), float) and not np.isfinite(row["err"]):
            row["err"] = None
        out.append(row)
    return out


def _reverdict(path: Path, soc_model: int) -> int:
    record = json.loads(path.read_text())
    cases = {c.name: c for c in collect()}
    for row in record["cases"]:
        case = cases.get(row["case"])
        if case is None:
            continue
        row["supported"], row["reason"] = verdict(case.model, soc_model)
        if row["outcome"] == "skipped" and row["supported"]:
            row["outcome"] = "not_run"  # now supported: it has to be run to be judged
        row["class"] = classify(row["supported"], row["outcome"], row)
    record["summary"] = summarize(record["cases"])
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("summary:", json.dumps(record["summary"]))
    return _report(record["cases"])


def _report(rows: list[dict[str, Any]]) -> int:
    bad = [r for r in rows if r["class"] in ("supported_but_wrong", "supported_but_crash", "not_measured")]
    for r in bad:
        print(f"{r['class'].upper()}: {r['case']} ({r.get('why') or r.get('error') or r.get('rc')})")
    return 1 if any(r["class"] != "not_measured" for r in bad) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="cases whose name contains this (repeatable)")
    parser.add_argument("--every", type=int, default=1, help="every n-th case of the sorted list (a sample)")
    parser.add_argument("--soc-model", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds without progress before a kill")
    parser.add_argument("--chunk", type=int, default=100, help="cases per batch of child processes")
    parser.add_argument("--json", type=Path, default=None, help="write every case's row here")
    parser.add_argument(
        "--record",
        action="store_true",
        help="write tools/opcheck/data/node-tests-htp-<onnxruntime-qnn>-soc<N>.json (a partial run merges into it)",
    )
    parser.add_argument("--reverdict", action="store_true", help="recompute opcheck's verdicts of the record")
    args = parser.parse_args(argv)
    if args.reverdict:
        return _reverdict(record_path(args.soc_model), args.soc_model)
    cases = collect(args.only, args.every)
    rows = run(cases, args.soc_model, args.timeout, args.chunk)
    for r in rows:
        if r["class"] != "agree" and r["class"] != "skipped":
            print(f"{r['class']}: {r['case']}: {r.get('why') or r.get('error') or r.get('reason') or ''}"[:240])
    summary = summarize(rows)
    print("summary:", json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "cases": rows}, indent=1) + "\n")
    if args.record:
        out = record_path(args.soc_model)
        if (args.only or args.every > 1) and out.exists():
            ran = {r["case"] for r in rows}
            rows = [r for r in json.loads(out.read_text())["cases"] if r["case"] not in ran] + rows
            rows.sort(key=lambda r: r["case"])
        meta = {
            "onnxruntime_qnn": metadata.version("onnxruntime-qnn"),
            "onnxruntime": metadata.version("onnxruntime"),
            "onnx": onnx.__version__,
            "qnnx_opcheck": metadata.version("qnnx-opcheck"),
            "soc_model": args.soc_model,
            "date": time.strftime("%Y-%m-%d"),
            "tolerance": f"{batch.TOLERANCE:g} of the output's scale + {batch.ABSOLUTE_FLOOR:g}",
            "tool": "tools/opcheck/node_tests.py",
        }
        out.write_text(json.dumps({"provenance": meta, "summary": summarize(rows), "cases": rows}, indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return _report(rows)


if __name__ == "__main__":
    sys.exit(main())
