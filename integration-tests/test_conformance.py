"""Operator conformance on the QNN HTP simulator: OpInfo samples through torch.compile(backend="qnn") against eager.

A curated subset of tools/conformance (ops once silently wrong on QNN, common ops, zero-element tensors) runs in
CI; the first sample of every float32 op is the opt-in slow test (about half an hour). Cases run in the harness's
worker subprocess, so an op that kills the process fails the test as a ``crash`` instead of killing pytest.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "tools" / "conformance" / "harness.py"

# Ops that once returned silently wrong results on QNN (each must now be right, on QNN or by falling back).
ONCE_WRONG = (
    "nn.functional.avg_pool2d#0",
    "nn.functional.avg_pool2d#1",  # ceil_mode / count_include_pad / divisor_override vary across the samples
    "nn.functional.avg_pool2d#2",
    "nn.functional.avg_pool1d#0",
    "nn.functional.avg_pool3d#0",
    "nn.functional.rms_norm#0",
    "nn.functional.rms_norm#1",
    "nn.functional.interpolate.trilinear#0",
    "nn.functional.interpolate.nearest#0",
    "nn.functional.interpolate.nearest-exact#0",
    "nn.functional.logsigmoid#0",
    "tan#0",
    "sort#0",
    "argsort#0",
    "ceil#0",
    "trunc#0",
    "frac#0",
    "floor#0",
    "round#0",
    "sigmoid#0",
    "nn.functional.silu#0",
    "complex#0",
    "polar#0",
    "view_as_complex#0",
    "special.entr#0",
    "__rpow__#0",
    "nn.functional.binary_cross_entropy_with_logits#0",
    "nn.functional.soft_margin_loss#0",
    "scatter_reduce.mean#0",
    "as_strided#0",
    "torch.ops.aten._safe_softmax.default#0",  # not in every torch: skipped when absent
    "nn.functional.adaptive_max_pool3d#4",  # stopped the process: int64 indices reshaped to 5-D inside QNN
)
# Common ops: these must run on QNN, not merely be right (layer_norm's samples 0 and 1 use eps=-0.5 and a
# one-element input: edge cases that may fall back; sample 2 is ordinary).
COMMON = (
    "add#0",
    "matmul#0",
    "nn.functional.relu#0",
    "softmax#0",
    "nn.functional.layer_norm#2",
    "nn.functional.conv2d#0",
)
EDGE = ("nn.functional.layer_norm#0",)
# Zero-element tensors: QNN HTP stops the process on them, so they must never reach it.
ZERO_SIZE = ("zero_size.mul_sum#0", "zero_size.add_rows#0", "zero_size.mean_cols#0")
# Attention over scores of about 200: beyond the fixed bound on QNN, within fp16's own error on the sample.
FP16_SENSITIVE = ("nn.functional.scaled_dot_product_attention#13",)
CI_CASES = ONCE_WRONG + COMMON + EDGE + ZERO_SIZE + FP16_SENSITIVE


def _load_harness() -> Any:
    name = "qnnx_conformance_harness"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def _line(rec: dict[str, Any]) -> str:
    where = ",".join(rec.get("devices") or []) or "-"
    exporters = ",".join(sorted({g["exporter"] for g in rec.get("graphs") or [] if g.get("exporter")})) or "-"
    why = rec.get("detail") or ""
    if rec["status"] == "fallback":
        why = f"[{rec.get('category')}] " + "; ".join(rec.get("reasons") or [])
    return f"{rec['id']}: {rec['status']} on {where} (exporter {exporters}): {why}"


def _failures(records: dict[str, dict[str, Any]]) -> list[str]:
    return [_line(r) for r in records.values() if r["status"] in ("wrong", "crash")]


@pytest.fixture(scope="module")
def ci_records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    harness = _load_harness()
    result = harness.run_cases(tmp_path_factory.mktemp("conformance") / "cases.jsonl", ids=CI_CASES)
    for rec in result.records.values():
        print(_line(rec))
    return result.records


def test_every_ci_case_ran(ci_records):
    missing = [c for c in CI_CASES if c not in ci_records]
    absent = [c for c, r in ci_records.items() if r.get("detail") == "no such case in this torch"]
    assert not missing, f"no record for {missing}"
    assert set(absent) <= {"torch.ops.aten._safe_softmax.default#0"}, f"cases missing from op_db: {absent}"
    invalid = [_line(r) for r in ci_records.values() if r["status"] == "invalid" and r["id"] not in absent]
    assert not invalid, "eager PyTorch rejects a curated sample:\n" + "\n".join(invalid)


def test_no_op_is_silently_wrong_or_crashes(ci_records):
    """Each case matches eager PyTorch (on QNN or by falling back) and the process survives it."""
    failures = _failures(ci_records)
    assert not failures, f"{len(failures)} of {len(ci_records)} cases wrong or crashed:\n" + "\n".join(failures)


def test_common_ops_run_on_qnn(ci_records):
    off = [_line(ci_records[c]) for c in COMMON if ci_records[c]["status"] != "qnn"]
    assert not off, "common ops not on QNN:\n" + "\n".join(off)


def test_graph_records_come_from_the_compile_report(ci_records):
    """Each graph of a common op records the FX ops, the exporter and the ONNX ops its compile report carries; a
    zero-size graph records the analysis problem kind that kept it in PyTorch and no export."""
    for cid in COMMON:
        for g in ci_records[cid]["graphs"]:
            assert g["fx_ops"] and g["problem_kinds"] == [], _line(ci_records[cid])
            assert g["exporter"] in ("fast", "torch.onnx") and g["onnx_ops"], _line(ci_records[cid])
    for g in ci_records["zero_size.mul_sum#0"]["graphs"]:
        assert g["problem_kinds"] == ["empty_tensor"] and g["category"] == "analysis: empty_tensor"
        assert "exporter" not in g and "onnx_ops" not in g


def test_zero_size_tensors_never_reach_qnn(ci_records):
    for cid in ZERO_SIZE:
        rec = ci_records[cid]
        assert rec["status"] == "fallback", _line(rec)
        assert all(g["device"] == "eager" for g in rec["graphs"]), _line(rec)


def test_a_run_with_its_own_out_folder_keeps_its_jsonl_there(tmp_path, monkeypatch):
    """run.py --out DIR writes the JSONL under DIR (a subset run leaves the full run's alone); docs/ keeps build/."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # run.py puts its folder first to import its siblings
    for sibling in ("harness", "report"):
        monkeypatch.delitem(sys.modules, sibling, raising=False)
    spec = importlib.util.spec_from_file_location("qnnx_conformance_run", HARNESS.parent / "run.py")
    assert spec is not None and spec.loader is not None
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    for sibling in ("harness", "report"):  # gone again at the end of the test
        monkeypatch.setitem(sys.modules, sibling, sys.modules[sibling])
    assert run.parse_args(["--out", str(tmp_path)]).jsonl == tmp_path / "cases.jsonl"
    assert run.parse_args([]).jsonl == run.report.DEFAULT_JSONL
    assert run.parse_args(["--out", str(ROOT / "docs")]).jsonl == run.report.DEFAULT_JSONL
    given = tmp_path / "elsewhere.jsonl"
    assert run.parse_args(["--out", str(tmp_path), "--jsonl", str(given)]).jsonl == given


@pytest.mark.slow
def test_first_sample_of_every_op(tmp_path, request):
    """Opt-in (about half an hour on 2 cores): the first sample of every float32 OpInfo op, none wrong or crashing.

    Runs when selected with ``-m`` naming ``slow`` (``nox -s slow``), or with QNNX_CONFORMANCE_FULL=1.
    """
    if "slow" not in (request.config.option.markexpr or "") and os.environ.get("QNNX_CONFORMANCE_FULL") != "1":
        pytest.skip("opt-in: run with -m slow or QNNX_CONFORMANCE_FULL=1 (about half an hour)")
    harness = _load_harness()
    result = harness.run_cases(tmp_path / "cases.jsonl", samples=1)
    failures = _failures(result.records)
    assert not failures, f"{len(failures)} of {len(result.records)} cases wrong or crashed:\n" + "\n".join(failures)


def test_all_samples_selects_every_sample_input_of_an_op():
    """`--samples all` (ALL_SAMPLES) yields one case per sample input of an op, numbered from 0, and a count N the
    first N of them: the full-depth report covers every sample, not a prefix."""
    harness = _load_harness()
    every = [cid for cid, _ in harness.iter_cases(samples=harness.ALL_SAMPLES, pattern=r"^nn\.functional\.relu$")]
    (op,) = harness.float32_ops(r"^nn\.functional\.relu$")
    count = len(harness.op_samples(op, harness.ALL_SAMPLES))
    assert count > 3
    assert every == [f"nn.functional.relu#{k}" for k in range(count)]
    first = [cid for cid, _ in harness.iter_cases(samples=3, pattern=r"^nn\.functional\.relu$")]
    assert first == every[:3]


def test_an_ill_conditioned_sample_is_judged_by_fp16s_own_error(ci_records):
    """Attention whose scores reach about 200 misses the fixed bound on QNN; it passes, marked, because rounding only
    its inputs to fp16 already moves eager's output by a third of QNN's error or more."""
    harness = _load_harness()
    for cid in FP16_SENSITIVE:
        rec = ci_records[cid]
        mark = rec.get("fp16_sensitive")
        assert rec["status"] == "qnn" and mark is not None, _line(rec)
        assert mark["rel_err"] > harness.RTOL and mark["input_rounding_rel_err"] > 0, mark
        assert mark["rel_err"] <= harness.RTOL + harness.ATOL + harness.FP16_FUDGE * mark["input_rounding_rel_err"]


@given(
    size=st.integers(1, 64),
    at=st.integers(0, 63),
    scale=st.floats(1e-2, 1e3),
    margin=st.floats(0.05, 10.0),
    allowance=st.floats(0.0, 10.0),
    within=st.booleans(),
)
def test_the_fp16_allowance_admits_exactly_its_figure(size, at, scale, margin, allowance, within):
    """Property: a float output off by one element passes compare() exactly when its error is within the fixed bound
    plus the allowance given for it; the allowance of another output does not help."""
    harness = _load_harness()
    ref = torch.linspace(-scale, scale, size, dtype=torch.float64).float()
    bound = harness.RTOL * float(ref.abs().max()) + harness.ATOL + allowance
    err = bound / (1 + margin) if within else bound * (1 + margin)
    got = ref.clone()
    got[at % size] += err
    assert (harness.compare(got, ref, allowance=[allowance]) is None) is within
    assert (harness.compare((ref, got), (ref, ref), allowance=[allowance, 0.0]) is None) is (err <= bound - allowance)


def test_fp16_input_rounding_error_is_what_fp16_inputs_move():
    """The figure is zero for inputs fp16 holds exactly and grows with the sample's conditioning."""
    harness = _load_harness()
    exact = harness.Case("x", "exp", 0, torch.exp, (torch.tensor([0.5, 1.0, -2.0]),))
    assert harness.fp16_input_rounding_error(exact, torch.exp(exact.tensors[0])) == [0.0]
    x = torch.tensor([0.1, 0.2, 0.3])
    mild = harness.Case("x", "mul", 0, lambda t: t * 1.0, (x,))
    steep = harness.Case("x", "exp", 0, lambda t: torch.exp(t * 100.0), (x,))
    (mild_err,) = harness.fp16_input_rounding_error(mild, x)
    (steep_err,) = harness.fp16_input_rounding_error(steep, torch.exp(x * 100.0))
    mild_rel, steep_rel = mild_err / 0.3, steep_err / float(torch.exp(x * 100.0).max())
    assert 0 < mild_rel < 1e-3 < steep_rel and steep_rel > 10 * mild_rel


def test_a_resumed_run_sums_the_time_of_its_finished_segments(tmp_path):
    """read_meta over a run started, stopped, resumed twice: the first start stays the run's, the finished segments'
    minutes add up, and the stopped one is counted without a time."""
    harness = _load_harness()
    jsonl = tmp_path / "cases.jsonl"
    for meta in (
        {"started": "t0", "samples": 0},
        {"resumed": "t1"},
        {"finished": "t2", "wall_minutes": 58.9},
        {"resumed": "t3"},
        {"finished": "t4", "wall_minutes": 0.2},
    ):
        harness.append_line(jsonl, {"meta": meta})
    meta = harness.read_meta(jsonl)
    assert meta["started"] == "t0" and meta["samples"] == 0 and meta["finished"] == "t4"
    assert (meta["wall_minutes"], meta["segments"], meta["finished_segments"]) == (59.1, 3, 2)
