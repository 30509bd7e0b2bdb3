"""qnnx operator conformance: every float32 op of PyTorch's OpInfo database through torch.compile(backend="qnn").

Each case (one sample input of one op) runs in eager PyTorch and through
``torch.compile(fn, backend="qnn", options={"device": "auto"})``, and is classified ``qnn`` (ran on QNN, matches),
``fallback`` (matches, some graph ran in PyTorch), ``wrong`` (differs from eager), ``error`` (the compiled call
raised), ``crash`` (the process died or hung) or ``invalid`` (eager raised); see harness.py for the rules. Cases run
in a worker subprocess that this script restarts after a crash; one JSON line per case goes to ``--jsonl`` as it
finishes (``<out>/cases.jsonl`` when ``--out`` is given), so an interrupted run continues with ``--resume``. At the end
``<out>/conformance.md`` and ``<out>/conformance.json`` are written (``--report-only`` rewrites them from the JSONL).

On x86_64 the QNN HTP device is the simulator inside onnxruntime-qnn: fp16 numerics, slow; a case takes about
0.2-2 s, the first sample of every op about half an hour on 2 cores.

Examples:
    python tools/conformance/run.py --samples 1                      # the first sample of every op
    python tools/conformance/run.py --ops '^(tan|sort|nn\\.functional\\.avg_pool2d)$' --out /tmp/c
    python tools/conformance/run.py --cases 'tan#0,sort#0,zero_size.mul_sum#0' --out /tmp/c
    python tools/conformance/run.py --samples 3 --resume              # go on where an interrupted run stopped
    python tools/conformance/run.py --samples all                    # every sample of every op (full depth)
    python tools/conformance/run.py --report-only                    # rewrite docs/conformance.* from the JSONL

Exit codes: 0 the harness ran (cases that are wrong, fail or crash are reported, not raised); 2 bad arguments;
3 --report-only without a JSONL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402  (a sibling module of this script)
import report  # noqa: E402


def _samples(text: str) -> int:
    if text.strip().lower() == "all":
        return harness.ALL_SAMPLES
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid; accepted: an integer >= 1, or 'all'")
    return n


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python tools/conformance/run.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Examples:") :],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--samples",
        type=_samples,
        default=3,
        help="samples per op: the first N of sample_inputs, or 'all' for every one (default 3)",
    )
    p.add_argument("--ops", help="regular expression (re.search) on '<op name>[.<variant>]' selecting the ops")
    p.add_argument(
        "--cases", help="comma list of case ids to run instead (e.g. 'tan#0,sort#1'); also zero_size.* cases"
    )
    p.add_argument("--out", type=Path, default=ROOT / "docs", help="where conformance.md/json go (default docs/)")
    p.add_argument(
        "--jsonl",
        type=Path,
        default=None,
        help="one JSON line per case (default <out>/cases.jsonl with --out, else build/conformance/cases.jsonl)",
    )
    p.add_argument("--resume", action="store_true", help="keep the JSONL and skip the cases already in it")
    p.add_argument(
        "--timeout",
        type=float,
        default=harness.DEFAULT_TIMEOUT,
        help=f"seconds one case may take before its worker is killed and the case counts as a crash "
        f"(default {harness.DEFAULT_TIMEOUT:.0f})",
    )
    p.add_argument(
        "--cases-per-worker",
        type=int,
        default=harness.MAX_CASES_PER_WORKER,
        help=f"start a fresh worker process after this many cases (default {harness.MAX_CASES_PER_WORKER})",
    )
    p.add_argument("--report-only", action="store_true", help="rewrite <out>/conformance.md/json from the JSONL")
    args = p.parse_args(argv)
    if args.jsonl is None:
        # A run with its own --out keeps its JSONL there: a subset run must not overwrite the full run's.
        args.jsonl = report.DEFAULT_JSONL if args.out.resolve() == ROOT / "docs" else args.out / "cases.jsonl"
    if args.timeout <= 0:
        p.error(f"--timeout {args.timeout} is not valid; accepted: seconds > 0")
    if args.cases_per_worker < 1:
        p.error(f"--cases-per-worker {args.cases_per_worker} is not valid; accepted: an integer >= 1")
    if args.ops:
        try:
            re.compile(args.ops)
        except re.error as exc:
            p.error(f"--ops {args.ops!r} is not a valid regular expression: {exc}")
    args.case_ids = [c.strip() for c in args.cases.split(",") if c.strip()] if args.cases else None
    if args.case_ids is not None:
        bad = [c for c in args.case_ids if not re.fullmatch(r".+#\d+", c)]
        if bad:
            p.error(f"--cases: {', '.join(bad)} not valid; accepted: ids such as 'tan#0'")
    return args


def _progress(total_hint: int | None, t0: float):
    counts: dict[str, int] = {}

    def show(rec: dict[str, Any]) -> None:
        counts[rec["status"]] = counts.get(rec["status"], 0) + 1
        n = sum(counts.values())
        of = f"/~{total_hint}" if total_hint else ""
        extra = rec.get("category") if rec["status"] == "fallback" else rec.get("detail")
        extra = f"  {harness.sanitize(extra, 110)}" if extra and rec["status"] != "qnn" else ""
        running = " ".join(f"{s}={counts[s]}" for s in harness.STATUSES if counts.get(s))
        print(
            f"[{n}{of} {(time.perf_counter() - t0) / 60:5.1f} min] {rec['id']:<48} {rec['status']:<8} "
            f"{rec.get('seconds', 0):6.2f}s{extra}   ({running})",
            flush=True,
        )

    return show


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        if not args.jsonl.exists():
            print(f"no results at {args.jsonl}; run without --report-only first", file=sys.stderr)
            return 3
        doc = report.write(harness.read_jsonl(args.jsonl), harness.read_meta(args.jsonl), args.out)
        print(f"wrote {args.out / 'conformance.md'} and {args.out / 'conformance.json'}: {doc['totals']}")
        return 0

    meta = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "samples": args.samples,
        "ops": args.ops,
        "cases": args.case_ids,
        "timeout": args.timeout,
        "soc_model": os.environ.get("QNNX_SOC_MODEL", harness.DEFAULT_SOC_MODEL),
        "versions": report.versions(),
    }
    # With --samples N the count is an upper bound: some ops have fewer samples.
    total_hint = (
        len(args.case_ids) if args.case_ids is not None else len(harness.float32_ops(args.ops)) * args.samples or None
    )
    where = "resuming" if args.resume and args.jsonl.exists() else "writing"
    print(
        f"qnnx conformance: {args.samples or 'every'} sample(s) per op"
        + (f", ops matching {args.ops!r}" if args.ops else "")
        + (f", {len(args.case_ids)} case(s)" if args.case_ids else "")
        + f"; {where} {args.jsonl}",
        flush=True,
    )
    t0 = time.perf_counter()
    result = harness.run_cases(
        args.jsonl,
        samples=args.samples,
        pattern=args.ops,
        ids=args.case_ids,
        timeout=args.timeout,
        resume=args.resume,
        meta=meta,
        on_record=_progress(total_hint, t0),
        max_cases_per_worker=args.cases_per_worker,
    )
    wall = time.perf_counter() - t0
    harness.append_line(
        args.jsonl,
        {
            "meta": {
                "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "wall_minutes": round(wall / 60, 1),
                "workers": result.workers,
            }
        },
    )
    doc = report.write(result.records, harness.read_meta(args.jsonl), args.out)
    t = doc["totals"]
    print(
        f"done in {wall / 60:.1f} min ({result.workers} worker process(es)): {t['cases']} cases, qnn {t['qnn']}, "
        f"fallback {t['fallback']} {doc['fallback_by_category']}, wrong {t['wrong']}, error {t['error']}, "
        f"crash {t['crash']}, invalid {t['invalid']}"
    )
    print(f"wrote {args.out / 'conformance.md'} and {args.out / 'conformance.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
