"""Core of the operator conformance harness: cases from PyTorch's OpInfo database, one compiled call per case,
classification against eager PyTorch, and crash isolation in a worker subprocess.

Used by ``tools/conformance/run.py`` (the CLI) and ``integration-tests/test_conformance.py`` (the CI subset), which
loads this file by path. Importing it is cheap: torch and the OpInfo database are imported inside the functions.

A case is one sample input of one OpInfo entry, id ``<op name>[.<variant>]#<k>``. ``fn(*tensors)`` calls the op on
the sample with every tensor leaf of (input, args, kwargs) as an argument (other leaves are constants); it runs in
eager PyTorch first (the reference; if it raises, the case is ``invalid``), then through
``torch.compile(fn, backend="qnn", options={"device": "auto"})`` under ``torch.no_grad()``. Status, one of:

* ``qnn``: every graph ran on a QNN device (compile report device ``npu``/``gpu``) and the outputs match eager;
* ``fallback``: the outputs match but some graph ran in PyTorch (report device ``eager``), or Dynamo made no graph;
* ``wrong``: an output differs from eager (structure, shape, dtype, NaN/inf pattern or values beyond tolerance);
* ``error``: the compiled call raised where eager did not;
* ``crash``: the worker process died or hung past the timeout on the case (recorded by the parent);
* ``invalid``: eager PyTorch raised on the sample (or the case does not exist in this torch).

The worker (``python tools/conformance/harness.py worker ...``) runs cases in order, writes the case id it is on
to a marker file before each case and appends one JSON line per finished case to the JSONL file. The parent
(:func:`run_cases`) watches both, records a ``crash`` when the worker dies or overruns the timeout, and starts a
new worker, which skips every case already in the JSONL.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

STATUSES = ("qnn", "fallback", "wrong", "error", "crash", "invalid")
DEFAULT_TIMEOUT = 120.0
DEFAULT_SOC_MODEL = "60"  # Snapdragon X Elite: the simulator's default, set explicitly so every session names it
SEED = 0
RTOL = 1e-2  # float outputs: max|got - ref| <= RTOL * max|ref| + ATOL over the finite elements
# HTP's transcendental functions (sigmoid, exp, log, tanh...) are table-based with an absolute error of about 3e-4
# on O(1) outputs, whatever the output's own size: sigmoid(-8.5) reads 5e-4 instead of 2e-4. ATOL admits that much
# and no more; a relative-only bound would call a 3e-4 error on a lone tiny output "wrong" at 1.35x its value.
ATOL = 1e-3
# Some samples are so ill-conditioned that fp16 itself cannot meet RTOL: attention over scores of about 200 (OpInfo's
# inputs reach +-9) moves by 0.8% of its output when only its inputs are rounded to fp16, and HTP, which rounds every
# intermediate too, lands at 1-2%. When an output misses the bound above, it is given the error that rounding the
# call's float inputs to fp16 causes in eager PyTorch, FP16_FUDGE times over, on top; a case passed that way is
# marked ``fp16_sensitive`` with both figures, and the report lists it. An error beyond that is still wrong.
FP16_FUDGE = 3.0
# Ops whose output values are undefined (uninitialized memory): only structure, shape and dtype are compared.
UNDEFINED_VALUES = frozenset(
    {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
)
MAX_CASES_PER_WORKER = 150  # a fresh worker now and then bounds the memory a long run accumulates
DONE = "__done__"

# --- text ---------------------------------------------------------------------------------------------------------

_ISSUE_URL = re.compile(r"https?://\S+?/(?:issues|pull)/\d+\S*")
_ABS_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.+@-]+/)+([\w.+@-]*)")


def sanitize(text: str | None, limit: int | None = None) -> str | None:
    """Text fit for the generated docs: absolute paths cut to their last part, links to issue trackers removed."""
    if text is None:
        return None
    text = _ISSUE_URL.sub("(upstream tracker link)", str(text))
    text = _ABS_PATH.sub(lambda m: m.group(1) or "<dir>", text)
    text = " ".join(text.split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def head(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` of an exception (Dynamo's multi-line messages cut to their start)."""
    msg = str(exc).strip()
    first = next((line.strip() for line in msg.splitlines() if line.strip()), "")
    return sanitize(f"{type(exc).__name__}: {first}" if first else type(exc).__name__, limit) or ""


