"""Generate docs/operators.md from qnnx_opcheck's packaged tables.

    python tools/opcheck/gen_operators_doc.py            # rewrite docs/operators.md
    python tools/opcheck/gen_operators_doc.py --check    # exit 1 if docs/operators.md is out of date

The opcheck test suite runs the --check form, so a table change without a docs refresh fails CI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
DOC = ROOT / "docs" / "operators.md"
COLUMNS = ("float32", "float16", "int32", "int64", "uint8", "bool", "qdq_uint8", "qdq_uint16")
SYMBOL = {
    "supported": "Y",
    "rejected": "·",
    "finalize_error": "E",
    "session_error": "L",
    "crash": "CRASH",
    "wrong_result": "WRONG",
    "run_error": "R",
    "error": "X",
    "unverified": "?",
}


DERIVED_MARK = "†"


def _cell(variant: dict[str, Any], key: str) -> str:
    cell = variant["dtypes"].get(key)
    if not cell:
        return ""
    mark = DERIVED_MARK if cell.get("evidence", "").startswith("derived for ") else ""
    return SYMBOL.get(cell["status"], cell["status"]) + mark


def _qdq_weights(table: Any) -> list[str]:
    """Ops with quantized weights: the outcome for every weight type the QDQ probe wrote."""
    rows = []
    for entry in table.ops.values():
        for variant in entry["variants"]:
            for key, cell in sorted(variant["dtypes"].items()):
                if not key.startswith("qdq_") or ("weights" not in cell and "/w=" not in key):
                    continue
                act, _, weights = key.partition("/w=")
                rows.append(
                    f"| {_label(entry, variant)} | {act} | {weights or cell.get('weights', '')} | "
                    f"{_cell(variant, key)} |"
                )
    if not rows:
        return []
    return [
        "QDQ ops with constant weights, by the weights onnxruntime's QNN tooling wrote (`/per_channel`: one scale per "
        "output channel; an int32 bias is always part of the form). A node whose weights are not listed for its "
        "activation type is reported as a hazard:",
        "",
        "| op | activations | weights | outcome |",
        "|---|---|---|---|",
        *rows,
    ]


def _label(entry: dict[str, Any], variant: dict[str, Any]) -> str:
    op = entry["op_type"] if not entry["domain"] else f"{entry['domain']}::{entry['op_type']}"
    if variant.get("when"):
        return f"{op} ({variant.get('description') or _when(variant['when'])})"
    return op


def _when(when: dict[str, Any]) -> str:
    parts = []
    for k, v in when.items():
        if k == "rank":
            parts.append(
                f"input rank {v[0]}" + (f"-{v[1]}" if v[1] != v[0] else "") if v[1] < 64 else f"input rank >= {v[0]}"
            )
        elif k == "output_rank":
            parts.append(f"output rank >= {v[0]}")
        elif k == "attr":
            parts.extend(f"{a} in {vals}" for a, vals in v.items())
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts)


def _grid(table: Any) -> list[str]:
    cols = [c for c in COLUMNS if any(c in v["dtypes"] for e in table.ops.values() for v in e["variants"])]
    lines = ["| op | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for entry in table.ops.values():
        for variant in entry["variants"]:
            lines.append(f"| {_label(entry, variant)} | " + " | ".join(_cell(variant, c) for c in cols) + " |")
    return lines


def _failures(table: Any) -> list[str]:
    lines = []
    for entry in table.ops.values():
        for variant in entry["variants"]:
            for key, cell in variant["dtypes"].items():
                if cell["status"] in ("finalize_error", "session_error", "crash", "wrong_result", "run_error", "error"):
                    reason = (cell.get("reason") or "").replace("|", "\\|")[:160]
                    lines.append(f"| {_label(entry, variant)} | {key} | {cell['status']} | {reason} |")
    if not lines:
        return ["None."]
    return ["| op | dtype | outcome | detail |", "|---|---|---|---|", *lines]


def _patterns(table: Any) -> list[str]:
    lines = []
    for pid, p in table.patterns.items():
        ops = f" (ops: {', '.join(p['ops'])})" if p.get("ops") else ""
        fix = f" Fix: {p['fix']}." if p.get("fix") else ""
        lines.append(
            f"- **{pid}** -> {p['status']} / {p['kind']}{ops}: {p['reason']}{fix}  \n  Evidence: {p['evidence']}"
        )
        for rule in p.get("rules", ()):
            when = ", ".join(f"{k}={rule[k]}" for k in rule if k not in ("ops", "kind", "reason", "evidence"))
            cases = rule.get("evidence", "").rpartition(": ")[2]
            lines.append(f"  - {'/'.join(rule['ops'])} when {when} -> {rule['kind']}: {rule['reason']} ({cases})")
    return lines


def _guards() -> list[str]:
    """What keeps a wrong result off the NPU, layer by layer (the passes are read from qnnx-export)."""
    sys.path.insert(0, str(ROOT / "packages" / "export" / "src"))
    from qnnx_export._passes import pass_table

    lines = [
        "## Guards against wrong results",
        "",
        "A wrong number is worse than a fallback, so a graph reaches QNN only past these checks, in this order:",
        "",
        "1. **The graph** (qnnx-export's analysis): a tensor with zero elements anywhere (QNN HTP stops the process "
        "on them), a complex value, an in-place update of an input or buffer, a training-mode op or a symbolic "
        "shape keeps the graph in PyTorch, with the reason in the compile report.",
        "2. **The export**: a model written by torch.onnx (the fallback exporter) is run once on ONNX Runtime's "
        "CPU EP with the real inputs and compared with eager PyTorch (1e-3 of each output's scale); a model that "
        "disagrees is never compiled. torch.onnx in torch 2.13 drops `avg_pool*d`'s `divisor_override`, for one (the "
        "direct translator keeps it).",
        "3. **Rewrites** that put a faithful form in place of one QNN computes wrongly or refuses:",
        "",
    ]
    lines += [f"   - `{row['name']}`: {row['doc']}" for row in pass_table()]
    lines += [
        "",
        "4. **The tables** below: an op is vouched for only in the dtypes and conditions measured right on the live "
        "EP. Rules that follow from HTP computing in fp16 (discontinuous ops such as floor, ceil, round, casts to "
        "integers and the order of sort/top-k; comparisons with infinities, which HTP does not have), and "
        "attribute conditions measured by `tools/opcheck/conformance.py` (Resize modes and ratios, AveragePool "
        "padding and ceil_mode) refuse the node with the evidence.",
        "5. **Optionally at run time**: `verify=True` compares each graph's first call with eager PyTorch.",
        "",
        "What remains inherent to fp16 is mostly documented rather than guarded: values beyond +-65504 saturate "
        "(an `exp(20)` or a product of two 400s; qnnx-backend refuses the NPU for a graph whose output on the "
        "example inputs is beyond that range, but checks neither later inputs nor values inside the graph), and "
        "HTP's transcendental functions carry an absolute error of up to about 1e-3 (Sigmoid, measured on the HTP "
        "simulator with onnxruntime-qnn 2.7.0 over 24001 inputs in [-12, 12], given and computed as 3x - 1: at most "
        "9.3e-4, a sigmoid of 2.15 reads 0.897 instead of 0.896; it returns 0 below about -8.95, and a sigmoid of "
        "-8.5 reads 4.9e-4 instead of 2.0e-4). `docs/conformance.md` measures every float32 op of PyTorch's "
        "OpInfo database against eager.",
        "",
    ]
    return lines


# Node-condition keys that name a shape class (rank, runtime or given inputs, axis position) rather than an attribute.
SHAPE_RULE_KEYS = ("runtime_inputs", "given_inputs", "input_rank", "axis_before_last")
# Variant conditions that name a shape class.
SHAPE_WHEN_KEYS = ("rank", "output_rank", "const_inputs", "dynamic_inputs")


def _rule_when(rule: dict[str, Any]) -> str:
    """A node-condition rule's shape condition in words."""
    words = {
        "runtime_inputs": "runtime input {}",
        "given_inputs": "input {} given",
        "input_rank": "input rank {}",
        "axis_before_last": "axis before the last",
    }
    parts = []
    for key in SHAPE_RULE_KEYS:
        if key in rule:
            value = rule[key]
            text = "/".join(map(str, value)) if isinstance(value, list) else ""
            parts.append(words[key].format(text).strip())
    return ", ".join(parts)


