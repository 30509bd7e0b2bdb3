"""Command line: ``qnnx-opcheck model.onnx`` -- will this ONNX model run on a QNN backend?

Runs without torch and without onnxruntime (the installed onnxruntime-qnn version is read from package
metadata when present).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections.abc import Sequence

from qnnx_clikit import command_parser, error, error_of, message_and_fix, out, run_main, soc_model
from qnnx_opcheck._check import check_model
from qnnx_opcheck._live import LiveReport, live_check
from qnnx_opcheck._report import OpCheckReport
from qnnx_opcheck._shapes import parse_dim, parse_shape
from qnnx_opcheck._tables import available_tables
from qnnx_opcheck._version import __version__
from qnnx_opcheck.errors import (
    InvalidShapeError,
    InvalidVersionError,
    ModelLoadError,
    QnnxOpcheckError,
    UnknownBackendError,
)

__all__ = ["main"]

PROG = "qnnx-opcheck"
EXIT_SUPPORTED = 0
EXIT_UNSUPPORTED = 1
EXIT_USAGE = 2
EXIT_UNREADABLE = 3

_EPILOG = """\
examples:
  qnnx-opcheck model.onnx                         # NPU (HTP), installed onnxruntime-qnn or newest table
  qnnx-opcheck model.onnx --device gpu --json
  qnnx-opcheck model.onnx --dim batch=1 --live    # also run it on the installed QNN EP, against the CPU EP
  qnnx-opcheck model.onnx --onnxruntime-qnn 2.6.0 --soc-model SM8650 --problems-only
  qnnx-opcheck model.onnx --dim batch=1 --dim height=320 --dim width=320   # fix the free dims by name
  qnnx-opcheck model.onnx --shape images=1,3,320,320                      # or whole input shapes

exit codes:
  0  every node is supported (hazards allowed: they run, with a documented caveat)
  1  at least one node is unsupported (with --live: or the live session failed, or its outputs differ)
  2  usage error (bad option or value: device, version, SoC, a --dim or --shape the model does not have)
  3  error: the model cannot be read (missing, empty, not ONNX, invalid) or the tables are missing

errors: one line on stderr; with --json, also {"error": {"type", "message", "fix", "exit_code"}} on stdout
"""

_DEVICES = {"npu": "htp", "htp": "htp", "gpu": "gpu"}


def _device(text: str) -> str:
    device = _DEVICES.get(text.strip().lower())
    if device is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a QNN device; accepted: npu (alias htp), gpu")
    return device


def _version(text: str) -> str:
    """``--onnxruntime-qnn``: MAJOR.MINOR[.PATCH]; other strings are a usage error naming the tables there are."""
    if re.fullmatch(r"\d+\.\d+(\.\d+)?", text.strip()):
        return text.strip()
    releases = sorted({t.onnxruntime_qnn for t in available_tables()}, key=lambda v: tuple(map(int, v.split("."))))
    raise argparse.ArgumentTypeError(
        f"{text!r} is not an onnxruntime-qnn version; accepted: MAJOR.MINOR[.PATCH] (releases with a table: "
        f"{', '.join(releases)})"
    )


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        PROG, "Check, node by node, whether a QNN device (NPU/HTP or GPU) can run an ONNX model.", _EPILOG
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("model", help="path of the .onnx file (external data is not needed)")
    p.add_argument(
        "--device",
        "--backend",
        dest="device",
        type=_device,
        default="htp",
        metavar="DEVICE",
        help="npu (alias htp; the default) or gpu; --backend is the former name",
    )
    p.add_argument(
        "--onnxruntime-qnn", dest="version", type=_version, metavar="VERSION", help="release to check against"
    )
    p.add_argument(
        "--soc-model",
        type=soc_model,
        metavar="SOC",
        help="HTP SoC: a QNN SoC number or a chip name, e.g. 60 or SC8380XP (Snapdragon X Elite), SM8650",
    )
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=N",
        help="size of a named free dimension of the graph inputs, e.g. batch=1 (repeatable); QNN needs static shapes",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="INPUT=D0,D1,...",
        help="full shape of a graph input, e.g. images=1,3,320,320 (repeatable)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--markdown", action="store_true", help="print the per-node table as Markdown")
    p.add_argument("--problems-only", action="store_true", help="list only unsupported and hazard nodes")
    p.add_argument(
        "--live",
        action="store_true",
        help="also build the model on the installed QNN EP (in a child process), record where ONNX Runtime placed "
        "each node and compare its outputs on generated inputs with the CPU EP (needs onnxruntime-qnn)",
    )
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
    return run_main(_parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    try:
        free_dims = dict(parse_dim(text) for text in args.dim)
        input_shapes = dict(parse_shape(text) for text in args.shape)
    except InvalidShapeError as exc:
        return error_of(PROG, args.json, exc, EXIT_USAGE)
    try:
        report = check_model(
            args.model,
            args.device,
            onnxruntime_qnn=args.version,
            soc_model=args.soc_model,
            free_dims=free_dims,
            input_shapes=input_shapes,
        )
    except (UnknownBackendError, InvalidVersionError, InvalidShapeError) as exc:
        return error_of(PROG, args.json, exc, EXIT_USAGE)
    except ModelLoadError as exc:
        fix = "pass the path of a readable .onnx file (its external data is not needed)"
        return error(PROG, args.json, type(exc).__name__, message_and_fix(exc)[0], fix, EXIT_UNREADABLE)
    except QnnxOpcheckError as exc:  # a broken installation (missing table)
        return error_of(PROG, args.json, exc, EXIT_UNREADABLE, fix="reinstall qnnx-opcheck")
    live = None
    if args.live:
        if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnxruntime_qnn") is None:
            message = "--live builds the model on the installed QNN EP, and onnxruntime-qnn is not installed"
            return error(PROG, args.json, "LiveUnavailable", message, "pip install onnxruntime-qnn", EXIT_USAGE)
        soc = int(args.soc_model) if args.soc_model is not None else 60
        live = live_check(args.model, soc_model=soc, free_dims=free_dims, input_shapes=input_shapes or None)
    if args.json:
        data = report.to_dict()
        if live is not None:
            data["live"] = live.to_dict()
        out(json.dumps(data, indent=2))
    elif args.markdown:
        out(_markdown(report, args.problems_only))
    else:
        out(_text(report, args.problems_only))
    if live is not None and not args.json:
        out(_live_text(live))
    if live is not None and not (live.ran and live.outputs_match):
        return EXIT_UNSUPPORTED
    return EXIT_SUPPORTED if report.supported else EXIT_UNSUPPORTED


def _live_text(live: LiveReport) -> str:
    lines = ["", "live: where ONNX Runtime placed each node it kept (after its own graph optimizations)"]
    lines += [f"  {node}  {op}  {ep}" for node, op, ep in live.assignment]
    for name, result in live.outputs.items():
        figure = result.get("why") or f"max |err| {result.get('max_abs_error', 0):.3g}"
        lines.append(f"  output {name}: {'matches' if result.get('match') else 'DOES NOT match'} the CPU EP ({figure})")
    lines.append(live.summary())
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