# --- the OpInfo database ----------------------------------------------------------------------------------------


def _import_op_db() -> list[Any]:
    """``op_db`` of torch's internal testing package. Its import needs ``expecttest`` only for a base class of
    TestCase, which the harness never uses: a stand-in module is put in its place when it is not installed."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import unittest

        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stub.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stub
    argv = sys.argv
    sys.argv = argv[:1]  # torch's common_utils reads some flags from the command line at import time
    try:
        from torch.testing._internal import common_methods_invocations as cmi
    finally:
        sys.argv = argv
    # Random ops are wrapped in ``wrapper_set_seed``, which reseeds the global generator inside the call: Dynamo
    # cannot trace that and would skip the whole call. The harness seeds around each call itself.
    if hasattr(cmi, "wrapper_set_seed"):
        cmi.wrapper_set_seed = _call_through
    return list(cmi.op_db)


def _call_through(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


def op_key(op: Any) -> str:
    return f"{op.name}{('.' + op.variant_test_name) if op.variant_test_name else ''}"


def case_id(key: str, k: int) -> str:
    return f"{key}#{k}"


def split_case_id(cid: str) -> tuple[str, int]:
    key, _, k = cid.rpartition("#")
    return key, int(k)


def float32_ops(pattern: str | None = None) -> list[Any]:
    """OpInfo entries whose CPU dtypes include float32, in op_db order, optionally those whose key matches."""
    import torch

    regex = re.compile(pattern) if pattern else None
    out = []
    for op in _import_op_db():
        if regex is not None and not regex.search(op_key(op)):
            continue
        try:
            if torch.float32 in op.supported_dtypes("cpu"):
                out.append(op)
        except Exception:  # an entry whose dtype query fails is not a float32 op for our purpose
            continue
    return out


ALL_SAMPLES = 0  # ``samples`` value meaning every sample input of an op


def op_samples(op: Any, n: int) -> list[Any]:
    """The first ``n`` float32 CPU samples of ``op`` (every one when ``n`` is :data:`ALL_SAMPLES`), generated from a
    fixed seed (the same in every process)."""
    import torch

    torch.manual_seed(SEED)
    inputs = op.sample_inputs("cpu", torch.float32, requires_grad=False)
    return list(inputs if n == ALL_SAMPLES else itertools.islice(inputs, n))


# --- cases --------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One compiled call to check: ``fn(*tensors)``."""

    id: str
    op: str
    sample: int
    fn: Callable[..., Any]
    tensors: tuple[Any, ...]
    undefined_values: bool = False
    note: str = ""


def _leaves(tree: Any) -> tuple[list[Any], Any]:
    import torch.utils._pytree as pytree

    return pytree.tree_flatten(tree)


def build_case(op: Any, sample: Any, cid: str, k: int) -> Case:
    """``fn(*tensors)`` calling ``op.op(sample.input, *sample.args, **sample.kwargs)``, every tensor leaf an argument."""
    import torch
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    tensors = tuple(leaves[i] for i in positions)
    constants = list(leaves)
    target = op.op

    def fn(*args: Any) -> Any:
        filled = list(constants)
        for pos, value in zip(positions, args):
            filled[pos] = value
        inp, a, kw = pytree.tree_unflatten(filled, spec)
        return target(inp, *a, **kw)

    return Case(
        id=cid,
        op=op_key(op),
        sample=k,
        fn=fn,
        tensors=tensors,
        undefined_values=op.name in UNDEFINED_VALUES,
    )


def _zero_size_cases() -> dict[str, Callable[[], Case]]:
    """Cases outside op_db: zero-element tensors (QNN HTP must never see one)."""
    import torch

    def make(cid: str, fn: Callable[..., Any], *tensors: Any, note: str) -> Callable[[], Case]:
        def build() -> Case:
            key, k = split_case_id(cid)
            return Case(id=cid, op=key, sample=k, fn=fn, tensors=tensors, note=note)

        return build

    return {
        "zero_size.mul_sum#0": make(
            "zero_size.mul_sum#0", lambda x: (x * 2.0).sum(-1), torch.randn(0), note="(randn(0) * 2).sum(-1)"
        ),
        "zero_size.add_rows#0": make(
            "zero_size.add_rows#0", lambda x, y: x + y, torch.randn(0, 3), torch.randn(3), note="randn(0, 3) + randn(3)"
        ),
        "zero_size.mean_cols#0": make(
            "zero_size.mean_cols#0", lambda x: x.sum(-1) + 1.0, torch.randn(3, 0), note="randn(3, 0).sum(-1) + 1"
        ),
    }


