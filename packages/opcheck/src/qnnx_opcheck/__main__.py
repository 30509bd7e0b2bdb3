"""Command line: ``qnnx-opcheck model.onnx`` -- will this ONNX model run on a QNN backend?

Runs without torch and without onnxruntime (the installed onnxruntime-qnn version is read from package
metadata when present).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from qnnx_opcheck._check import check_model
from qnnx_opcheck._report import OpCheckReport
from qnnx_opcheck._version import __version__
from qnnx_opcheck.errors import InvalidVersionError, ModelLoadError, OpcheckError, UnknownBackendError

__all__ = ["main"]

EXIT_SUPPORTED = 0
EXIT_UNSUPPORTED = 1
EXIT_USAGE = 2
EXIT_UNREADABLE = 3

_EPILOG = """\
examples:
  qnnx-opcheck model.onnx                         # HTP (NPU), installed onnxruntime-qnn or newest table
  qnnx-opcheck model.onnx --backend gpu --json
  qnnx-opcheck model.onnx --onnxruntime-qnn 2.6.0 --soc-model 60 --problems-only

exit codes:
  0  every node is supported (hazards allowed: they run, with a documented caveat)
  1  at least one node is unsupported
  2  usage error (bad option, unknown backend, bad version string)
  3  the model cannot be read (missing, empty, not ONNX, invalid)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qnnx-opcheck",
        description="Check, node by node, whether a QNN backend (HTP/NPU or GPU) can run an ONNX model.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("model", help="path of the .onnx file (external data is not needed)")
    p.add_argument("--backend", default="htp", help="htp (alias npu) or gpu; default htp")
    p.add_argument("--onnxruntime-qnn", dest="version", metavar="VERSION", help="release to check against")
    p.add_argument("--soc-model", type=int, metavar="N", help="HTP SoC model, e.g. 60 (Snapdragon X Elite)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--markdown", action="store_true", help="print the per-node table as Markdown")
    p.add_argument("--problems-only", action="store_true", help="list only unsupported and hazard nodes")
    return p


def _rows(report: OpCheckReport, problems_only: bool) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for i, v in enumerate(report.verdicts):
        if problems_only and v.status == "supported":
            continue
        op = v.op_type if not v.domain else f"{v.domain}::{v.op_type}"
        rows.append((str(i), v.node_name, op, v.dtype or "?", v.status, v.reason or ""))
    return rows


def _text(report: OpCheckReport, problems_only: bool) -> str:
    header = ("#", "node", "op", "dtype", "status", "reason")
    rows = _rows(report, problems_only)
    widths = [max([len(header[c])] + [min(len(r[c]), 40) for r in rows]) for c in range(5)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, [*widths, 0])).rstrip()]
    for r in rows:
        cells = [r[c] if len(r[c]) <= 40 else r[c][:37] + "..." for c in range(5)]
        lines.append(("  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + r[5]).rstrip())
    lines.append("")
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.append(report.summary())
    return "\n".join(lines)


def _markdown(report: OpCheckReport, problems_only: bool) -> str:
    lines = [f"**{report.summary()}**", "", "| # | node | op | dtype | status | reason |", "|---|---|---|---|---|---|"]
    for r in _rows(report, problems_only):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    if report.notes:
        lines.append("")
        lines.extend(f"- note: {n}" for n in report.notes)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see ``--help``)."""
    args = _parser().parse_args(argv)
    try:
        report = check_model(args.model, args.backend, onnxruntime_qnn=args.version, soc_model=args.soc_model)
    except (UnknownBackendError, InvalidVersionError) as exc:
        return _fail(args, exc, EXIT_USAGE)
    except ModelLoadError as exc:
        return _fail(args, exc, EXIT_UNREADABLE)
    except OpcheckError as exc:  # a broken installation (missing table)
        return _fail(args, exc, EXIT_UNREADABLE)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif args.markdown:
        print(_markdown(report, args.problems_only))
    else:
        print(_text(report, args.problems_only))
    return EXIT_SUPPORTED if report.supported else EXIT_UNSUPPORTED


def _fail(args: argparse.Namespace, exc: Exception, code: int) -> int:
    print(f"qnnx-opcheck: error: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps({"error": {"type": type(exc).__name__, "message": str(exc), "exit_code": code}}, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