def _compact(keys: list[str]) -> list[str]:
    """Class keys written compactly: keys that differ in one ``/``-part only become one key with the alternatives in
    braces (``r4/{const,runtime}/float32``), position by position from the last part."""
    items = [key.split("/") for key in keys]
    for pos in reversed(range(max((len(p) for p in items), default=0))):
        groups: dict[tuple[Any, ...], list[list[str]]] = {}
        for parts in items:
            rest = (len(parts), *parts[:pos], *parts[pos + 1 :]) if len(parts) > pos else ("whole", *parts)
            groups.setdefault(rest, []).append(parts)
        items = []
        for group in groups.values():
            merged = list(group[0])
            if len(group) > 1:
                merged[pos] = "{" + ",".join(dict.fromkeys(p[pos] for p in group)) + "}"
            items.append(merged)
    return ["/".join(p) for p in items]


def _shape_classes(table: Any) -> list[str]:
    """Per op, the shape classes behind its cells, read from the table: the condition classes measured by
    tools/opcheck/conformance.py (``measured_conditions``), the variants whose condition is a rank or constant /
    runtime inputs, and the node conditions on runtime inputs, ranks and axis position."""
    rows: dict[str, tuple[list[str], list[str]]] = {}
    measured = (table.patterns.get("measured_conditions") or {}).get("ops", {})
    for op, classes in measured.items():
        vouched, refused = rows.setdefault(op, ([], []))
        vouched += [f"`{key}`" for key in _compact([k for k, outcome in classes.items() if outcome == "right"])]
        for outcome in ("wrong", "crash", "refused"):
            keys = [f"`{key}`" for key in _compact([k for k, o in classes.items() if o == outcome])]
            if keys:
                refused.append(f"{outcome}: {', '.join(keys)}")
        refused.append("any class not listed: not measured")
    for entry in table.ops.values():
        for variant in entry["variants"]:
            when = variant.get("when") or {}
            if not any(k in when for k in SHAPE_WHEN_KEYS):
                continue
            vouched, refused = rows.setdefault(entry["op_type"], ([], []))
            label = variant.get("description") or _when(when)
            ok = sorted(k for k, c in variant["dtypes"].items() if c["status"] == "supported")
            bad = sorted(k for k, c in variant["dtypes"].items() if c["status"] != "supported")
            if ok:
                vouched.append(f"{label} ({', '.join(ok)})")
            if bad:
                refused.append(f"{label} ({', '.join(bad)})")
    for rule in (table.patterns.get("node_conditions") or {}).get("rules", ()):
        if any(k in rule for k in SHAPE_RULE_KEYS):
            for op in rule["ops"]:
                rows.setdefault(op, ([], []))[1].append(f"{rule['kind']}: {_rule_when(rule)}")
    if not rows:
        return []
    lines = [
        f"Shape classes behind the cells (onnxruntime-qnn {table.onnxruntime_qnn}; the measured classes are the "
        "newest measurement, which every table uses). A class key reads `r<rank>` (input rank), `const` / `runtime` "
        "(an input is a constant or computed at run time), `unit_axis` / `unit_last` (the axis has one element), "
        "`leading<=8` (every dim before the normalized axis is at most 8), then the op's own parts (Resize: mode, "
        "nearest mode, coordinate mode and size change; ArrayFeatureExtractor: the data's dtype, `indices_r<n>` for "
        "indices that are not a vector); `{a,b}` stands for either part. A node is vouched for only in a class measured right; the "
        "checker names the class when it refuses one:",
        "",
        "| op | vouched for (measured right) | refused |",
        "|---|---|---|",
    ]
    for op in sorted(rows):
        vouched, refused = rows[op]
        lines.append(f"| {op} | {'; '.join(vouched) or '-'} | {'; '.join(refused) or '-'} |")
    return lines


