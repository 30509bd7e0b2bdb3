"""Probe the real QNN EP (HTP) op by op and write the raw results that the HTP tables are generated from.

Every (op variant, dtype) case runs in its own child process, because some cases crash the process
(Unsqueeze on int64 data segfaults inside onnxruntime-qnn 2.7.0). Each child builds one tiny model
(tools/opcheck/cases.py), creates a session with ``session.disable_cpu_ep_fallback=1`` and an explicit
``soc_model``, runs it, and compares the output with the ORT CPU EP.

Outcome codes written per case:
  Y                the QNN EP took the node, the graph finalized and ran (``err`` = max abs error / max |ref|)
  rejected         the QNN EP declined the node (it would fall back to the CPU EP); ``reason`` from the EP log
  finalize_error   claimed, then graph finalize/compose failed (not rescued by CPU fallback)
  session_error    session creation fails even with CPU fallback allowed (layout-transformer bug class)
  crash            the child process died with a signal (``rc``)
  run_error        the session was created but Run() failed
  timeout          the child did not finish within --case-timeout

Usage (about 5 minutes with --jobs 2 on the 2-core bench):
    python tools/opcheck/probe.py --soc-model 60 --jobs 2
    python tools/opcheck/probe.py --only Add,Unsqueeze --dtypes int64     # a quick look
    python tools/opcheck/probe.py --dtypes qdq --merge                     # QDQ cases only, into the raw file
    python tools/opcheck/tables.py                                        # raw -> package tables + docs

Writes tools/opcheck/data/htp-<onnxruntime-qnn version>-soc<N>.raw.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases  # noqa: E402


def _quiet_fds(log_path: str) -> tuple[int, int]:
    """Point fd 1 and fd 2 at ``log_path``: the HTP simulator prints a LIBNATIVE line on fd 1."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return saved


def _restore_fds(saved: tuple[int, int]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    os.close(saved[0])
    os.close(saved[1])


def _session(ort, oq, model_bytes: bytes, soc_model: str, fallback: bool, severity: int, backend: str = "htp"):
    dev = next(d for d in ort.get_ep_devices() if d.ep_name == oq.get_ep_name())
    so = ort.SessionOptions()
    so.log_severity_level = severity
    if not fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    path = oq.get_qnn_htp_path() if backend == "htp" else oq.get_qnn_gpu_path()
    opts = {"backend_path": path}
    if soc_model:
        opts["soc_model"] = soc_model
    so.add_provider_for_devices([dev], opts)
    return ort.InferenceSession(model_bytes, sess_options=so)


def _compare(got, ref) -> float:
    import numpy as np

    worst = 0.0
    for g, r in zip(got, ref):
        g = np.asarray(g)
        r = np.asarray(r)
        if g.shape != r.shape:
            return float("inf")
        if r.dtype.kind == "f":
            g = g.astype(np.float64)
            r = r.astype(np.float64)
            both_nan = np.isnan(g) & np.isnan(r)
            g = np.where(both_nan, 0, g)
            r = np.where(both_nan, 0, r)
            if np.isnan(g).any() or np.isnan(r).any():
                return float("inf")
            # Both saturate alike in fp16 (e.g. inf); compare finite values only.
            fin = np.isfinite(r) & np.isfinite(g)
            if (np.isfinite(r) != np.isfinite(g)).any():
                return float("inf")
            scale = max(float(np.abs(r[fin]).max()) if fin.any() else 0.0, 1e-6)
            worst = max(worst, float(np.abs(g[fin] - r[fin]).max()) / scale if fin.any() else 0.0)
        else:
            worst = max(worst, float(np.mean(g != r)) if r.size else 0.0)
    return worst


def _reasons(log: str) -> str:
    found = re.findall(r"REASON : (.*)", log)
    return " | ".join(dict.fromkeys(s.strip() for s in found))[:400]


def child(case: str, dtype: str, soc_model: str, out_path: str, backend: str) -> None:
    """Run one case and write its result as JSON to ``out_path``."""
    import onnxruntime as ort
    import onnxruntime_qnn as oq

    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
    if case.startswith("pattern:"):
        built = cases.PATTERNS[case.split(":", 1)[1]]()
    else:
        variant = next(v for v in cases.VARIANTS if v.name == case)
        built = cases.build(variant, dtype)
    data = built.model.SerializeToString()
    try:  # ORT's CPU EP lacks some kernels (e.g. Relu on int64): then there is no reference to compare with.
        ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, built.feeds)
    except Exception:
        ref = None
    log = tempfile.mktemp(prefix="opcheck-probe-", suffix=".log")
    result: dict[str, object]
    saved = _quiet_fds(log)
    try:
        try:
            sess = _session(ort, oq, data, soc_model, fallback=False, severity=3, backend=backend)
        except Exception as exc:
            msg = str(exc)
            if "assigned to the default CPU EP" in msg:
                result = {"status": "rejected"}
                # Again at log severity 0, only to capture the EP's REASON lines for the table.
                with contextlib.suppress(Exception):
                    _session(ort, oq, data, soc_model, fallback=False, severity=0, backend=backend)
            elif "an EP able to run the node" in msg or "layout transformer" in msg:
                result = {"status": "session_error", "error": msg[-300:]}
                try:
                    _session(ort, oq, data, soc_model, fallback=True, severity=3, backend=backend)
                    result["with_fallback"] = "ok"
                except Exception as exc2:
                    result["with_fallback"] = str(exc2)[-200:]
            elif "finalize" in msg.lower() or "compose" in msg.lower() or "EP_FAIL" in msg:
                result = {"status": "finalize_error", "error": msg[-300:]}
            else:
                result = {"status": "error", "error": msg[-300:]}
        else:
            try:
                got = sess.run(None, built.feeds)
                result = {"status": "Y", "err": _compare(got, ref) if ref is not None else None}
            except Exception as exc:
                result = {"status": "run_error", "error": str(exc)[-300:]}
    finally:
        _restore_fds(saved)
    with open(log, errors="replace") as fh:
        text = fh.read()
    os.unlink(log)
    if result["status"] == "rejected":
        result["reason"] = _reasons(text)
    if built.weights is not None:  # QDQ cases: the quantized weights the tooling wrote
        result["weights"] = built.weights
    Path(out_path).write_text(json.dumps(result))