def iter_cases(
    *, samples: int = 1, pattern: str | None = None, ids: Sequence[str] | None = None, skip: Iterable[str] = ()
) -> Iterator[tuple[str, Callable[[], Case] | None]]:
    """(case id, builder) in run order; the builder is None when the case does not exist here.

    ``ids`` picks exactly those cases (op_db ids and the ``zero_size.*`` ones); otherwise every float32 op matching
    ``pattern`` with its first ``samples`` samples (all of them with :data:`ALL_SAMPLES`). Cases in ``skip`` are
    passed over without building samples when the count is known.
    """
    skip = set(skip)
    if ids is not None:
        custom = _zero_size_cases()
        wanted: dict[str, list[int]] = {}
        for cid in ids:
            if cid in custom:
                continue
            key, k = split_case_id(cid)
            wanted.setdefault(key, []).append(k)
        ops = {op_key(op): op for op in float32_ops()} if wanted else {}
        cache: dict[str, list[Any]] = {}
        for cid in ids:
            if cid in skip:
                continue
            if cid in custom:
                yield cid, custom[cid]
                continue
            key, k = split_case_id(cid)
            op = ops.get(key)
            if op is None:
                yield cid, None
                continue
            if key not in cache:
                try:
                    cache[key] = op_samples(op, max(wanted[key]) + 1)
                except Exception:
                    cache[key] = []
            got = cache[key]
            if k >= len(got):
                yield cid, None
                continue
            yield cid, (lambda op=op, s=got[k], cid=cid, k=k: build_case(op, s, cid, k))
        return
    for op in float32_ops(pattern):
        key = op_key(op)
        if samples != ALL_SAMPLES and all(case_id(key, k) in skip for k in range(samples)):
            continue
        try:
            got = op_samples(op, samples)
        except Exception as exc:
            cid = case_id(key, 0)
            if cid not in skip:
                yield cid, _raiser(cid, key, exc)
            continue
        for k, s in enumerate(got):
            cid = case_id(key, k)
            if cid not in skip:
                yield cid, (lambda op=op, s=s, cid=cid, k=k: build_case(op, s, cid, k))


def _raiser(cid: str, key: str, exc: Exception) -> Callable[[], Case]:
    def build() -> Case:
        raise RuntimeError(f"sample_inputs raised {head(exc)}")

    return build


# --- comparison ---------------------------------------------------------------------------------------------------


def _clone(tensors: Sequence[Any]) -> list[Any]:
    """Fresh copies with the same sizes and strides (some ops mutate or read the storage layout)."""
    import torch

    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            c = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
            c.copy_(t)
            out.append(c)
        elif isinstance(t, torch.Tensor):
            out.append(t.clone())
        else:
            out.append(t)
    return out


def _describe_value(v: Any) -> str:
    import torch

    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    return type(v).__name__


@dataclass
class Mismatch:
    output: int
    kind: str  # structure, type, shape, dtype, nan, inf, values, exact
    detail: str
    rel_err: float | None = None
    max_abs_err: float | None = None
    max_abs_ref: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _float_mismatch(i: int, got: Any, ref: Any, allowance: float = 0.0) -> Mismatch | None:
    import torch

    g = got.detach().to(torch.float64).flatten()
    r = ref.detach().to(torch.float64).flatten()
    g_nan, r_nan = torch.isnan(g), torch.isnan(r)
    if not torch.equal(g_nan, r_nan):
        return Mismatch(
            i,
            "nan",
            f"NaN at {int(g_nan.sum())} position(s) vs {int(r_nan.sum())} in eager "
            f"({int((g_nan != r_nan).sum())} differ)",
        )
    g_inf, r_inf = torch.isinf(g), torch.isinf(r)
    if not torch.equal(g_inf, r_inf) or not torch.equal(torch.sign(g[g_inf]), torch.sign(r[r_inf])):
        return Mismatch(
            i,
            "inf",
            f"inf at {int(g_inf.sum())} position(s) vs {int(r_inf.sum())} in eager "
            f"({int((g_inf != r_inf).sum())} differ)",
        )
    finite = torch.isfinite(r)
    if not bool(finite.any()):
        return None
    gf, rf = g[finite], r[finite]
    scale = rf.abs().max().item()
    err = (gf - rf).abs().max().item()
    rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    if err <= RTOL * scale + ATOL + allowance:
        return None
    return Mismatch(
        i,
        "values",
        f"max|got-ref| = {err:.4g}, max|ref| = {scale:.4g} (error {rel:.3g} of max|ref|; limit {RTOL:g} + {ATOL:g})",
        rel_err=rel,
        max_abs_err=err,
        max_abs_ref=scale,
    )