def _node_tests() -> list[str]:
    """The summary of the newest record of tools/opcheck/node_tests.py: opcheck's verdicts against the live EP on
    ONNX's own node tests."""
    import json

    files = sorted((ROOT / "tools" / "opcheck" / "data").glob("node-tests-htp-*-soc*.json"))
    if not files:
        return []
    record = json.loads(files[-1].read_text())
    meta, summary, rows = record["provenance"], record["summary"], record["cases"]
    k = summary["classes"]
    lines = [
        "## opcheck against ONNX's node tests",
        "",
        f"Every case of `onnx.backend.test.case.node` (onnx {meta['onnx']}: {summary['cases']} cases, each a small "
        f"model with inputs and expected outputs), checked by qnnx-opcheck {meta['qnnx_opcheck']} and run on QNN HTP "
        f"(onnxruntime-qnn {meta['onnxruntime_qnn']}, soc_model {meta['soc_model']}, CPU fallback disabled) on "
        f"{meta['date']} by `tools/opcheck/node_tests.py`. Outputs match when shapes agree, integers and bools are "
        f"equal and floats are within {meta['tolerance']} with NaN and inf at the same positions. A case whose graph "
        "carries a type no table holds (double, string, sequences, 2-, 4- and 8-bit types) and that opcheck refuses "
        "is not run and counts as agreement.",
        "",
        "| measured | agreement | supported but wrong or crash | supported but refused | refuses what QNN runs "
        "right | fp16 inputs | non-finite inputs | skipped |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {summary['measured']} | {summary['agreement']:.2f}% | "
        f"{k['supported_but_wrong'] + k['supported_but_crash']} | {k['supported_but_refused']} | "
        f"{k['unsupported_but_right']} | {k['fp16_inherent']} | {k['nonfinite_input']} | {k['skipped']} |",
        "",
        "Live outcomes: " + ", ".join(f"{n} {o}" for o, n in summary["outcomes"].items()) + ".",
        "",
        "*fp16 inputs*: wrong, and equal to the reference computed on the inputs rounded to fp16 (softmax of "
        "10000..10003, which are one number in fp16). *Non-finite inputs*: a feed holds inf or NaN, which HTP reads "
        "as large finite numbers, and the outputs match wherever the expected one is finite. Both are what HTP does "
        "with any op on such runtime data, which a static check cannot see: documented, not guarded.",
        "",
    ]
    odd = [r for r in rows if r["class"] in ("fp16_inherent", "nonfinite_input", "supported_but_wrong")]
    odd += [r for r in rows if r["class"] == "supported_but_crash"]
    if odd:
        lines += ["| case | class | detail |", "|---|---|---|"]
        lines += [f"| {r['case']} | {r['class']} | {(r.get('why') or r.get('rc') or '')} |" for r in odd]
        lines.append("")
    return lines