def run_case(case: str, dtype: str, args: argparse.Namespace) -> dict[str, object]:
    fd, out = tempfile.mkstemp(prefix="opcheck-case-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", case, dtype, out, "--soc-model", args.soc_model]
    cmd += ["--backend", args.backend]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=args.case_timeout, check=False)
    except subprocess.TimeoutExpired:
        res: dict[str, object] = {"status": "timeout"}
    else:
        if proc.returncode < 0:
            res = {"status": "crash", "rc": proc.returncode}
        elif proc.returncode != 0 or not Path(out).read_text():
            tail = proc.stderr.decode(errors="replace")[-300:]
            res = {"status": "probe_error", "rc": proc.returncode, "error": tail}
        else:
            res = json.loads(Path(out).read_text())
    os.unlink(out)
    res["seconds"] = round(time.monotonic() - t0, 2)
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=3, metavar=("CASE", "DTYPE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--soc-model", default="60")
    parser.add_argument("--backend", default="htp", choices=["htp", "gpu"])
    parser.add_argument("--jobs", type=int, default=2, help="parallel children (at most 2 on the bench)")
    parser.add_argument("--case-timeout", type=float, default=120.0)
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument(
        "--dtypes",
        default="",
        help="comma-separated dtype keys (a key starting with qdq also selects its weight variants)",
    )
    parser.add_argument("--out", default="", help="raw JSON path (default tools/opcheck/data/...)")
    parser.add_argument("--merge", action="store_true", help="merge the cases run into the existing raw file")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.soc_model, args.child[2], args.backend)
        return 0
    only = {s for s in args.only.split(",") if s}
    want = {s for s in args.dtypes.split(",") if s}
    todo: list[tuple[str, str]] = []
    skipped: dict[str, list[str]] = {}
    for v in cases.VARIANTS:
        if only and v.name not in only:
            continue
        dts = list(v.dtypes) + (cases.qdq_keys(v) if v.qdq else [])
        written: set[tuple[str, str | None]] = set()  # (activation key, weights the tooling wrote)
        for dt in dts:
            if want and not any(dt == w or (w.startswith("qdq") and dt.startswith(w)) for w in want):
                continue
            built = cases.build(v, dt)
            if built is None:
                skipped.setdefault(v.name, []).append(dt)
                continue
            if dt.startswith("qdq_"):
                # The tooling ignores some requests (per-channel LayerNormalization, int8 PRelu slopes): a
                # request that writes weights already probed for this activation type is not run again.
                form = (dt.split("/")[0], built.weights)
                if form in written:
                    continue
                written.add(form)
            todo.append((v.name, dt))
    for p in cases.PATTERNS:
        if not only or f"pattern:{p}" in only:
            todo.append((f"pattern:{p}", "float32"))
    qnn_version = metadata.version("onnxruntime-qnn")
    print(
        f"probing {len(todo)} cases ({sum(map(len, skipped.values()))} invalid combinations skipped), "
        f"onnxruntime-qnn {qnn_version}, soc_model {args.soc_model}, jobs {args.jobs}",
        flush=True,
    )
    t0 = time.monotonic()
    results: dict[str, dict[str, object]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(args.jobs, 2))) as pool:
        futs = {pool.submit(run_case, c, d, args): (c, d) for c, d in todo}
        for i, fut in enumerate(concurrent.futures.as_completed(futs), 1):
            c, d = futs[fut]
            res = fut.result()
            results.setdefault(c, {})[d] = res
            if res["status"] != "Y" or i % 50 == 0:
                print(
                    f"[{i}/{len(todo)}] {c} {d}: {res['status']} {res.get('reason') or res.get('error') or ''}"[:200],
                    flush=True,
                )
    elapsed = time.monotonic() - t0
    import onnx
    import onnxruntime

    try:
        import onnxruntime_qnn as oq

        qairt = oq.build_and_package_info.qnn_version  # type: ignore[attr-defined]
    except Exception:
        qairt = "unknown"
    raw = {
        "meta": {
            "backend": args.backend,
            "onnxruntime_qnn": qnn_version,
            "qairt": qairt,
            "onnxruntime": onnxruntime.__version__,
            "onnx": onnx.__version__,
            "soc_model": int(args.soc_model),
            "platform": f"{platform.system()} {platform.machine()} (HTP simulator)",
            "date": datetime.date.today().isoformat(),
            "seconds": round(elapsed, 1),
            "cases": len(todo),
            "tool": "tools/opcheck/probe.py",
        },
        "skipped_invalid": skipped,
        "results": {k: dict(sorted(v.items())) for k, v in sorted(results.items())},
    }
    out = Path(args.out) if args.out else HERE / "data" / f"{args.backend}-{qnn_version}-soc{args.soc_model}.raw.json"
    if any(d.startswith("qdq_") for _, d in todo):
        raw["meta"]["qdq_tooling"] = (
            f"QDQ cases quantized by onnxruntime {onnxruntime.__version__}'s QNN tooling "
            "(get_qnn_qdq_config + quantize, calibrated on the probe inputs)"
        )
    if args.merge and out.exists():
        old = json.loads(out.read_text())
        for case, per_dtype in raw["results"].items():
            old["results"].setdefault(case, {}).update(per_dtype)
        old["results"] = {k: dict(sorted(v.items())) for k, v in sorted(old["results"].items())}
        old["meta"]["cases"] = sum(len(v) for v in old["results"].values())
        old["meta"]["seconds"] = round(old["meta"]["seconds"] + elapsed, 1)
        old["meta"].setdefault("supplements", []).append({"date": raw["meta"]["date"], "cases": len(todo)})
        if "qdq_tooling" in raw["meta"]:
            old["meta"]["qdq_tooling"] = raw["meta"]["qdq_tooling"]
        raw = old
    elif only or want:
        out = out.with_suffix(".partial.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw, indent=1, sort_keys=False) + "\n")
    print(f"wrote {out} in {elapsed:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