def compare(got: Any, ref: Any, *, values: bool = True, allowance: Sequence[float] = ()) -> Mismatch | None:
    """The first difference of ``got`` from ``ref`` (eager), or None. ``values=False`` checks the structure, shapes
    and dtypes only (ops with random or undefined output values). ``allowance[i]``: an absolute error admitted on
    float output leaf ``i`` on top of the fixed bound (see :data:`FP16_FUDGE`)."""
    import torch

    g_leaves = _leaves(got)[0]
    r_leaves = _leaves(ref)[0]
    if len(g_leaves) != len(r_leaves):
        return Mismatch(-1, "structure", f"{len(g_leaves)} output leaves, eager has {len(r_leaves)}")
    for i, (g, r) in enumerate(zip(g_leaves, r_leaves)):
        if isinstance(r, torch.Tensor) != isinstance(g, torch.Tensor):
            return Mismatch(i, "type", f"{_describe_value(g)} where eager returns {_describe_value(r)}")
        if not isinstance(r, torch.Tensor):
            if isinstance(r, float) and isinstance(g, int | float) and values:
                if not (math.isclose(g, r, rel_tol=RTOL, abs_tol=ATOL) or (math.isnan(g) and math.isnan(r))):
                    return Mismatch(i, "values", f"{g!r} where eager returns {r!r}")
            elif values and g != r:
                return Mismatch(i, "exact", f"{g!r} where eager returns {r!r}")
            continue
        if g.shape != r.shape:
            return Mismatch(i, "shape", f"shape {list(g.shape)}, eager {list(r.shape)}")
        if g.dtype != r.dtype:
            return Mismatch(i, "dtype", f"dtype {g.dtype}, eager {r.dtype}")
        if g.layout != r.layout:
            return Mismatch(i, "layout", f"layout {g.layout}, eager {r.layout}")
        if not values or r.numel() == 0:
            continue
        g, r = _plain(g), _plain(r)
        if r.is_floating_point():
            m = _float_mismatch(i, g, r, allowance[i] if i < len(allowance) else 0.0)
            if m is not None:
                return m
        elif not torch.equal(g, r):
            diff = int((g != r).sum())
            return Mismatch(i, "exact", f"{diff} of {r.numel()} {str(r.dtype).removeprefix('torch.')} elements differ")
    return None


def _same_scalar(x: Any, y: Any) -> bool:
    return bool(x == y) or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def _plain(t: Any) -> Any:
    """A dense tensor of a dtype every comparison supports: sparse densified, complex as (real, imag) pairs."""
    import torch

    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj().to(torch.complex128))
    elif t.is_floating_point():
        t = t.to(torch.float64)
    return t


def _identical(a: Any, b: Any) -> bool:
    """Bit-for-bit the same outputs (NaN equal to NaN): used to tell random or undefined outputs."""
    import torch

    a_leaves, b_leaves = _leaves(a)[0], _leaves(b)[0]
    if len(a_leaves) != len(b_leaves):
        return False
    for x, y in zip(a_leaves, b_leaves):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or x.layout != y.layout:
                return False
            x, y = _plain(x), _plain(y)
            if x.is_floating_point():
                nan_x, nan_y = torch.isnan(x), torch.isnan(y)
                if not torch.equal(nan_x, nan_y) or not torch.equal(x[~nan_x], y[~nan_y]):
                    return False
            elif not torch.equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or not _same_scalar(x, y):
            return False
    return True