def render() -> str:
    sys.path.insert(0, str(ROOT / "packages" / "opcheck" / "src"))
    from qnnx_opcheck import available_tables

    tables = available_tables()
    out = [
        "# QNN operator support (generated)",
        "",
        "<!-- Generated by tools/opcheck/gen_operators_doc.py from packages/opcheck/src/qnnx_opcheck/tables/*.json."
        " Do not edit by hand. -->",
        "",
        "These tables drive `qnnx-opcheck` and `qnnx_opcheck.check_model`. HTP tables are probed on the live QNN EP",
        "(`tools/opcheck/probe.py`: one child process per op/dtype case, CPU fallback disabled, explicit `soc_model`);",
        "releases that were not probed get a table *derived* from the nearest probed one and the release notes;",
        "GPU tables are *documented* (the GPU backend cannot initialize without an Adreno GPU).",
        "",
        "Symbols: `Y` supported, `·` rejected by the QNN EP (falls back to CPU), `E` accepted then fails at graph",
        "finalize, `L` session creation fails even with CPU fallback, `CRASH` the process dies, `WRONG` runs with a",
        "wrong result, `?` not documented / unverified (reported as a hazard), empty: not valid ONNX or not probed.",
        "`qdq_uint8`/`qdq_uint16`: the op between DequantizeLinear and QuantizeLinear with that activation type.",
        "QDQ cases are measured, not assumed: each float probe model is quantized by onnxruntime's QNN quantization",
        "tooling (`get_qnn_qdq_config` + `quantize`, calibrated on the probe inputs; uint8 weights by default, so",
        "`qdq_uint16` is a16w8) and run on the simulator, and ops with weights are probed again with int8, uint16,",
        "int16 and int4 weights, per tensor and per channel. `com.microsoft` QuantizeLinear/DequantizeLinear (what the tooling",
        "writes for 16-bit types below opset 21) are probed as ops of their own. The checker refuses the Q/DQ nodes",
        "of a refused QDQ op with it: the QNN EP takes DequantizeLinear -> op -> QuantizeLinear as one unit.",
        "`†`: a QDQ cell derived from the newest QDQ probe for a release whose own QDQ form was not probed with the",
        "tooling.",
        "A row with a condition applies to the nodes that match it; the plain row covers the rest.",
        "",
        *_guards(),
        *_node_tests(),
        "## Tables",
        "",
        "| backend | onnxruntime-qnn | QAIRT | soc_model | source | ops | provenance |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in tables:
        qairt = t.qairt or ""
        out.append(
            f"| {t.backend} | {t.onnxruntime_qnn} | {qairt} | {t.soc_model or '-'} | {t.source} | {len(t.ops)} | "
            f"{t.provenance.get('summary', '').replace('|', '/')} |"
        )

    def order(t: Any) -> tuple[int, int, tuple[int, ...]]:
        # HTP before GPU; a backend's newest full table first, then the older ones.
        return (0 if t.backend == "htp" else 1, 0 if t.source == "probed" else 1, tuple(-x for x in t.version_tuple))

    newest_gpu = max((t for t in tables if t.backend == "gpu"), key=lambda t: t.version_tuple, default=None)
    newest_probed = max(
        (t for t in tables if t.backend == "htp" and t.source == "probed"), key=lambda t: t.version_tuple, default=None
    )
    for t in sorted(tables, key=order):
        title = f"{t.backend.upper()} - onnxruntime-qnn {t.onnxruntime_qnn}" + (
            f", soc_model {t.soc_model}" if t.soc_model else ""
        )
        out += ["", f"## {title} ({t.source})", ""]
        if t.backend == "gpu" and t is not newest_gpu and newest_gpu is not None:
            gone = sorted(set(newest_gpu.ops) - set(t.ops))
            from tables import ADDED_IN

            noted = {op for ops in ADDED_IN.values() for op in ops}
            later = [k.lstrip(":") for k in gone if k.lstrip(":") in noted]
            unprobed = [k.lstrip(":") for k in gone if k.lstrip(":") not in noted]
            line = f"As GPU {newest_gpu.onnxruntime_qnn} without: {', '.join(later) or 'nothing'} (added later per the "
            line += "release notes)"
            if unprobed:
                line += f"; nor {', '.join(unprobed)}, which the HTP probe of that release did not cover"
            out.append(line + ".")
            continue
        if t.source == "derived":
            out.append(f"{t.provenance.get('summary', '')}")
            differ = [
                f"| {_label(e, v)} | {k} | {c['status']} | {c['evidence']} |"
                for e in t.ops.values()
                for v in e["variants"]
                for k, c in v["dtypes"].items()
                if " gave " in c.get("evidence", "")
            ]
            if differ:
                out += [
                    "",
                    "Cells where the probes around it differ:",
                    "",
                    "| op | dtype | outcome | why |",
                    "|---|---|---|---|",
                ]
                out += differ
            out += ["", "Multi-node hazards and caveats:", "", *_patterns(t)]
            continue
        out += _grid(t)
        weights = _qdq_weights(t)
        if weights:
            out += ["", *weights]
        out += ["", "Failures beyond a plain rejection (these do not fall back to the CPU):", "", *_failures(t)]
        out += ["", "Multi-node hazards and caveats:", "", *_patterns(t)]
        if t.backend == "htp" and t is newest_probed:
            out += ["", *_shape_classes(t)]
        if t.notes:
            out += ["", *(f"- {n}" for n in t.notes)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/operators.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(
                f"{DOC.relative_to(ROOT)} is out of date: run python tools/opcheck/gen_operators_doc.py",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
