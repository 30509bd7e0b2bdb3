"""Build qnnx_opcheck's packaged operator tables from raw probe results and documented facts.

Inputs:
  tools/opcheck/data/htp-<version>-soc<N>.raw.json   written by tools/opcheck/probe.py (the live HTP EP)
  the curated facts below (release notes, documented GPU support, lab evidence for multi-node hazards)

Outputs (packages/opcheck/src/qnnx_opcheck/tables/):
  htp-<version>-soc<N>.json   "probed" for every raw file; "derived" for releases 2.4-2.6 that were not
                              probed here (the nearest probed table minus the ops the release notes say
                              arrived later)
  gpu-<version>.json          "documented": the GPU backend cannot initialize without an Adreno GPU

Then run tools/opcheck/gen_operators_doc.py to refresh docs/operators.md.

    python tools/opcheck/tables.py
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import cases  # noqa: E402

OUT = ROOT / "packages" / "opcheck" / "src" / "qnnx_opcheck" / "tables"
DATA = HERE / "data"
SCHEMA = 1
# Probe results with a larger error (max abs error / max |reference|) than this are numerically wrong,
# not fp16 rounding: HTP float math is fp16 (~1e-3 relative).
WRONG_RESULT_ERR = 0.05
# Ops whose dtype key is not input 0.
TYPE_FROM = {"Where": "input:1", "QuantizeLinear": "output:0", "ConstantOfShape": "output:0"}
# Human-readable meaning of each variant condition (shown in reasons and docs/operators.md).
DESCRIPTIONS = {
    "Softmax_axis1": "axis not last",
    "Gelu_tanh": "approximate='tanh'",
    "Slice_step2": "steps != 1",
    "Gather_dynidx": "runtime indices",
    "Gather_i32idx": "int32 indices",
    "Pad_reflect": "mode='reflect'",
    "Pad_edge": "mode='edge'",
    "Resize_nearest": "mode='nearest'",
    "Resize_cubic": "mode='cubic'",
    "Resize_linear": "mode='linear'",
    "Unsqueeze_rank0": "scalar input",
    "Unsqueeze_rank1": "1-D input",
    "Unsqueeze_out5d": "5-D output",
    "MatMul_constW": "constant B",
    "Conv1d": "1-D conv",
    "Conv3d": "3-D conv",
    "GroupNormalization_18": "opset 18-20 form",
    "MaxPool3d": "3-D pooling",
    **{f"Cast_to_{t}": f"to {t}" for t in ("float32", "float16", "int32", "int64", "bool", "uint8")},
    "GroupNormalization_dynscale": "runtime scale",
}
# Release notes of onnxruntime-qnn: ops first supported in a release.
ADDED_IN = {
    "2.5.0": ["Shape", "ReduceLogSumExp", "QLinearMatMul", "NonMaxSuppression", "If"],
    "2.6.0": ["Attention", "Bernoulli", "Range", "CastLike"],
    "2.7.0": ["ArrayFeatureExtractor", "MaxRoiPool", "QLinearConv", "Swish"],
}
QAIRT = {"2.4.0": "2.48.40", "2.5.0": "2.49.40", "2.6.0": "2.50.40", "2.7.0": "2.51.0"}


def _first_opset(op: str, domain: str) -> int:
    """The first opset that defines ``op`` (the lower end of an entry's opset range)."""
    import onnx.defs

    versions = [
        s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op and s.domain == domain
    ]
    return min(versions, default=1)


def _cell(raw: dict[str, Any], evidence: str) -> dict[str, Any] | None:
    status = raw["status"]
    if status in ("probe_error",):
        return None
    cell: dict[str, Any] = {"evidence": evidence}
    if status == "Y":
        err = raw.get("err")
        if err is not None and err > WRONG_RESULT_ERR:
            cell["status"] = "wrong_result"
            cell["reason"] = f"max error {err:.3g} relative to the output's max, against the ORT CPU EP"
        else:
            cell["status"] = "supported"
    elif status == "timeout":
        cell["status"] = "error"
        cell["reason"] = "the probe timed out"
    else:
        cell["status"] = status
        detail = raw.get("reason") or raw.get("error") or (f"signal {-raw['rc']}" if "rc" in raw else "")
        if status == "session_error" and raw.get("with_fallback") == "ok":
            # Not a layout-transformer failure after all: with fallback allowed the session builds.
            cell["status"] = "rejected"
        if detail:
            # The probe's node is called "probe"; keep the EP's words, not our node name.
            detail = re.sub(r"\s*\w+ node `probe` will not be assigned to QNN EP\.", "", str(detail))
            cell["reason"] = detail.strip()[:240]
    return cell


def build_probed(raw: dict[str, Any]) -> dict[str, Any]:
    meta = raw["meta"]
    results = raw["results"]
    ver, soc = meta["onnxruntime_qnn"], meta["soc_model"]
    tag = f"probe htp {ver} soc{soc} {meta['date']}"
    ops: dict[str, dict[str, Any]] = {}
    for v in cases.VARIANTS:
        if v.name not in results:
            continue
        is_extra = "_x" in v.name  # extra shapes probed for evidence only
        key = f"{v.domain}::{v.op}"
        entry = ops.setdefault(
            key,
            {
                "domain": v.domain,
                "op_type": v.op,
                "opset": [_first_opset(v.op, v.domain), None],
                "type_from": TYPE_FROM.get(v.op, "input:0"),
                "evidence": f"{tag}: tools/opcheck/probe.py, one child process per case, CPU fallback disabled",
                "variants": [],
                "also_probed": [],
            },
        )
        cells = _variant_cells(results[v.name], tag, v.name)
        if is_extra:
            entry["also_probed"].append({"name": v.name, "dtypes": {k: c["status"] for k, c in cells.items()}})
            continue
        variant = {"name": v.name, "when": v.when, "probed_opset": v.opset, "dtypes": cells}
        if v.name in DESCRIPTIONS:
            variant["description"] = DESCRIPTIONS[v.name]
        entry["variants"].append(variant)
    patterns = _htp_patterns(results, tag)
    for entry in ops.values():
        # Specific variants first: the checker takes the first variant whose condition matches.
        entry["variants"].sort(key=lambda x: 0 if x["when"] else 1)
        if not entry["also_probed"]:
            del entry["also_probed"]
        _max_rank(entry)
        if "rank_limit" in patterns:
            entry.setdefault("max_rank", patterns["rank_limit"]["max_rank"])
    return {
        "schema": SCHEMA,
        "backend": "htp",
        "onnxruntime_qnn": ver,
        "qairt": meta.get("qairt"),
        "soc_model": soc,
        "source": "probed",
        "provenance": {
            "summary": f"Probed on the live QNN EP: {meta['platform']}, onnxruntime-qnn {ver} (QAIRT {meta.get('qairt')}), "
            f"onnxruntime {meta['onnxruntime']}, soc_model {soc}, {meta['date']}; {meta['cases']} cases in {meta['seconds']} s.",
            "tool": "tools/opcheck/probe.py + tools/opcheck/tables.py",
            **{k: meta[k] for k in ("onnxruntime", "onnx", "platform", "date", "seconds", "cases")},
            **({"qdq_tooling": meta["qdq_tooling"]} if "qdq_tooling" in meta else {}),
        },
        "notes": [
            "HTP computes float32 graphs in float16 (expect ~1e-3 relative error; large values saturate at 65504).",
        ],
        "patterns": patterns,
        "ops": dict(sorted(ops.items())),
    }


def _variant_cells(results: dict[str, Any], tag: str, name: str) -> dict[str, Any]:
    """One variant's cells. A QDQ case records the weights the quantization tooling wrote: the plain
    ``qdq_<activation>`` cell keeps them as ``weights``, and other weights go to ``qdq_<activation>/w=<weights>``
    (the key the checker computes from a node). Requests that wrote the same weights agree or the failing
    outcome is kept."""
    cells: dict[str, Any] = {}
    for dtype, r in sorted(results.items(), key=lambda kv: ("/" in kv[0], kv[0])):
        c = _cell(r, f"{tag}, case {name}/{dtype}")
        if c is None:
            continue
        if not dtype.startswith("qdq_"):
            cells[dtype] = c
            continue
        act = dtype.split("/")[0]
        weights = r.get("weights")
        if weights is not None:
            c["weights"] = weights
        base = cells.get(act)
        key = act if base is None or base.get("weights") == weights else f"{act}/w={weights}"
        old = cells.get(key)
        if old is None or (old["status"] == "supported" and c["status"] != "supported"):
            cells[key] = c
    return cells


def derive_qdq(table: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """``table`` (a release probed before QDQ cases were quantized by onnxruntime's tooling) with the QDQ cells
    and the com.microsoft Q/DQ entries of ``measured``, each marked as derived. Where the release's own probe of
    the older, hand-written QDQ form failed, that failure is kept: a fallback is cheaper than a wrong verdict."""
    t = copy.deepcopy(table)
    src = f"onnxruntime-qnn {measured['onnxruntime_qnn']}"
    note = f"derived for {t['onnxruntime_qnn']} from the {src} QDQ probe (not probed in this release)"
    for key, entry in measured["ops"].items():
        mine = t["ops"].get(key)
        if mine is None:
            if key.startswith("com.microsoft::") and entry["op_type"] in ("QuantizeLinear", "DequantizeLinear"):
                mine = t["ops"][key] = copy.deepcopy(entry)
                mine["evidence"] = f"{note}: {entry['evidence']}"
                for variant in mine["variants"]:
                    for cell in variant["dtypes"].values():
                        cell["evidence"] = f"{note}: {cell['evidence']}"
            continue
        by_name = {v["name"]: v for v in mine["variants"]}
        for variant in entry["variants"]:
            target = by_name.get(variant["name"])
            if target is None:
                continue
            old = {k: c for k, c in target["dtypes"].items() if k.startswith("qdq_")}
            for k in old:
                del target["dtypes"][k]
            for k, cell in variant["dtypes"].items():
                if not k.startswith("qdq_"):
                    continue
                new = copy.deepcopy(cell)
                new["evidence"] = f"{note}: {cell['evidence']}"
                own = old.get(k)
                if own is not None and own["status"] != "supported" and new["status"] == "supported":
                    new = dict(
                        own,
                        evidence=f"{note}, except that this release's own probe of a hand-written QDQ form gave "
                        f"{own['status']}, which is kept ({own['evidence']})",
                    )
                target["dtypes"][k] = new
    t["provenance"]["qdq"] = f"QDQ cells {note}"
    t["notes"] = [*t.get("notes", []), f"QDQ verdicts are {note}."]
    return t


def _max_rank(entry: dict[str, Any]) -> None:
    for v in entry["variants"]:
        if v["name"].endswith("_rank6"):
            ok = [c["status"] == "supported" for c in v["dtypes"].values()]
            entry["rank_probe"] = "rank 6 accepted" if ok and all(ok) else "rank 6 not accepted"
            if ok and not any(ok):
                entry["max_rank"] = 5


def _pstatus(results: dict[str, Any], name: str) -> dict[str, Any]:
    return results.get(f"pattern:{name}", {}).get("float32", {"status": "not probed"})


def _describe(r: dict[str, Any]) -> str:
    s = r["status"]
    if s == "Y":
        return f"ran on QNN, max error {r.get('err', 0):.2g} relative to the output's max"
    return s + (f" ({(r.get('reason') or r.get('error') or '')[:120]})" if r.get("reason") or r.get("error") else "")


def _htp_patterns(results: dict[str, Any], tag: str) -> dict[str, Any]:
    p: dict[str, Any] = {}
    cf = _pstatus(results, "const_fold_int64")
    p["constant_folded"] = {
        "status": "supported",
        "kind": "constant_folded",
        "reason": "every input is a constant: onnxruntime folds this node before partitioning, QNN never sees it",
        "evidence": f"{tag}, pattern const_fold_int64 (Unsqueeze/Squeeze/ConstantOfShape/Range/Cast on int64 "
        f"constants): {_describe(cf)}",
    }
    dr = _pstatus(results, "dropout_mid")
    p["dropout_removed"] = {
        "status": "supported",
        "kind": "removed",
        "reason": "inference Dropout without a used mask: onnxruntime removes it before partitioning",
        "evidence": f"{tag}, pattern dropout_mid (Relu -> Dropout -> Sigmoid): {_describe(dr)}",
    }
    g1, g2 = _pstatus(results, "gelu_erf_div"), _pstatus(results, "gelu_erf_mul")
    if g1["status"] == "Y" or g2["status"] == "Y":
        p["erf_gelu_fusion"] = {
            "status": "supported",
            "kind": "fused",
            "reason": "Erf inside the GELU pattern x*0.5*(1+erf(x/sqrt(2))): the QNN EP fuses it into one Gelu",
            "evidence": f"{tag}, pattern gelu_erf_div: {_describe(g1)}; gelu_erf_mul: {_describe(g2)}",
        }
    dyn = _pstatus(results, "dynamic_dim")
    if dyn["status"] != "Y":
        p["dynamic_shape"] = {
            "status": "unsupported",
            "kind": "rejected",
            "reason": "QNN needs static shapes; this node has a symbolic dimension",
            "evidence": f"{tag}, pattern dynamic_dim (Relu on x['batch', 8]): {_describe(dyn)}; ORT#22066",
        }
    ops, ev = [], []
    for op in ("Add", "Mul"):
        r = _pstatus(results, f"{op.lower()}_const1_layernorm")
        ev.append(f"{op}: {_describe(r)}")
        if r["status"] != "Y" or (r.get("err") or 0) > WRONG_RESULT_ERR:
            ops.append(op)
    if ops:
        p["add_const_broadcast_layernorm"] = {
            "status": "unsupported",
            "kind": "wrong_result",
            "ops": ops,
            "reason": "QNN HTP computes Add/Mul(x[N>1,...], constant[1,...]) feeding LayerNormalization wrongly for "
            "batch rows >= 1 (silent wrong output).",
            "fix": "tile the [1,...] constant to the batch size before building the session",
            "evidence": f"{tag}, patterns add_const1_layernorm / mul_const1_layernorm (x[4,16,64] + const[1,16,64] -> "
            f"LayerNormalization): {'; '.join(ev)}; first seen in BERT embeddings at batch 2, "
            "also seen in onnxruntime-qnn 2.4.0 and 2.6.0",
        }
    orders = []
    for name, order in (("rmsnorm_mul_weight", "const_first"), ("rmsnorm_mul_weight_rev", "const_second")):
        r = _pstatus(results, name)
        if r["status"] not in ("Y", "not probed"):
            orders.append(order)
    if orders:
        r1, r2 = _pstatus(results, "rmsnorm_mul_weight"), _pstatus(results, "rmsnorm_mul_weight_rev")
        p["rmsnorm_mul_weight"] = {
            "status": "unsupported",
            "kind": r1["status"] if r1["status"] not in ("Y", "not probed") else r2["status"],
            "ops": ["Mul"],
            "orders": orders,
            "reason": "RMSNorm written as Mul(weight, x * 1/sqrt(mean(x^2) + eps)) fails at QNN graph finalize "
            "(QNN_COMMON_ERROR_MEM_ALLOC), even with CPU fallback allowed.",
            "fix": "export RMSNormalization (opset 23) or SimplifiedLayerNormalization, or keep this block on the CPU",
            "evidence": f"{tag}, pattern rmsnorm_mul_weight (weight first): {_describe(r1)}; weight second: {_describe(r2)}",
        }
    qc = _pstatus(results, "qdq_conv_int32_bias")
    if qc["status"] == "Y":
        p["qdq_constant_dequantize"] = {
            "status": "supported",
            "kind": "fused",
            "reason": "DequantizeLinear of a constant (quantized weight or int32 bias) is folded into its consumer's "
            "QDQ node unit",
            "evidence": f"{tag}, pattern qdq_conv_int32_bias (float -> Q -> DQ -> Conv(DQ uint8 weight, DQ int32 bias) "
            f"-> Q -> DQ, as ORT's quantizer writes it): {_describe(qc)}",
        }
    rank6 = {k: v for k, v in results.items() if k.endswith("_rank6")}
    if rank6 and all(r["status"] == "rejected" for v in rank6.values() for r in v.values()):
        names = ", ".join(sorted(k[: -len("_rank6")] for k in rank6))
        p["rank_limit"] = {
            "status": "unsupported",
            "kind": "rejected",
            "max_rank": 5,
            "reason": "QNN HTP takes tensors of rank <= 5; this node has a rank-6+ input or output",
            "evidence": f"{tag}, rank-6 cases of {names}: all rejected (float32 and float16), while the same ops "
            "at rank <= 5 are taken",
        }
    # fp16 semantics and attribute-dependent defects. These were measured against ORT's CPU EP with
    # onnxruntime-qnn 2.7.0 (soc 60) on 2026-12-01 (tools/conformance and single-op models); the fp16 rules follow
    # from HTP computing every float op in fp16, so they hold for every release.
    p["fp16_discontinuous"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Floor", "Ceil", "Round", "Mod", "TopK", "Cast"],
        "reason": "HTP computes float ops in fp16: rounding the input to fp16 moves values across an integer or makes "
        "near-equal values equal, so this discontinuous op (floor/ceil/round/mod, a cast to an integer, a sort or "
        "top-k order) returns a result that differs by a whole step, not by fp16 noise. ArgMax/ArgMin stay on the "
        "NPU: they pick the largest of values computed at fp16 precision, and a different pick only happens between "
        "values within fp16 noise of each other. So does a TopK of a value another QNN node computes: that value is "
        "rounded to fp16 wherever TopK runs, and HTP's TopK of fp16 values returns the CPU EP's values (equal values "
        "may come back in another order).",
        "fix": "keep the op on the CPU (partition='mixed') or compute it on integers",
        "evidence": "probe htp 2.7.0 soc60 2026-12-01: torch.ceil / trunc / frac on 400 values in [-9, 9] ran on QNN "
        "and were off by 1.0 (0.11 of the output's max) where fp16 rounding crossed an integer; sort/argsort of "
        "8000 values returned other indices for values equal in fp16; TopK of fp16-exact inputs and of Softmax/Mul "
        "outputs computed on QNN (26 cases, [32, 8] to [128, 64] and [8, 1000], k 2-5, largest 0/1, axis 1 and -1): "
        "the CPU EP's values, indices different only between equal values; probe htp 2.7.0 soc60 2026-12-03: Cast float32 "
        "-> bool of 70000, inf, -inf, NaN, 1e-8 and 1e-10 gave False (CPU EP: True), -> uint8 of -1 gave 0 and of "
        "70000 255 (CPU EP 255, 112); Cast float32 -> int32 of a graph input truncated exactly (2.9999 -> 2, "
        "100000.7 -> 100000) alone, but rounded (2.9999 -> 3, -3.7 -> -4) when a Cast to int64 followed it",
    }
    p["fp16_imprecise"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Tan"],
        "reason": "QNN HTP's Tan is off by about 1.6e-2 of the output's scale away from its poles, and without bound "
        "near them once the input is rounded to fp16.",
        "evidence": "probe htp 2.7.0 soc60 2026-12-01: Tan on 20 values in [-9, 9] (no pole): max error 1.6e-2 "
        "relative to the output's max; torch.tan on 400 values in [-9, 9]: 0.78",
    }
    p["pow_fractional_exponent"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Pow"],
        "reason": "QNN HTP's Pow returns a number where ONNX and PyTorch return NaN (a negative base with a "
        "fractional exponent): Pow is vouched for with a constant whole-number exponent, or a base that cannot "
        "be negative (a positive constant, |x|, x*x, exp, a sum of squares...).",
        "evidence": "probe htp 2.7.0 soc60 2026-12-01: Pow(x in [-9, 9], 0.5) gave 0 NaN where the CPU EP gave 10; "
        "Pow with a runtime exponent: 0 NaN where the CPU EP gave 9; Pow(x, 2) and Pow(x, 3): max error 4.5e-4; "
        "Pow(|x|, 0.5): 3.5e-4, Pow(|x|, 1.7): 9.0e-4, Pow(2, x): 9.5e-4",
    }
    measured = _measured_conditions()
    if measured is not None:
        p["measured_conditions"] = measured
    p["averagepool_defects"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["AveragePool"],
        "reason": "QNN HTP averages wrongly when ceil_mode adds a last window hanging over the end of an axis, with "
        "count_include_pad and padding (or at rank 5), and with a pad of half the kernel or more.",
        "fix": "pool without ceil_mode, or with count_include_pad=False",
        "evidence": "conformance htp 2.7.0 soc60 2026-12-01 (tools/opcheck/conformance.py, 96 AveragePool cases over "
        "rank 3-5, kernel 2-3, stride 1-2, pads 0-1, ceil_mode, count_include_pad): each of these conditions gave "
        "errors of 0.87-1.2 of the output's max or a wrong shape; the other cases were within 1.3e-3. avg_pool3d "
        "of x[2, 3, 3, 4, 4] with count_include_pad and no padding: 0.45",
    }
    p["pad_unwritten_ends"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Pad"],
        "reason": "a constant float Pad that pads the end of the last axis: QNN HTP hands the ops it feeds 0, or "
        "memory it never wrote, in place of the padding, and as the graph's output leaves part of a pad of that "
        "end and another axis's end unwritten (both silent); likewise most float16 Pads of rank 5.",
        "fix": "join blocks of the pad value on with Concat (qnnx-export's float_pad_ends_as_concat pass), or pad "
        "the start of the last axis",
        "evidence": "probe htp 2.7.0 soc60 2026-12-07, against the CPU EP: x[4, 6] padded (0, 3) with 2.5 then "
        "Relu read 0 where 2.5 was due, then a MatMul was 518 off (526 with a pad value of 0); 8 of 16 ops fed by "
        "it wrong at ranks 2-3 (Equal, Less, Not, Relu, Div, Exp, Softmax, MatMul); as the output, 192 of 466 "
        "patterns padding that end and another end wrong at ranks 2-5 (x[1, 3] padded (0, 2, 0, 1) read 0 where "
        "1.5 was due); float16 at rank 5: 264 of 286 patterns wrong; begin pads and pads of other axes right (1,097 "
        "patterns as the output, and into each of the 16 ops); the same pads as Concat right in every case; uint8 QDQ "
        "(DequantizeLinear, Pad, QuantizeLinear): x[4, 6] padded (0, 3) into a quantized MatMul 16.1 off (scale 8.6), "
        "into a Relu right",
    }
    p["erf_gelu_wrong_constants"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Erf"],
        "reason": "Erf inside x * a * (b + erf(x / c)) with constants other than GELU's (a = 0.5, b = 1, c = sqrt(2)): "
        "the QNN EP fuses the shape into one Gelu whatever the constants, so it computes GELU instead (silent); "
        "on its own Erf is not taken by the QNN EP.",
        "fix": "keep the Erf on the CPU EP (pin it), or write the function without Erf",
        "evidence": "probe htp 2.7.0 soc60 2026-12-07, against numpy: x[4, 8] in [-3, 3], Div or Mul form, either "
        "grouping of the products, scalar or [1] constants: a = 0.4 gave 0.25 of the output's max off, b = 2 0.33, "
        "c = 2 0.04, a = 0.4 with b = 2 and c = 2 0.35-0.37; GELU's own constants 5e-4",
    }
    p["softmax_negative_scale_fusion"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Softmax"],
        "reason": "Softmax of Mul(x, c) with c a negative float32 constant of rank 0, the Mul read by the Softmax "
        "alone: the QNN EP folds c into the HTP Softmax's beta, and HTP computes that Softmax wrongly for a "
        "negative beta (silent).",
        "fix": "give the factor the shape [1] (qnnx-export's softmax_scale_as_vector pass), or negate x with Neg "
        "and scale by -c",
        "evidence": "probe htp 2.7.0 soc60 2026-12-07, against the CPU EP: Softmax(Mul(x, c)) over the last axis "
        "with c = -0.125, -0.5, -1 and -2 of rank 0 (initializer or Constant, either operand) on x of rank 1-5 "
        "(x[3, 4], x[1, 2, 4, 4], x[8], x[1, 2, 2, 3, 4]): 0.4-1.4 of the output's max off; c > 0, c of shape [1], "
        "a float16 graph, Div by c, a Mul with another reader or that is a graph output, Neg then Softmax, and Mul "
        "then LogSoftmax: right",
    }
    p["softmax_scale_fusion_axis"] = {
        "status": "unsupported",
        "kind": "finalize_error",
        "ops": ["Softmax"],
        "reason": "Softmax over an axis other than the last of Mul(x, c) with c a float32 constant of rank 0, the "
        "Mul read by the Softmax alone: the QNN EP folds c into the HTP Softmax, which then fails QNN's graph "
        "finalize (the whole graph lost).",
        "fix": "give the factor the shape [1] (qnnx-export's softmax_scale_as_vector pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-07: Softmax(Mul(x, c), axis=0) of x[2, 3], x[3, 4], x[1, 8] and "
        "x[2, 2, 5] and axis=1 of x[2, 3, 4], c = -2 to 3 of rank 0: every session failed to finalize; with c of "
        "shape [1] they built and were right",
    }
    p["maxpool_ceil_dropped_window"] = {
        "status": "unsupported",
        "kind": "rejected",
        "ops": ["MaxPool"],
        "reason": "with ceil_mode, a last window that would start past the end of the input is dropped (the output "
        "is one shorter than the ceil formula gives): the QNN EP claims the node and its layout transformation then "
        "fails at session creation.",
        "fix": "pool without ceil_mode, or pad the input so that the last window starts inside it",
        "evidence": "node tests htp 2.7.0 soc60 2026-12-02 (tools/opcheck/node_tests.py): "
        "test_maxpool_2d_ceil_output_size_reduce_by_one (x[1, 1, 2, 2], kernel 1, stride 2) failed at session "
        "creation (the node was claimed by the QNN EP and not selected); test_maxpool_2d_ceil (its last window "
        "starts inside the input) is right",
    }
    p["einsum_equation"] = {
        "status": "unsupported",
        "kind": "rejected",
        "ops": ["Einsum"],
        "reason": "the QNN EP translates an Einsum only when its equation is already a MatMul (plain, with the "
        "right operand transposed, or two 4-D forms); it declines any other equation when the session is built.",
        "fix": "write the contraction as Transpose + Reshape + MatMul (qnnx-export's einsum_as_matmul pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-03: ij,jk->ik, bij,bjk->bik, bhqd,bhkd->bhqk, id,jd->ij, "
        "bij,bkj->bik, bchq,bkhc->bkhq and bhwc,hkc->bhwk ran within 4.7e-4 of the CPU EP; bind,bjnd->bnij (XLNet, "
        "Funnel), ij,jk->k and i,j->ij were declined at session creation",
    }
    p["merged_heads_matmul"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["MatMul"],
        "reason": "QNN HTP computes MatMul(Reshape(x[A, A, A, D] -> [A, A, A*D]), W) wrongly for a rank-2 W (attention's "
        "output projection after merging as many heads as the two leading dims).",
        "fix": "multiply on the rank-2 view [A*A, A*D] and reshape back (qnnx-export's flatten_merged_heads_matmul "
        "pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-03: [4, 4, 4, 6], [3, 3, 3, 5], [2, 2, 2, 4], [5, 5, 5, 3], "
        "[8, 8, 8, 2], [4, 4, 4, 1], [6, 6, 6, 4] merged into [A, A, A*D] (and [1, A, A, A*D]) then MatMul: off by "
        "0.93-9082 of the output's max, no error; Relu or Add in place of the MatMul, an Add between, [4, 4, 5, 6], "
        "[4, 5, 4, 6], [4, 4, 6, 4], [2, 4, 4, 6], a batched W, and the rank-2 view: right (5e-4)",
    }
    p["einsum_diagonal"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Einsum"],
        "reason": "an Einsum with a letter repeated within one term (a diagonal, ii,ij->ij) is taken by the QNN EP "
        "as a MatMul and computed as one: silently wrong.",
        "fix": "take the diagonal first (torch.diagonal) and write the product without repeated letters",
        "evidence": "probe htp 2.7.0 soc60 2026-12-03: ii,ij->ij off by 4.8, ij,jj->ij by 1.0 and bii,bij->bij by "
        "2.5 of the output's max, each built and run without an error; ik,kj->ij right (5.1e-4)",
    }
    p["nonfinite_constant"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": [
            "Equal",
            "Less",
            "LessOrEqual",
            "Greater",
            "GreaterOrEqual",
            "Max",
            "Min",
            "Clip",
            "Where",
            "Add",
            "Mul",
            "Sub",
            "Div",
            "Concat",
            "Expand",
            "Identity",
        ],
        "reason": "HTP has no infinities: an inf or NaN constant saturates near +-65504, so a comparison with it is "
        "never true and an output that should hold inf holds a finite number.",
        "evidence": "probe htp 2.7.0 soc60 2026-12-01: Equal(x, -inf) was false for x = -inf; Where(x < 0, -inf, x) "
        "returned -65536 and -131008 where the CPU EP returned -inf; ReduceMax of a row of -inf returned -65504; "
        "aten._safe_softmax (which tests for -inf) gave 1/3 where PyTorch gives 0",
    }
    p["empty_tensor"] = {
        "status": "unsupported",
        "kind": "crash",
        "reason": "a tensor of this node has no elements: QNN HTP stops the process (SIGFPE) on zero-element tensors",
        "evidence": "measured 2026-12-01 with onnxruntime-qnn 2.7.0: (x * y).sum(-1) on two empty vectors, and mm, "
        "linear, var, repeat, glu or reflect padding with an empty input, killed the process",
    }
    p["runtime_indices"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["GatherElements", "ScatterElements"],
        "reason": "QNN HTP reads negative element indices wrongly; indices computed at run time may be negative.",
        "evidence": "conformance htp 2.7.0 soc60 2026-12-01 (tools/opcheck/conformance.py): GatherElements and "
        "ScatterElements with runtime indices in [-4, -1]: off by 1.0 and 1.04 of the output's max; the same "
        "indices as constants, and non-negative runtime indices: right (2.2e-4)",
    }
    p["gather_runtime_inner_axis"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Gather"],
        "reason": "QNN HTP's Gather by runtime indices is wrong along an inner axis when a dim before it is larger "
        "than 1, and along the last axis by indices of rank 2 or more.",
        "fix": "gather along axis 0 of a transposed [N, A*B] view (qnnx-export's gather_runtime_indices_as_rows "
        "pass), or use constant indices",
        "evidence": "probe htp 2.7.0 soc60 2026-12-02 (70 random Gathers, ranks 2-4, index ranks 0-2, runtime "
        "indices): [2, 16, 64] along axis 1 by 4 indices, [3, 3, 5] along axis 1, [2, 5, 8, 3] along axis 2 by a "
        "scalar, [3, 1, 1] along axis 1 gave errors of 1.0 of the output's max; along axis 0, along the last axis "
        "by 0-D/1-D indices, and every Gather by constant indices: right (3e-4)",
    }
    p["gathernd_runtime_slices"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["GatherND"],
        "reason": "QNN HTP's GatherND by runtime indices is wrong when the indices hold more than 8 tuples along "
        "their second-to-last axis and each selects a slice of rank 2 or more (output row k is the slice of tuple "
        "k % 8), and when the indices have rank 4 and a first axis longer than 8; indices of rank 5 stop the "
        "process.",
        "fix": "index along axis 0 with a Gather for indices whose last dim is 1, or flatten indices of rank 4 or "
        "more to [N, k] and reshape the output back (qnnx-export's gathernd_to_gather pass), or use constant "
        "indices",
        "evidence": "probe htp 2.7.0 soc60 2026-12-02 (float data, runtime int64 indices): [4, 16, 32] by [9, 1] to "
        "[64, 1], [2, 16, 1] and [9, 9, 1], [4, 5, 6] by [9, 1], [4, 3, 5, 6] by [16, 2] gave errors of 1.0 of the "
        "output's max (a tiny Mixtral's expert weights picked by w[ids]); by [8, 1], [4, 8, 1], [16, 4, 1], with "
        "rank-1 slices ([4, 16] by [32, 1], [4, 6, 5] by [32, 2]) or scalar ones, and every GatherND by constant "
        "indices: right; probe htp 2.7.0 soc60 2026-12-07: [5, 5, 5] by [9, 2, 2, 3], [16, 2, 2, 3], [10, 10, 10, 3] "
        "and [10, 10, 5, 3], [8, 8] by [9, 2, 2, 2]: 0.8-4.6 off; by [8, 2, 2, 3], [2, 9, 2, 3], [9, 2, 3], [1000, 3] "
        "and the same tuples flattened to [N, k]: right; [5, 5, 5] by [2, 2, 2, 2, 3]: SIGSEGV",
    }
    p["gather_scaled_by_constant"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Mul"],
        "reason": "QNN HTP computes Mul(Gather(table, indices), c) wrongly when the table is a constant, the indices "
        "are int32 values computed at run time and c is a one-element constant (a scaled embedding).",
        "fix": "fold the factor into the table (qnnx-export's fold_gather_scale pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-02: a [128, 64] table by int32 ids [2, 16] times 8.0 gave a right "
        "first batch row and errors of 0.85-1.0 of the output's max after it (tables 8x8 to 1000x16, ids [2, 2] to "
        "[16, 2]); a Reshape between Gather and Mul does not help; int64 ids, a runtime table, a vector factor, "
        "Add/Sub/Div: right",
    }
    p["flat_projection_into_heads"] = {
        "status": "unsupported",
        "kind": "finalize_error",
        "ops": ["Gemm", "MatMul"],
        "reason": "QNN HTP fails to finalize a projection of x[A, A, K] computed flat (Reshape to [A*A, K], then "
        "Gemm or MatMul) whose result is reshaped into [A, A, A, D] (as many heads as each leading dim, D > 1): "
        "QNN_COMMON_ERROR_MEM_ALLOC, the whole graph lost.",
        "fix": "compute the projection at the input's rank, MatMul(x, W) + b (qnnx-export's linear_heads_as_matmul "
        "pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-03: Reshape -> Gemm (bias or not, or a MatMul) -> Reshape from "
        "[2, 2, 16] to [2, 2, 2, 8], [3, 3, 24] to [3, 3, 3, 8], [4, 4, K] to [4, 4, 4, K/4] (K = 16, 24, 32, 128), "
        "[8, 8, 64] to [8, 8, 8, 8]: finalize_error (QNN_COMMON_ERROR_MEM_ALLOC), also through an unflattening "
        "Reshape to [4, 4, K] first, as a tiny MobileViT exports its attention; [4, 4, 8, 4], [4, 4, 3, 8], "
        "[2, 4, 4, 6], [4, 8, 4, 6], [8, 4, 4, 6], [1, 4, 4, 6], [4, 4, 4, 1] and a flat input [16, K]: built; "
        "MatMul(x, W) + b at rank 3: built for every one",
    }
    p["projection_regrouped_rank5"] = {
        "status": "unsupported",
        "kind": "crash",
        "ops": ["Reshape"],
        "reason": "QNN HTP stops the process (SIGSEGV) when it runs a Reshape to rank 5 [..., N, k] (k > 1) of a "
        "MatMul's or Gemm's [..., N] product (a bias added between or not): the session builds, the first run "
        "kills the process.",
        "fix": "keep the product's last axis last (e.g. [..., k, N]), or run the Reshape on the CPU EP",
        "evidence": "probe htp 2.7.0 soc60 2026-12-03: MatMul products [4, 4, 2] -> [2, 2, 2, 2, 2], "
        "[1, 4, 2, 2, 2], [16, 4, 2] -> [4, 4, 2, 2, 2]; [8, 8, 2] -> [16, 1, 2, 2, 2], [4, 8, 1, 2, 2], "
        "[2, 4, 4, 2, 2], [2, 8, 2, 2, 2]; [4, 4, N] -> [2, 2, 2, N, 2] for N = 1, 3, 4, 8, 16; "
        "[4, 4, 4] -> [2, 2, 1, 4, 4]; a Gemm, and MatMul + Add: SIGSEGV at the first run (with the Reshape on the "
        "CPU EP: runs); [1, 16, 2, 2, 2], [1, 1, 8, 2, 2], [1, 2, 2, 4, 4], [1, 1, 2, 3, 2], [..., 4, 2] of N = 2, "
        "[..., 2, 2] of N = 4, [..., N, 1], rank 4 [16, 2, 2, 2], and Add or Relu in place of the MatMul: run and "
        "are right",
    }
    p["conv_defects"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Conv"],
        "reason": "QNN HTP computes a Conv wrongly with one output channel and a stride of 3 or more (one channel "
        "in and out: outputs about 1.5e4 times too large), and with padding on an axis whose one output window "
        "leaves part of the input out.",
        "fix": "give the Conv a second output channel of zeros and slice it off, or pad so that the window covers "
        "the input",
        "evidence": "probe htp 2.7.0 soc60 2026-12-02 (two sweeps of 260 and 400 random Convs, 1-D and 2-D, 1-8 "
        "channels in, 1-16 out, kernels 1-3, strides 1-5, pads 0-1): every wrong case (34) fell in these two "
        "classes, none of the 502 others; the classes also hold Convs QNN computes right (75 of 400), refused to "
        "stay on the safe side. A 3x3 Conv with pad 1 on a 1x1 or a 2x2 input (stride 2) is right",
    }
    p["runtime_parameters"] = {
        "status": "unsupported",
        "kind": "rejected",
        "ops": ["Slice", "Tile", "Expand"],
        "inputs": {"Slice": [1, 2, 3, 4], "Tile": [1], "Expand": [1]},
        "reason": "QNN HTP takes this op only when its shape-like inputs (starts/ends/axes/steps, repeats, shape) "
        "are constants; with runtime values the EP refuses the node.",
        "evidence": "conformance htp 2.7.0 soc60 2026-12-01 (tools/opcheck/conformance.py): Slice, Tile and Expand "
        "with runtime parameters refused at session creation; with constants right (3.7e-4)",
    }
    p["convtranspose_dilation"] = {
        "status": "unsupported",
        "kind": "rejected",
        "ops": ["ConvTranspose"],
        "reason": "QNN HTP refuses ConvTranspose with a dilation above 1.",
        "fix": "dilate the kernel instead (zeros between its taps) and convolve at dilation 1 (qnnx-export's "
        "convtranspose_dilated_kernel pass)",
        "evidence": "conformance htp 2.7.0 soc60 2026-12-01 (tools/opcheck/conformance.py): dilations [2, 2] refused "
        "at session creation",
    }
    p["convtranspose3d_pads_differ"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["ConvTranspose"],
        "reason": "QNN HTP computes a 3-D ConvTranspose wrongly when its first two spatial axes are padded "
        "differently (errors of 1.2-1.7 times the output's scale).",
        "fix": "convolve without pads and crop the output with a Slice (qnnx-export's convtranspose_normal_form pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-06: ConvTranspose of x[2, 2, 3, 4, 4] and [2, 2, 2, 3, 4], kernel "
        "3x3x3, strides 1 and 2: pads (begin, end per axis) [1,0,0,1,0,0], [0,1,0,0,1,0], [0,1,1,0,1,1], "
        "[1,0,1,1,0,1] and [1,0,0,0,0,0] wrong (1.15-1.67 of the scale); [1,1,1,1,1,1], [1,1,1,0,0,0], "
        "[0,0,0,1,1,1], [0,0,1,0,0,1], [1,1,0,1,1,0] and no pads right (1e-3); 1-D and 2-D with pads differing "
        "between axes right",
    }
    p["convtranspose_output_padding"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["ConvTranspose"],
        "reason": "QNN HTP computes ConvTranspose with output_padding wrongly in classes without a simple pattern, "
        "equal strides included (errors of 0.09-0.32 times the output's scale).",
        "fix": "convolve without output_padding, then pad the output's end with zeros and add the bias "
        "(qnnx-export's convtranspose_normal_form pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-06: 2-D ConvTranspose of x[2, 2, 4, 4]: kernel 3, 6 and 9 at stride "
        "3, pads 1, output_padding 2: 0.09-0.32 of the scale off (kernels 4, 5, 7 and 13 right); kernel 4 at stride 2 "
        "without pads, output_padding 1: 0.16 off, kernel 6 there failed; the same without output_padding right (5e-4)",
    }
    p["convtranspose3d_groups"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["ConvTranspose"],
        "reason": "QNN HTP computes a grouped 3-D ConvTranspose (group > 1) wrongly (errors of 0.8-1.1 times the "
        "output's scale).",
        "fix": "one ConvTranspose per group on its slices of the input and the weight, joined on the channel axis "
        "(qnnx-export's convtranspose_normal_form pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-06: ConvTranspose of x[2, 4, 4, 4, 4] (and [2, 6, ...] for 3 "
        "groups), kernels 1, 2 and 3, strides 1 and 2, pads 0 and 1: groups 2 and 3 wrong (0.81-1.08 of the "
        "scale); the same with one group, and 1-D and 2-D with groups 2, right (5e-4)",
    }
    p["convtranspose3d_strides_differ"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["ConvTranspose"],
        "reason": "QNN HTP computes a 3-D ConvTranspose wrongly when its last two spatial axes have different "
        "strides (errors of 0.9-1.5 times the output's scale).",
        "fix": "put zeros between the input's rows on those axes and convolve at stride 1 there (qnnx-export's "
        "convtranspose_normal_form pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-06: ConvTranspose of x[2, 2, 3, 3, 3], kernels 3x3x3 and 2x2x2, "
        "no pads: strides [1,2,1], [1,1,2], [2,2,1], [2,1,2] and [3,3,1] wrong (0.95-1.49 of the scale) or failed; "
        "[2,1,1], [1,2,2] and [2,2,2] right (1e-3); 2-D with strides [1,2], [2,1] and [3,1] right",
    }
    p["node_conditions"] = _node_conditions()
    p["partial_weight_block"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["DequantizeLinear"],
        "reason": "block-wise quantized weights whose blocked dim is not a multiple of block_size (a short last "
        "block): QNN HTP computes them wrongly without an error",
        "evidence": "probe htp 2.7.0 soc60 2026-12-03 (tools/probe_block_int4.py, form ort_qdq): a MatMul with "
        "symmetric int4 weights of K = 200 under uint16 activations, blocks of 16 and 32: SQNR -9.7 dB on QNN "
        "against 22 dB on the CPU EP; blocks of 64 and 128 were refused; K = 256 (blocks dividing it): 20-22 dB, "
        "as the CPU EP",
    }
    p["int64_reshape_rank5"] = {
        "status": "unsupported",
        "kind": "crash",
        "ops": ["Reshape"],
        "reason": "a Reshape of int64 data to a 5-D output stops the process inside the QNN EP (SIGSEGV while the "
        "session is created, with or without CPU fallback)",
        "evidence": "measured 2026-12-03 with onnxruntime-qnn 2.7.0 soc60: Reshape of int64 [1, 4] to [1, 4, 1, 1, 1] "
        "and [1, 4, 3, 2] to [1, 4, 3, 2, 1] (also after ArgMax, as adaptive_max_pool3d's indices): SIGSEGV; the same "
        "Reshapes of int32 or float32 data, and int64 ones to 3-D or 4-D outputs: right",
    }
    p["int64_cast_rank5"] = {
        "status": "unsupported",
        "kind": "crash",
        "ops": ["Cast"],
        "reason": "a Cast to int64 with a 5-D output stops the process inside the QNN EP (SIGSEGV while the session "
        "is created)",
        "evidence": "measured 2026-12-06 with onnxruntime-qnn 2.7.0 soc60, each in a child process: Cast int32 -> "
        "int64 of [2, 3, 1, 5, 2] and [1, 1, 1, 1, 4]: SIGSEGV; the same Cast of [2, 3, 5, 2]: right; Casts from "
        "int64 at rank 5 fail to finalize (an error, not a crash)",
    }
    p["matmul_rank5_first_axis_broadcast"] = {
        "status": "unsupported",
        "kind": "crash",
        "ops": ["MatMul"],
        "reason": "a MatMul of two rank-5 inputs whose first axes differ (one of them 1, broadcast) stops the process "
        "inside QNN HTP (SIGSEGV at the first run)",
        "fix": "expand the operand whose first axis is 1 to the other's (Expand) before the MatMul, or run it on the "
        "CPU EP",
        "evidence": "measured 2026-12-06 with onnxruntime-qnn 2.7.0 soc60, each in a child process: MatMul [1, 3, 2, 4, "
        "3] x [3, 3, 2, 3, 4], [3, 3, 2, 4, 3] x [1, 3, 2, 3, 4], [1, 1, 2, 4, 3] x [2, 3, 2, 3, 4] and [3, 3, 1, 4, "
        "3] x [1, 3, 2, 3, 4]: SIGSEGV; broadcasting on the second or third axis, a rank-5 by rank-4 MatMul, and "
        "rank 3 and 4 broadcasts (first axis included) run and are right",
    }
    p["where_rank5_broadcast"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Where"],
        "reason": "QNN HTP computes a rank-5 Where wrongly when one of its inputs is rank 5 and broadcasts (a shape "
        "other than the output's): errors of 0.4-1.8 times the output's scale",
        "fix": "drop the input's leading 1s (Reshape) or expand it to the output's shape (qnnx-export's "
        "rank5_broadcast_expanded pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-06: Where with output [2, 3, 4, 2, 3], condition and values drawn "
        "as the output's shape, a rank-5 broadcast, a lower-rank broadcast or a scalar: 45 of 120 classes wrong, every "
        "one with a rank-5 broadcasting input (x.masked_fill(mask[1, 3, 1, 2, 3], v): 1.07 off); none without one",
    }
    p["pow_rank5_broadcast"] = {
        "status": "unsupported",
        "kind": "crash",
        "ops": ["Pow"],
        "reason": "a rank-5 Pow with a rank-5 input that broadcasts (a shape other than the output's) stops the process "
        "inside QNN HTP (SIGSEGV at the first run)",
        "fix": "expand the input to the output's shape (qnnx-export's rank5_broadcast_expanded pass)",
        "evidence": "measured 2026-12-06 with onnxruntime-qnn 2.7.0 soc60, each in a child process: Pow of x[2, 3, 4, "
        "2, 3] by exponents [1, 3, 1, 1, 3], [1, 1, 1, 2, 1], [1, 2, 4, 1, 1] and [1, 1, 1, 1, 1]: SIGSEGV; by [1], a "
        "rank-4 broadcast and the output's shape: ran",
    }
    p["gather_rank5_output"] = {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": ["Gather"],
        "reason": "QNN HTP computes a Gather by indices of rank >= 2 into a rank-5 output wrongly (errors of 0.7-3.7 "
        "times the output's scale)",
        "fix": "gather by the flattened indices and reshape the result (qnnx-export's "
        "gather_of_vector_by_flat_indices pass)",
        "evidence": "probe htp 2.7.0 soc60 2026-12-06: Gather of x[3, 4, 2, 3] along axis 1 by [[0, 3]], x[5, 1, 3, 3] "
        "by [[0, 0, 0]], x[4, 6] by [[[[0, 1]]]], x[2, 3, 4] by [[[0, 1]]], x[5, 1, 1] by [[[0], [0]]] (constant "
        "indices, negative ones too): 0.66-3.7 of the scale off; the same by the flattened indices, and rank-5 data "
        "by rank-1 indices, right (1e-3)",
    }
    p["gather_transposed_vector"] = {
        "status": "unsupported",
        "kind": "crash",
        "ops": ["Reshape"],
        "reason": "a Transpose flattened to rank 1 by a Reshape and read by a Gather with indices of rank >= 2 stops "
        "the process while the QNN session is created (a bounds assertion in ONNX Runtime, SIGABRT)",
        "fix": "gather by the flattened indices and reshape the result to the indices' shape (qnnx-export's "
        "gather_of_vector_by_flat_indices pass does this)",
        "evidence": "measured 2026-12-06 with onnxruntime 1.32 and onnxruntime-qnn 2.7.0 soc60, each in a child "
        "process: Transpose [8, 1, 2, 16] -> Reshape [256] -> Gather by [2, 3, 4, 16] or [4, 16] indices -> "
        "Transpose (also with Neg or Relu before the last Transpose, with graph optimizations off, and with Gather "
        "or Transpose pinned to the CPU EP): SIGABRT; pinning the Reshape, no first or no last Transpose, rank-2 or "
        "rank-3 data, or 1-D indices followed by a Reshape: built",
    }
    p["int64_saturation"] = {
        "status": "hazard",
        "kind": "caveat",
        "ops": ["*"],
        "reason": "HTP has no int64: the QNN EP carries int64 data as int32, so values beyond +-2147483647 saturate",
        "evidence": "measured: Add of two 2.0e9 int64 tensors returned 2147483647 (onnxruntime-qnn 2.7.0); ORT#24351",
    }
    return p


_REDUCE_WITH_AXES_INPUT = [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare",
]  # fmt: skip
_ZERO = [None, [0], [0, 0], [0, 0, 0]]
# Conditions under which the QNN EP declines a node (its REASON line), computes it wrongly or stops the process,
# measured on ONNX's node tests (tools/opcheck/node_tests.py, whose record names the cases). A rule holds when all
# its conditions hold; the keys are read by qnnx_opcheck._patterns (runtime_inputs, given_inputs, attr_in,
# attr_not_in, min_outputs, max_inputs, input_dtype, unbounded_input, uneven_attr, input_rank, axis_before_last,
# unless_index_wrap, power_of_two_divisor, signed_dividend, unless_remainder_step).
NODE_CONDITIONS: list[dict[str, Any]] = [
    {"ops": _REDUCE_WITH_AXES_INPUT, "runtime_inputs": [1], "kind": "rejected",
     "reason": "the QNN EP takes the axes input only as a constant", "cases": "test_reduce_*_random"},
    {"ops": ["Clip"], "runtime_inputs": [1, 2], "kind": "rejected",
     "reason": "the QNN EP takes min and max only as constants", "cases": "test_clip*"},
    {"ops": ["Split"], "runtime_inputs": [1], "kind": "rejected",
     "reason": "the QNN EP takes the split sizes only as a constant", "cases": "test_split_variable_parts_*"},
    {"ops": ["TopK"], "runtime_inputs": [1], "kind": "rejected",
     "reason": "the QNN EP takes k only as a constant", "cases": "test_top_k_same_values*"},
    {"ops": ["OneHot"], "runtime_inputs": [1], "kind": "rejected",
     "reason": "the QNN EP takes depth only as a constant", "cases": "test_onehot_*"},
    {"ops": ["CumSum"], "runtime_inputs": [1], "kind": "rejected",
     "reason": "the QNN EP takes the axis only as a constant", "cases": "test_cumsum_*_int32"},
    {"ops": ["Pad"], "runtime_inputs": [1, 2], "kind": "rejected",
     "reason": "the QNN EP takes pads and the constant value only as constants", "cases": "test_constant_pad"},
    {"ops": ["Pad"], "given_inputs": [3], "kind": "rejected",
     "reason": "the QNN EP declines Pad with an axes input", "cases": "test_attention_*_expanded"},
    {"ops": ["Pad"], "attr_in": {"mode": ["wrap"]}, "kind": "rejected",
     "reason": "the QNN EP declines Pad with mode='wrap' (circular padding)",
     "evidence": "probe htp 2.7.0 soc60 2026-12-07: Pad(mode='wrap') of x[1, 3, 4, 4] by 1 on each side of the last "
     "two axes: the session refused with CPU fallback disabled (the node assigned to the CPU EP); mode 'reflect' on "
     "the same input ran right (2.3e-4)", "cases": "test_wrap_pad"},
    {"ops": ["BatchNormalization"], "runtime_inputs": [1, 2, 3, 4], "kind": "rejected",
     "reason": "the QNN EP takes scale, bias, mean and variance only as constants", "cases": "test_batchnorm_*"},
    {"ops": ["DequantizeLinear", "QuantizeLinear"], "runtime_inputs": [1, 2], "kind": "rejected",
     "reason": "the QNN EP takes the scale and zero point only as constants", "cases": "test_dequantizelinear*"},
    {"ops": ["LayerNormalization"], "min_outputs": 2, "kind": "rejected",
     "reason": "the QNN EP takes LayerNormalization with one output only (no mean or inverse std dev output)",
     "cases": "test_layer_normalization_*"},
    {"ops": ["ArgMax", "ArgMin"], "attr_in": {"select_last_index": [1]}, "kind": "rejected",
     "reason": "the QNN EP takes select_last_index=0 only", "cases": "test_arg*_select_last_index"},
    {"ops": ["Attention"], "given_inputs": [6], "kind": "rejected",
     "reason": "the QNN EP declines the nonpad_kv_seqlen input", "cases": "test_attention_4d_causal_nonpad_*"},
    {"ops": ["Attention"], "input_dtype": [3, ["bool"]], "kind": "rejected",
     "reason": "the QNN EP declines a boolean attn_mask", "cases": "test_attention_4d_attn_mask_bool*"},
    {"ops": ["Attention"], "attr_not_in": {"softmax_precision": [None, 0]}, "kind": "rejected",
     "reason": "the QNN EP declines softmax_precision", "cases": "test_attention_24_*_softmax_precision"},
    {"ops": ["Attention"], "attr_not_in": {"left_window_size": [None, -1], "right_window_size": [None, -1]},
     "kind": "wrong_result", "reason": "QNN HTP ignores the local attention window (errors of 0.13-0.54 of the "
     "output's scale)", "cases": "test_attention_local_window, test_attention_bidirectional_window"},
    {"ops": ["Attention"], "attr_in": {"is_causal": [1], "qk_matmul_output_mode": [1, 2, 3]},
     "kind": "wrong_result", "reason": "QNN HTP's qk_matmul output of a causal Attention is wrong (inf positions "
     "differ)", "cases": "test_attention_4d_with_past_and_present_qk_matmul_bias_*_mask_causal"},
    {"ops": ["LpPool"], "attr_not_in": {"p": [1, 2]}, "kind": "rejected",
     "reason": "the QNN EP takes p=1 or p=2 only", "cases": "test_lppool_*_default"},
    {"ops": ["LpPool", "MaxPool"], "attr_not_in": {"dilations": [None, [1], [1, 1], [1, 1, 1]]},
     "kind": "rejected", "reason": "the QNN EP takes dilations of 1 only", "cases": "test_lppool_2d_dilations"},
    {"ops": ["LpPool"], "input_rank": [5], "kind": "rejected",
     "reason": "the QNN EP declines 3-D LpPool on HTP", "cases": "test_lppool_3d_default"},
    {"ops": ["LpPool"], "attr_not_in": {"auto_pad": ["NOTSET", "VALID"]}, "kind": "crash",
     "reason": "LpPool with auto_pad SAME_UPPER stopped the process", "cases": "test_lppool_2d_same_upper"},
    {"ops": ["MaxPool"], "min_outputs": 2, "kind": "rejected",
     "reason": "the QNN EP takes MaxPool with one output only (no indices)", "cases": "test_maxpool_with_argmax_*"},
    {"ops": ["LpNormalization"], "attr_not_in": {"p": [2]}, "kind": "rejected",
     "reason": "the QNN EP takes p=2 only", "cases": "test_l1normalization_*"},
    {"ops": ["Gemm"], "attr_not_in": {"alpha": [1.0], "beta": [1.0, 0.0]}, "kind": "rejected",
     "reason": "the QNN EP takes alpha=1 and beta 0 or 1 only", "cases": "test_gemm_alpha, test_gemm_beta"},
    {"ops": ["Max", "Min", "Sum", "Mean"], "max_inputs": 1, "kind": "rejected",
     "reason": "the QNN EP takes two inputs or more", "cases": "test_max_one_input"},
    {"ops": ["Mod"], "attr_in": {"fmod": [1]}, "kind": "rejected",
     "reason": "the QNN EP takes fmod=0 only", "cases": "test_mod_int64_fmod"},
    {"ops": ["GridSample"], "attr_in": {"mode": ["cubic", "bicubic"]}, "kind": "rejected",
     "reason": "the QNN EP declines mode cubic", "cases": "test_gridsample_bicubic*"},
    {"ops": ["GridSample"], "input_rank": [5], "kind": "rejected",
     "reason": "the QNN EP declines volumetric (5-D) GridSample", "cases": "test_gridsample_volumetric_*"},
    {"ops": ["GridSample"], "attr_in": {"mode": ["nearest"]}, "kind": "wrong_result",
     "reason": "HTP rounds the grid to fp16, so a sample point on or near a pixel boundary picks the neighbour "
     "pixel (off by a whole pixel value)", "cases": "test_gridsample_nearest*"},
    {"ops": ["ScatterND"], "attr_in": {"reduction": ["max", "min"]}, "kind": "rejected",
     "reason": "the QNN EP declines reduction max and min", "cases": "test_scatternd_max, test_scatternd_min"},
    {"ops": ["ScatterElements"], "attr_in": {"reduction": ["add", "mul", "max", "min"]}, "kind": "rejected",
     "reason": "the QNN EP declines ScatterElements with a reduction (it takes reduction='none' only)",
     "evidence": "probe htp 2.7.0 soc60 2026-12-03: ScatterElements(reduction add, mul, max, min) on x[7], x[4, 6], "
     "x[3, 1, 5] and x[2, 3, 4, 5] along every axis, indices Max(i, 0) at run time: every session refused with CPU "
     "fallback disabled (the nodes assigned to the CPU EP); reduction='none' on the same classes ran right (<= 3.5e-4)"},
    {"ops": ["GRU", "LSTM"], "attr_in": {"layout": [1]}, "kind": "rejected",
     "reason": "the QNN EP takes layout=0 only", "cases": "test_gru_batchwise, test_lstm_batchwise"},
    {"ops": ["ConvTranspose"], "uneven_attr": "strides", "attr_not_in": {"output_padding": _ZERO},
     "kind": "wrong_result", "reason": "QNN HTP computes output_padding wrongly when the strides differ between "
     "axes (errors of 3 times the output's scale)", "cases": "test_convtranspose_pad, test_convtranspose_kernel_shape"},
    {"ops": ["ConvTranspose"], "uneven_attr": "strides", "attr_not_in": {"output_shape": [None]},
     "kind": "wrong_result", "reason": "QNN HTP computes output_shape wrongly when the strides differ between axes",
     "cases": "test_convtranspose_output_shape"},
    {"ops": ["IsNaN"], "input_dtype": [0, ["float32"]], "unbounded_input": 0, "kind": "wrong_result",
     "reason": "HTP computes float32 in fp16 and reads an infinite input as NaN, also a value that overflowed fp16 "
     "inside the graph (Exp or Mul of large values), which comes out of QNN clamped to a finite number; the "
     "softmax, sigmoid or tanh of a QNN node is read right", "cases": "test_isnan"},
    {"ops": ["Cast"], "attr_in": {"to": [9, 2]}, "input_dtype": [0, ["int8", "int16", "int32", "int64"]],
     "kind": "wrong_result", "reason": "QNN HTP casts a negative integer to bool as False and to uint8 as 0, and an "
     "integer above 255 to uint8 as 255 (ONNX and PyTorch: any nonzero value is True, uint8 wraps modulo 256); a comparison with zero, "
     "Not(Equal(x, 0)), gives the bool right (qnnx-export's int_cast_to_bool pass writes it)",
     "evidence": "probe htp 2.7.0 soc60 2026-12-03: Cast int32 and int64 -> bool of [0, 1, -1, 2, -2, 255, 256, -256, "
     "70000, -70000, 2^31-1, -2^31]: False for every negative value (CPU EP: True), alone and feeding Not or a Cast "
     "to float; -> uint8: -1, -2, 70000 gave 0, 0, 255 (CPU EP 255, 254, 112); Not(Equal(x, 0)) right on every "
     "value, int32 and int64"},
    {"ops": ["Mod"], "input_dtype": [0, ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"]],
     "unless_index_wrap": 1024, "kind": "wrong_result", "reason": "QNN HTP computes an integer Mod in fp16: a "
     "dividend beyond 2048 in magnitude comes back wrong (int32 70000 mod 256 = 128, 1000003 mod 3 = 64), some below "
     "it too (-2047 mod 7 = 5), and int8 for small values. Vouched for: the wrap of gather indices by the gathered "
     "axis's size d <= 1024 (torch.onnx's take_along_dim), exact for every index in [-d, d), where the indices are "
     "an input or pass through views, casts, gathers or an arg-max only (a hash such as (ids + 1) * 31 % 64 into a "
     "table of 64 rows is not an index wrap: its dividends can be any size). qnnx-export's integer_mod_by_division "
     "pass writes a % b with integer Div, Mul and Sub instead, exact on HTP",
     "evidence": "probe htp 2.7.0 soc60 2026-12-03: Mod (fmod=0) of int32 and int64 dividends [0, +-5, +-100, 1000, "
     "2047, 2049, 4097, +-10001, 40000, 70000, +-1000003] by constant 3, 7, -7 and 256: wrong from 2049 on, and "
     "-2047 mod 7 = 5 (4097 mod 3 = 0, 70000 mod 7 = 0); int16 and uint16 wrong from 2049 on; int8: -5 mod 7 = 127, "
     "100 mod 7 = 100; every i in [-d, d) mod d right for d 3, 7, 100, 1000 (int32 and int64); 2046 mod 2047 wrong"},
    {"ops": ["Div"], "input_dtype": [0, ["int32", "int64"]], "power_of_two_divisor": 1, "signed_dividend": 0,
     "unless_remainder_step": True, "kind": "wrong_result", "reason": "QNN HTP divides an integer by a constant "
     "power of two (2, 4, ..., 16384) rounding down, where ONNX truncates toward zero: a negative dividend the divisor "
     "does not divide comes back one less (-1 / 16384 = -1, -70001 / 2 = -35001; ONNX: 0, -35000). Vouched for: a "
     "dividend >= 0 by construction (qnnx-export divides only such values), and the quotients of qnnx-export's "
     "integer Mod, x - (x / b) * b taken twice, whose result does not depend on the rounding",
     "evidence": "probe htp 2.7.0 soc60 2026-12-07: Div of int32 and int64 dividends in [-70001, 70001] by a scalar "
     "or [1] constant 2, 4, 8, 16, 64, 128, 1024, 16384: every negative dividend it does not divide one less than the "
     "CPU EP's (12-16 of 32 per divisor), every other dividend right; by 1, 3, 6, 12, 100, -1, -2, -4, -3 and -64, by a runtime divisor of 4 and by a "
     "constant [22] vector of 8s or of 3s and 4s: every dividend right; int8 and int16 Div: not taken by the QNN EP"},
    {"ops": ["SpaceToDepth"], "attr_in": {"mode": ["CRD"]}, "kind": "wrong_result",
     "reason": "QNN HTP ignores mode=CRD (it computes DCR)", "cases": "test_spacetodepth_crd_mode_example"},
    {"ops": ["RMSNormalization"], "axis_before_last": True, "kind": "rejected",
     "reason": "the QNN EP takes RMSNormalization over the last axis only", "cases": "test_rms_normalization_2d_axis0, "
     "test_rms_normalization_2d_axis_negative_2"},
    {"ops": ["GatherND"], "attr_not_in": {"batch_dims": [0]}, "kind": "rejected",
     "reason": "the QNN EP declines GatherND with batch_dims > 0", "cases": "test_gathernd_example_int32_batch_dim1"},
    {"ops": ["LSTM"], "runtime_inputs": [4], "kind": "rejected",
     "reason": "the QNN EP declines a runtime sequence_lens input", "cases": "test_lstm_with_peepholes"},
]  # fmt: skip


def _node_conditions() -> dict[str, Any]:
    """The ``node_conditions`` pattern: :data:`NODE_CONDITIONS`, each rule with its evidence."""
    files = sorted(DATA.glob("node-tests-htp-*-soc*.json"))
    meta = json.loads(files[-1].read_text())["provenance"] if files else {}
    source = (
        f"node tests htp {meta['onnxruntime_qnn']} soc{meta['soc_model']} {meta['date']} "
        f"(tools/opcheck/node_tests.py, onnx {meta['onnx']})"
        if meta
        else "node tests (tools/opcheck/node_tests.py)"
    )
    rules = []
    for rule in NODE_CONDITIONS:
        # A rule measured by a probe of its own names its evidence; the others cite node-test cases.
        evidence = rule.get("evidence") or f"{source}: {rule['cases']}"
        rule = {k: v for k, v in rule.items() if k != "cases"} | {"evidence": evidence}
        rules.append(rule)
    return {
        "status": "unsupported",
        "kind": "rejected",
        "ops": sorted({op for r in NODE_CONDITIONS for op in r["ops"]}),
        "rules": rules,
        "reason": "conditions of attributes, optional inputs and outputs under which the QNN EP declines the node, "
        "computes it wrongly or stops the process",
        "evidence": source,
    }


def _measured_conditions() -> dict[str, Any] | None:
    """The condition classes tools/opcheck/conformance.py measured (newest onnxruntime-qnn on record): op ->
    {class -> worst outcome}. The checker vouches for a class only when every case of it was right."""
    files = sorted(
        DATA.glob("conformance-htp-*-soc*.json"),
        key=lambda f: tuple(int(x) for x in f.name.split("-")[2].split(".")),
    )
    if not files:
        return None
    data = json.loads(files[-1].read_text())
    meta = data["provenance"]
    rank = {"right": 0, "refused": 1, "wrong": 2, "crash": 3}
    ops: dict[str, dict[str, str]] = {}
    for case in data["cases"]:
        outcome = case["outcome"]
        if outcome not in rank:
            continue
        op = case["case"].split("/")[0]
        for key in case.get("keys", []):
            cur = ops.setdefault(op, {}).get(key)
            if cur is None or rank[outcome] > rank[cur]:
                ops[op][key] = outcome
    counts = {op: {o: sum(1 for v in c.values() if v == o) for o in rank} for op, c in ops.items()}
    summary = "; ".join(f"{op}: " + ", ".join(f"{n} {o}" for o, n in c.items() if n) for op, c in counts.items())
    return {
        "status": "unsupported",
        "kind": "wrong_result",
        "ops": {op: dict(sorted(c.items())) for op, c in sorted(ops.items())},
        "reason": "the op's behaviour on QNN HTP depends on its attributes and shapes; only condition classes "
        "measured right are vouched for",
        "evidence": f"conformance htp {meta['onnxruntime_qnn']} soc{meta['soc_model']} {meta['date']} "
        f"(tools/opcheck/conformance.py, one child process per case, compared with the CPU EP within "
        f"{meta['tolerance']:g} of the output's max): {summary}",
    }


def _is_function_op(op: str) -> bool:
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op)
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def derive(table: dict[str, Any], version: str) -> dict[str, Any]:
    """A table for a release that was not probed: the probed table minus ops added later."""
    t = copy.deepcopy(table)
    later = [
        op
        for v, lst in ADDED_IN.items()
        if tuple(map(int, v.split("."))) > tuple(map(int, version.split(".")))
        for op in lst
    ]
    added = {op: v for v, lst in ADDED_IN.items() for op in lst}
    for op in later:
        entry = t["ops"].get(f"::{op}")
        if entry is None:
            continue
        if _is_function_op(op):
            # onnxruntime expands an ONNX function op into its body when no EP claims it, so it can run on
            # QNN before the release that added a direct builder: the 2.6.0 probe ran Swish (release
            # notes: 2.7.0) fully on QNN. Keep the probed outcome and say why.
            for variant in entry["variants"]:
                for cell in variant["dtypes"].values():
                    cell["evidence"] += (
                        f"; kept for {version}: ONNX function op, expanded by onnxruntime before {added[op]}"
                    )
            continue
        note = f"release notes: {op} is supported by the QNN EP from onnxruntime-qnn {added[op]}"
        for variant in entry["variants"]:
            for cell in variant["dtypes"].values():
                if cell["status"] == "supported":
                    cell["status"] = "rejected"
                    cell["reason"] = f"not yet supported in {version}"
                    cell["evidence"] = note
    t["onnxruntime_qnn"] = version
    t["qairt"] = QAIRT.get(version)
    t["source"] = "derived"
    t["provenance"] = {
        "summary": f"Not probed: derived from the probed {table['onnxruntime_qnn']} table ({table['provenance']['summary']}) "
        f"by marking unsupported the ops the onnxruntime-qnn release notes list as added after {version} "
        f"({', '.join(op for op in later if not _is_function_op(op)) or 'none'}); ONNX function ops among them "
        f"({', '.join(op for op in later if _is_function_op(op)) or 'none'}) keep the probed outcome because "
        f"onnxruntime expands them. Per-dtype results of {version} itself are not verified.",
        "derived_from": f"htp-{table['onnxruntime_qnn']}-soc{table['soc_model']}.json",
    }
    if version < "2.7.0" and "add_const_broadcast_layernorm" in t["patterns"]:
        # Lab: with Mul in place of Add the bug appears in 2.7.0 and not in 2.4.0.
        pat = t["patterns"]["add_const_broadcast_layernorm"]
        if version == "2.4.0":
            pat["ops"] = [o for o in pat["ops"] if o != "Mul"]
    return t


_FAILING = ("crash", "wrong_result", "session_error", "finalize_error", "error", "run_error", "rejected")


def derive_between(lo: dict[str, Any], hi: dict[str, Any], version: str) -> dict[str, Any]:
    """A table for a release between two probed ones: agreeing cells are kept; where the probes differ,
    the release notes decide, and an unexplained difference takes the failing outcome (a fallback is
    cheaper than a crash or a wrong result)."""
    t = copy.deepcopy(hi)
    v = tuple(map(int, version.split(".")))
    added = {op: tuple(map(int, rel.split("."))) for rel, lst in ADDED_IN.items() for op in lst}
    lo_v, hi_v = lo["onnxruntime_qnn"], hi["onnxruntime_qnn"]
    for key, entry in t["ops"].items():
        lo_entry = lo["ops"].get(key, {"variants": []})
        lo_variants = {x["name"]: x for x in lo_entry["variants"]}
        for variant in entry["variants"]:
            for dtype, cell in variant["dtypes"].items():
                other = lo_variants.get(variant["name"], {"dtypes": {}})["dtypes"].get(dtype)
                if other is None or other["status"] == cell["status"]:
                    cell["evidence"] += f"; {version} not probed: {lo_v} and {hi_v} probes agree"
                    continue
                op = entry["op_type"]
                if op in added and added[op] <= v:
                    pick, why = cell, f"release notes add {op} in {'.'.join(map(str, added[op]))}"
                elif op in added:
                    pick, why = other, f"release notes add {op} only in {'.'.join(map(str, added[op]))}"
                else:
                    failing = [c for c in (cell, other) if c["status"] in _FAILING]
                    pick = min(failing, key=lambda c: _FAILING.index(c["status"])) if failing else cell
                    why = "unexplained difference: the failing outcome is kept"
                new = copy.deepcopy(pick)
                new["evidence"] = (
                    f"{version} not probed: {lo_v} gave {other['status']}, {hi_v} gave {cell['status']}; {why}"
                )
                variant["dtypes"][dtype] = new
    t["onnxruntime_qnn"] = version
    t["qairt"] = QAIRT.get(version)
    t["source"] = "derived"
    t["provenance"] = {
        "summary": f"Not probed: derived cell by cell from the probed {lo_v} and {hi_v} tables. Where they agree the "
        f"outcome is kept; where they differ the release notes decide, else the failing outcome is kept. "
        f"Multi-node hazards are those of {hi_v}.",
        "derived_from": [f"htp-{lo_v}-soc{lo['soc_model']}.json", f"htp-{hi_v}-soc{hi['soc_model']}.json"],
    }
    return t


# Ops the QNN EP has no builder for that run on HTP as the ONNX function body onnxruntime expands them into: the
# GPU backend's take of the body is neither documented nor measured, so the GPU tables leave them out.
EXPANDED_ONLY = frozenset({"NegativeLogLikelihoodLoss", "SwiGLU"})


def build_gpu(htp: dict[str, Any], version: str) -> dict[str, Any]:
    """GPU table from documented support; the op registry is shared with HTP (op_builder_factory.cc)."""
    ops: dict[str, Any] = {}
    doc = (
        "documented: QNN EP GPU backend takes fp32/fp16 activations and weights (the QNN EP "
        "documentation); op in the EP's builder registry (shared by all backends, "
        "op_builder_factory.cc). Not probed: libQnnGpu.so cannot initialize without an Adreno GPU."
    )
    cell_doc = "documented (QNN-EP doc: GPU takes fp32/fp16); not probed, no Adreno GPU here"
    for key, entry in htp["ops"].items():
        reasons = [c.get("reason", "") for v in entry["variants"] for c in v["dtypes"].values()]
        in_registry = not any("are not supported by QNN EP" in r for r in reasons) or any(
            c["status"] == "supported" for v in entry["variants"] for c in v["dtypes"].values()
        )
        if not in_registry or entry["op_type"] in EXPANDED_ONLY:
            continue
        htp_dtypes = {k for v in entry["variants"] for k in v["dtypes"] if not k.startswith("qdq_")}
        cells: dict[str, Any] = {}
        for dt in sorted(htp_dtypes):
            if dt in ("float32", "float16"):
                cells[dt] = {"status": "supported", "evidence": cell_doc}
            else:
                cells[dt] = {
                    "status": "unverified",
                    "reason": f"GPU support for {dt} is not documented and cannot be verified off-device",
                    "evidence": cell_doc,
                }
        if entry["op_type"] in ("QuantizeLinear", "DequantizeLinear"):
            # GPU takes uint8-quantized weights with float activations; quantized activations are not
            # its documented mode.
            cells = {
                dt: {
                    "status": "unverified",
                    "reason": "the GPU backend documents uint8 weights with float activations only",
                    "evidence": cell_doc,
                }
                # int32: the bias of QDQ Conv/Gemm.
                for dt in sorted(htp_dtypes | ({"int32"} if entry["op_type"] == "DequantizeLinear" else set()))
            }
            if entry["op_type"] == "DequantizeLinear":
                cells["uint8"] = {
                    "status": "supported",
                    "evidence": "documented: uint8-quantized weights with float activations (QNN-EP doc)",
                }
        ops[key] = {
            "domain": entry["domain"],
            "op_type": entry["op_type"],
            "opset": entry["opset"],
            "type_from": entry["type_from"],
            "evidence": doc,
            "variants": [{"name": entry["op_type"], "when": {}, "dtypes": cells}],
        }
        if entry["op_type"] == "Einsum":
            ops[key]["notes"] = "some Einsum equations are rejected on GPU (einsum_op_builder.cc, IsGpuBackend branch)"
    for op, since in (("MatMulNBits", "2.0.0"), ("GroupQueryAttention", "2.4.0"), ("GatherBlockQuantized", "2.4.0")):
        if tuple(map(int, since.split("."))) > tuple(map(int, version.split("."))):
            continue
        ev = f"documented: GPU-specific com.microsoft op (the QNN EP documentation; since {since})"
        ops[f"com.microsoft::{op}"] = {
            "domain": "com.microsoft",
            "op_type": op,
            "opset": [1, None],
            "type_from": "input:0",
            "evidence": ev,
            "variants": [
                {
                    "name": op,
                    "when": {},
                    "dtypes": {k: {"status": "supported", "evidence": ev} for k in ("float32", "float16")},
                }
            ],
        }
    later = [
        op
        for v, lst in ADDED_IN.items()
        if tuple(map(int, v.split("."))) > tuple(map(int, version.split(".")))
        for op in lst
    ]
    for key in [k for k, e in ops.items() if e["op_type"] in later and e["domain"] in ("", "ai.onnx.ml")]:
        del ops[key]
    patterns = {
        k: copy.deepcopy(htp["patterns"][k])
        for k in ("constant_folded", "dropout_removed", "dynamic_shape", "erf_gelu_fusion")
        if k in htp["patterns"]
    }
    for pat in patterns.values():
        pat["evidence"] = (
            "documented (onnxruntime graph optimizations / QNN EP node-group fusions; shown on HTP: "
            + pat["evidence"]
            + ")"
        )
    return {
        "schema": SCHEMA,
        "backend": "gpu",
        "onnxruntime_qnn": version,
        "qairt": QAIRT.get(version),
        "soc_model": None,
        "source": "documented",
        "provenance": {
            "summary": f"Documented support, not probed (the QNN GPU backend cannot initialize on x86_64: "
            f"QNN_BACKEND_ERROR_CANNOT_INITIALIZE). Op list = the QNN EP builder registry observed through the "
            f"HTP probe of {htp['onnxruntime_qnn']}, minus ops added after {version}; float32/float16 per the "
            f"QNN-EP doc; other dtypes unverified (reported as hazards).",
        },
        "notes": ["GPU table is documented, not probed: verify on a device with an Adreno GPU."],
        "patterns": patterns,
        "ops": dict(sorted(ops.items())),
    }


def write(table: dict[str, Any]) -> Path:
    name = (
        f"{table['backend']}-{table['onnxruntime_qnn']}"
        + (f"-soc{table['soc_model']}" if table["soc_model"] else "")
        + ".json"
    )
    path = OUT / name
    path.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    n_cells = sum(len(v["dtypes"]) for e in table["ops"].values() for v in e["variants"])
    print(f"wrote {path.relative_to(ROOT)}: {len(table['ops'])} ops, {n_cells} cells, source {table['source']}")
    return path


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    raws = sorted(DATA.glob("htp-*-soc*.raw.json"))
    if not raws:
        print("no raw probe results in tools/opcheck/data; run tools/opcheck/probe.py first", file=sys.stderr)
        return 1
    probed: dict[str, dict[str, Any]] = {}
    for path in raws:
        raw = json.loads(path.read_text())
        table = build_probed(raw)
        if table["soc_model"] == 60:
            probed[table["onnxruntime_qnn"]] = table
        else:
            write(table)
    newest = max(probed, key=lambda v: tuple(map(int, v.split("."))))
    for version, table in list(probed.items()):
        if version != newest and not table["provenance"].get("qdq_tooling"):
            probed[version] = derive_qdq(table, probed[newest])
        write(probed[version])
    for version in ("2.4.0", "2.5.0", "2.6.0", "2.7.0"):
        if version not in probed:
            below = [v for v in probed if v < version]
            above = [v for v in probed if v > version]
            if below and above:
                write(derive_between(probed[max(below)], probed[min(above)], version))
            else:
                # Nearest probed release at or above it (tables only lose ops going back in time).
                base = min(above, default=newest)
                write(derive(probed[base], version))
        base = probed.get(version) or probed[newest]
        write(build_gpu(base, version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