# --- what the backend did ---------------------------------------------------------------------------------------


def fallback_category(graph: dict[str, Any]) -> str:
    """A coarse reason why a graph runs in PyTorch, from its compile report's record (attempts, problem kinds)."""
    attempts = graph.get("attempts") or []
    tried = [a for a in attempts if not a.get("ok") and not str(a.get("reason", "")).startswith("skipped")]
    if not attempts:
        reason = graph.get("reason") or ""
        if reason.startswith("device='cpu'"):
            return "device cpu"
        kinds = graph.get("problem_kinds") or []
        return f"analysis: {kinds[0]}" if kinds else "analysis"
    if not tried:
        return "device unavailable"
    first = str(tried[0].get("reason", ""))
    if first.startswith("ONNX export failed"):
        return "exporter"
    if "not supported by QNN" in first:
        return "opcheck"
    if "did not pass the check against PyTorch" in first:
        return "export check"
    if first.startswith("accuracy guard"):
        return "accuracy guard"
    if first.startswith("run failed"):
        return "runtime"
    return "session"


def _fallback_reason(graph: dict[str, Any]) -> str:
    """The cause of a fallback, short: the first device's refusal rather than the chain's summary of all."""
    tried = [a for a in graph.get("attempts") or [] if not a.get("ok")]
    real = [a for a in tried if not str(a.get("reason", "")).startswith("skipped")] or tried
    if real:
        return sanitize(f"{real[0]['device']}: {real[0]['reason']}", 200) or ""
    return sanitize(graph.get("reason"), 200) or ""


_EXPORT_FAILED = "ONNX export failed: "


def _graph_records(reports: Sequence[Any]) -> list[dict[str, Any]]:
    """The JSONL record of each graph, read from its compile report alone (the FX ops, the analysis problem kinds,
    the exporter and the ONNX op types are report fields)."""
    out = []
    for rep in reports:
        g: dict[str, Any] = {
            "graph_id": rep.graph_id,
            "device": rep.device,
            "reason": sanitize(rep.reason, 200),
            "attempts": [
                {"device": a.device, "ok": a.ok, "reason": sanitize(a.reason, 200), "seconds": round(a.seconds, 2)}
                for a in rep.attempts
            ],
            "onnx_nodes": rep.onnx_nodes,
            "placement": dict(rep.placement),
            "passes_applied": list(rep.passes_applied),
            "soc_model": rep.soc_model,
            "input_shapes": [list(s) for s in rep.input_shapes][:8],
            "fx_ops": sorted(rep.fx_ops)[:40],
            "problem_kinds": list(rep.problem_kinds),
        }
        if rep.export is not None:
            g["exporter"] = rep.export.exporter
            g["fast_path_declined"] = sanitize(rep.export.fast_path_declined, 200)
            g["onnx_ops"] = sorted(rep.export.op_types)[:40]
        failed = [a.reason for a in rep.attempts if a.reason and a.reason.startswith(_EXPORT_FAILED)]
        if failed:
            g["export_error"] = sanitize(failed[0].removeprefix(_EXPORT_FAILED), 200)
        if rep.device == "eager":
            g["category"] = fallback_category(g)
        out.append(g)
    return out


# --- one case -----------------------------------------------------------------------------------------------------


def configure_dynamo() -> None:
    """No recompile or cache limit stops a case (each case resets Dynamo anyway)."""
    import torch

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 100_000)


def _eager(case: Case, seed: int | None) -> Any:
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        return case.fn(*_clone(case.tensors))


def fp16_input_rounding_error(case: Case, ref: Any) -> list[float]:
    """Per output leaf of ``ref``: max |eager(inputs rounded to fp16) - ref| over the finite elements of both (0.0
    for a leaf that is not a float tensor). How far fp16 alone moves the sample's outputs: the conditioning of the
    sample, whatever computes it."""
    import torch

    rounded = [
        t.to(torch.float16).to(t.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for t in _clone(case.tensors)
    ]
    torch.manual_seed(SEED)
    with torch.no_grad():
        moved = case.fn(*rounded)
    errors = []
    for m, r in zip(_leaves(moved)[0], _leaves(ref)[0], strict=True):
        if not (isinstance(r, torch.Tensor) and r.is_floating_point() and isinstance(m, torch.Tensor)):
            errors.append(0.0)
            continue
        m64, r64 = _plain(m).detach().to(torch.float64), _plain(r).detach().to(torch.float64)
        both = torch.isfinite(m64) & torch.isfinite(r64)
        errors.append(float((m64 - r64)[both].abs().max()) if bool(both.any()) else 0.0)
    return errors


def run_case(case: Case, phase: Callable[[str], None] = lambda _p: None) -> dict[str, Any]:
    """Run one case and classify it; never raises (except for a dead process, which the parent records)."""
    import torch

    import qnnx_backend

    rec: dict[str, Any] = {
        "id": case.id,
        "op": case.op,
        "sample": case.sample,
        "inputs": [_describe_value(t) for t in case.tensors][:8],
    }
    if case.note:
        rec["note"] = case.note
    t0 = time.perf_counter()
    phase("eager")
    try:
        ref = _eager(case, SEED)
        again = _eager(case, None)  # the RNG stream goes on: a random op gives other values
    except Exception as exc:
        rec.update(status="invalid", detail=f"eager raised {head(exc)}", seconds=round(time.perf_counter() - t0, 2))
        return rec
    try:
        compare_values = not case.undefined_values and _identical(ref, again)
    except Exception:  # outputs the check cannot read: compare() below says what it can
        compare_values = True
    if not compare_values:
        rec["values_compared"] = False  # random or undefined output values: structure, shape and dtype only
    rec["outputs"] = [_describe_value(t) for t in _leaves(ref)[0]][:8]

    phase("compiled")
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    t1 = time.perf_counter()
    error: BaseException | None = None
    got: Any = None
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        try:
            torch.manual_seed(SEED)
            compiled = torch.compile(case.fn, backend="qnn", options={"device": "auto"})
            got = compiled(*_clone(case.tensors))
        except Exception as exc:
            error = exc
    rec["compiled_seconds"] = round(time.perf_counter() - t1, 2)
    graphs = _graph_records(qnnx_backend.compile_reports())
    rec["graphs"] = graphs
    msgs = []
    for w in caught:
        text = f"{w.category.__name__}: {sanitize(str(w.message), 160)}"
        if text not in msgs:
            msgs.append(text)
    if msgs:
        rec["warnings"] = msgs[:6]
    devices = [g["device"] for g in graphs]
    rec["devices"] = devices
    phase("compare")
    if error is not None:
        rec.update(status="error", error_type=type(error).__name__, detail=head(error))
        with contextlib.suppress(Exception):
            tb = traceback.extract_tb(error.__traceback__)
            rec["where"] = [sanitize(f"{Path(f.filename).name}:{f.lineno} {f.name}") for f in tb[-3:]]
    else:
        try:
            mismatch = compare(got, ref, values=compare_values)
        except Exception as exc:  # a comparison the harness cannot make is a wrong result to look at
            mismatch = Mismatch(-1, "compare", f"comparison raised {head(exc)}")
        if mismatch is not None and mismatch.kind == "values" and mismatch.rel_err is not None:
            with contextlib.suppress(Exception):  # no figure: the case stays wrong
                rounding = fp16_input_rounding_error(case, ref)
                if compare(got, ref, values=compare_values, allowance=[FP16_FUDGE * e for e in rounding]) is None:
                    i = mismatch.output
                    rec["fp16_sensitive"] = {
                        "output": i,
                        "rel_err": mismatch.rel_err,
                        "input_rounding_rel_err": rounding[i] / mismatch.max_abs_ref if mismatch.max_abs_ref else None,
                    }
                    mismatch = None
        if mismatch is not None:
            rec.update(status="wrong", mismatch=mismatch.to_dict(), detail=mismatch.detail)
            if mismatch.rel_err is not None:
                rec["rel_err"] = mismatch.rel_err
        elif graphs and all(d in ("npu", "gpu") for d in devices):
            rec["status"] = "qnn"
        else:
            rec["status"] = "fallback"
            if not graphs:
                rec["category"] = "no graph"
                rec["reasons"] = ["Dynamo produced no graph: the call ran in PyTorch"]
            else:
                eager = [g for g in graphs if g["device"] == "eager"]
                rec["category"] = eager[0]["category"]
                rec["reasons"] = list(dict.fromkeys(_fallback_reason(g) for g in eager))
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


# --- the worker process -------------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> dict[str, dict[str, Any]]:
    """The case records of a JSONL file by id (the last record of an id wins); other lines are ignored."""
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(rec, dict) and "id" in rec and "status" in rec:
            out[rec["id"]] = rec
    return out


def read_meta(path: Path) -> dict[str, Any]:
    """The run's metadata: the ``{"meta": ...}`` lines merged in order (the run's start, then its end), or {}. A run
    resumed in several segments (each started with ``--resume``) sums their ``wall_minutes`` and counts them in
    ``segments`` and ``finished_segments`` (a stopped segment records no end, hence no time)."""
    meta: dict[str, Any] = {}
    if not path.exists():
        return meta
    wall = 0.0
    started = finished = 0
    with path.open(errors="replace") as fh:
        for line in fh:
            if not line.startswith('{"meta"'):
                continue
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and isinstance(rec.get("meta"), dict):
                    started += "started" in rec["meta"] or "resumed" in rec["meta"]
                    if isinstance(rec["meta"].get("wall_minutes"), int | float):
                        finished += 1
                        wall += rec["meta"]["wall_minutes"]
                    meta.update(rec["meta"])
    if finished:
        meta["wall_minutes"] = round(wall, 1)
    meta["segments"], meta["finished_segments"] = max(started, finished), finished
    return meta


def append_line(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(rec, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _write_marker(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def worker_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="harness.py worker")
    p.add_argument("--jsonl", type=Path, required=True)
    p.add_argument("--marker", type=Path, required=True)
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--ops", default=None)
    p.add_argument("--cases-file", type=Path, default=None)
    p.add_argument("--max-cases", type=int, default=MAX_CASES_PER_WORKER)
    args = p.parse_args(argv)

    os.environ.setdefault("QNNX_SOC_MODEL", DEFAULT_SOC_MODEL)
    import torch

    import qnnx_backend  # noqa: F401  (registers nothing new, but fail early if the backend is missing)
    import qnnx_detection

    # The machine's devices, initialized once before any case (as qnnx_backend.is_available() does): every case then
    # sees the same devices, instead of the quick probe's until a case makes the backend run the full one.
    qnnx_detection.probe()

    configure_dynamo()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ids = json.loads(args.cases_file.read_text()) if args.cases_file else None
    done = set(read_jsonl(args.jsonl))
    for count, (cid, build) in enumerate(iter_cases(samples=args.samples, pattern=args.ops, ids=ids, skip=done)):
        if count >= args.max_cases:
            _write_marker(args.marker, {"case": None, "more": True, "t": time.time()})
            return 0
        started = time.time()
        _write_marker(args.marker, {"case": cid, "phase": "build", "t": started})

        def phase(name: str, cid: str = cid, started: float = started) -> None:
            _write_marker(args.marker, {"case": cid, "phase": name, "t": started})

        key, k = split_case_id(cid)
        if build is None:
            rec = {"id": cid, "op": key, "sample": k, "status": "invalid", "detail": "no such case in this torch"}
        else:
            try:
                case = build()
            except Exception as exc:
                rec = {"id": cid, "op": key, "sample": k, "status": "invalid", "detail": f"building: {head(exc)}"}
            else:
                rec = run_case(case, phase)
        rec.setdefault("seconds", round(time.time() - started, 2))
        append_line(args.jsonl, rec)
    _write_marker(args.marker, {"case": DONE, "t": time.time()})
    return 0


# --- the parent ---------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    records: dict[str, dict[str, Any]]
    new: list[dict[str, Any]] = field(default_factory=list)
    workers: int = 0
    seconds: float = 0.0


def _signal_name(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-rc).name}"
        return f"killed by signal {-rc}"
    return f"exit code {rc}"


def _read_marker(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return {}


def run_cases(
    jsonl: Path,
    *,
    samples: int = 1,
    pattern: str | None = None,
    ids: Sequence[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    resume: bool = False,
    meta: dict[str, Any] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    max_cases_per_worker: int = MAX_CASES_PER_WORKER,
    env: dict[str, str] | None = None,
) -> RunResult:
    """Run the cases in worker subprocesses; every finished case is a line of ``jsonl`` (kept with ``resume``)."""
    jsonl = Path(jsonl)
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    if not resume or not jsonl.exists():
        jsonl.write_text("")
        if meta is not None:
            append_line(jsonl, {"meta": meta})
    elif meta is not None:  # a resumed segment: its start counts it (read_meta), the first start stays the run's
        append_line(jsonl, {"meta": {"resumed": meta.get("started")}})
    marker = jsonl.with_name(jsonl.name + ".current")
    log_path = jsonl.with_name(jsonl.name + ".worker.log")
    cases_file = None
    if ids is not None:
        cases_file = jsonl.with_name(jsonl.name + ".cases.json")
        cases_file.write_text(json.dumps(list(ids)))
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("QNNX_SOC_MODEL", DEFAULT_SOC_MODEL)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # The harness folder on the path, so a worker started from anywhere runs the same file.
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", "--jsonl", str(jsonl), "--marker", str(marker)]
    cmd += ["--samples", str(samples), "--max-cases", str(max_cases_per_worker)]
    if pattern:
        cmd += ["--ops", pattern]
    if cases_file is not None:
        cmd += ["--cases-file", str(cases_file)]

    result = RunResult(records=read_jsonl(jsonl))
    t_start = time.perf_counter()
    offset = jsonl.stat().st_size
    fruitless = 0

    def drain() -> None:
        nonlocal offset
        with jsonl.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        offset += end + 1
        for line in data[: end + 1].decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict) and "id" in rec and "status" in rec:
                    result.records[rec["id"]] = rec
                    result.new.append(rec)
                    if on_record is not None:
                        on_record(rec)

    while True:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        before = len(result.new)
        log_start = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT, start_new_session=True
            )
        result.workers += 1
        timed_out: dict[str, Any] | None = None
        seen_case, case_log_start = None, log_start
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                drain()
                m = _read_marker(marker)
                cid = m.get("case")
                if cid != seen_case:  # the worker's output from here on belongs to this case
                    seen_case = cid
                    with contextlib.suppress(OSError):
                        case_log_start = log_path.stat().st_size
                if (
                    cid
                    and cid != DONE
                    and cid not in result.records
                    and time.time() - m.get("t", time.time()) > timeout
                ):
                    timed_out = m
                    os.killpg(proc.pid, signal.SIGKILL)  # the worker's own process group: the simulator too
                    proc.wait()
                    break
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        drain()
        m = timed_out or _read_marker(marker)
        cid = m.get("case")
        if proc.returncode == 0 and cid == DONE:
            break
        if proc.returncode == 0 and m.get("more"):
            fruitless = 0
            continue
        if cid and cid != DONE and cid not in result.records:
            tail = ""
            with contextlib.suppress(OSError), log_path.open("rb") as fh:
                start = case_log_start if cid == seen_case else log_start
                fh.seek(max(start, log_path.stat().st_size - 1500))
                tail = sanitize(fh.read().decode(errors="replace"), 600) or ""
            why = f"timed out after {timeout:g} s" if timed_out is not None else _signal_name(proc.returncode)
            key, k = split_case_id(cid)
            rec = {
                "id": cid,
                "op": key,
                "sample": k,
                "status": "crash",
                "phase": m.get("phase"),
                "detail": f"worker {why} in phase {m.get('phase')}",
                "exit": proc.returncode,
                "seconds": round(time.time() - m.get("t", time.time()), 2),
                "log_tail": tail,
            }
            append_line(jsonl, rec)
            drain()
            fruitless = 0
            continue
        # The worker died between cases or before the first one.
        fruitless = 0 if len(result.new) > before else fruitless + 1
        if fruitless >= 2:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            raise RuntimeError(
                f"the conformance worker fails outside any case ({_signal_name(proc.returncode)}):\n{tail}"
            )
    result.seconds = time.perf_counter() - t_start
    for path in (marker, cases_file):
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return result


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "worker":
        return worker_main(argv[1:])
    print("usage: harness.py worker --jsonl PATH --marker PATH [...] (run tools/conformance/run.py instead)")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
