"""``qnnx-detect``: print what Qualcomm QNN can do on this machine."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from qnnx_clikit import command_parser, error, out, run_main
from qnnx_detection._overrides import ENV_SOC_MODEL
from qnnx_detection._probe import probe
from qnnx_detection._report import BackendStatus, ProbeReport
from qnnx_detection._soc import parse_soc_model, soc_info
from qnnx_detection._version import __version__
from qnnx_detection.errors import InvalidSocModelError

PROG = "qnnx-detect"
EXIT_USABLE = 0
EXIT_NONE_USABLE = 1
EXIT_USAGE = 2
EXIT_ERROR = 3

_EPILOG = """\
examples:
  qnnx-detect                        readable table
  qnnx-detect --json                 machine-readable report (schema: docs/detection.md)
  qnnx-detect --device gpu           exit 0 only if the QNN GPU backend is usable
  qnnx-detect --soc-model SM8650     probe the HTP simulator as a Snapdragon 8 Gen 3

environment:
  QNNX_DISABLE=1                 treat QNN as unavailable
  QNNX_DEVICE=npu|gpu|cpu|auto   device the qnnx backend must use
  QNNX_SOC_MODEL=<number|name>   SoC for the HTP simulator (default 60, SC8380XP); --soc-model overrides it

exit status:
  0  at least one QNN accelerator (npu or gpu) is usable (with --device: that one is)
  1  none is usable
  2  usage error (bad option or value: device, SoC)
  3  error: the probe itself failed (it reports problems instead of failing, so this is a bug to report)

errors: one line on stderr; with --json, also {"error": {"type", "message", "fix", "exit_code"}} on stdout
"""


def _soc_model(text: str) -> int:
    try:
        return parse_soc_model(text, source="--soc-model")
    except InvalidSocModelError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        PROG,
        "Report what Qualcomm QNN (through ONNX Runtime) can do on this machine: which backends "
        "initialize, on real silicon or the host simulator, which SoC, and the versions involved.",
        _EPILOG,
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--device",
        choices=("npu", "gpu", "htp"),
        help="set the exit status from this backend only ('htp' is the same as 'npu')",
    )
    parser.add_argument(
        "--soc-model",
        type=_soc_model,
        metavar="SOC",
        help="SoC the HTP simulator stands for: a QNN SoC number or a chip name, e.g. 60 or SC8380XP, SM8650 "
        "(as QNNX_SOC_MODEL; real silicon reports its own)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log the probe's details on stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _hardware(status: BackendStatus) -> str:
    if status.is_simulator:
        return "HTP simulator (host CPU)"
    if status.hardware_type == "NPU":
        return "NPU (Hexagon HTP)"
    if status.hardware_type == "GPU":
        return "Adreno GPU"
    return "-"


def _soc(status: BackendStatus) -> str:
    if status.soc_model is None:
        return "-"
    info = soc_info(status.soc_model)
    text = f"{status.soc_model}"
    if info is not None:
        text += f" {info.name} ({info.marketing_name}"
        text += f", HTP v{status.htp_arch})" if status.htp_arch else ")"
    if status.soc_source:
        text += f" [{status.soc_source}]"
    return text


def render_table(report: ProbeReport) -> str:
    """Return the human-readable report ``qnnx-detect`` prints."""
    v, p = report.versions, report.platform
    lines = [
        f"qnnx-detect {__version__}: {p.system} {p.machine} (release {p.release}), Python {v.python}",
        f"onnxruntime {v.onnxruntime or 'not installed'} | onnxruntime-qnn {v.onnxruntime_qnn or 'not installed'}"
        f" | QAIRT {v.qairt or 'unknown'}",
        "",
    ]
    rows = [("DEVICE", "USABLE", "HARDWARE", "SOC")]
    rows += [(b.device, "yes" if b.available else "no", _hardware(b), _soc(b)) for b in report.backends]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
    lines.append("")
    for b in report.backends:
        if b.library_path:
            lines.append(f"{b.device} library: {b.library_path}")
        if b.reason:
            lines.append(f"{b.device} unavailable: {b.reason}")
    o = report.overrides
    shown = [
        f"QNNX_DISABLE={o.raw_disable if o.raw_disable is not None else '(unset)'}",
        f"QNNX_DEVICE={o.raw_device if o.raw_device is not None else '(unset)'}",
        f"QNNX_SOC_MODEL={o.raw_soc_model if o.raw_soc_model is not None else '(unset)'}",
    ]
    lines.append("overrides: " + "  ".join(shown))
    for problem in report.problems:
        if not any(problem == b.reason for b in report.backends):
            lines.append(f"problem: {problem}")
    usable = ", ".join(report.usable_devices) or "none (qnnx will run on the CPU)"
    lines.append(f"usable QNN devices: {usable}  (probe took {report.elapsed_s:.2f} s)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status (0 usable, 1 none usable, 2 usage error, 3 error)."""
    return run_main(_parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        report = _probe(args.soc_model)
    except Exception as exc:  # the probe reports problems instead of raising: this is a bug, say so cleanly
        fix = "run again with --verbose and report the output"
        return error(PROG, args.json, type(exc).__name__, f"the probe failed: {exc}", fix, EXIT_ERROR)
    out(json.dumps(report.to_dict(), indent=2) if args.json else render_table(report))
    if args.device:
        return EXIT_USABLE if report.backend(args.device).available else EXIT_NONE_USABLE
    return EXIT_USABLE if report.any_available else EXIT_NONE_USABLE


def _probe(soc_model: int | None) -> ProbeReport:
    """The probe, for ``--soc-model`` as if ``QNNX_SOC_MODEL`` were set (the environment is restored after)."""
    if soc_model is None:
        return probe()
    before = os.environ.get(ENV_SOC_MODEL)
    os.environ[ENV_SOC_MODEL] = str(soc_model)
    try:
        return probe(refresh=True)  # a report cached in this process may stand for another SoC
    finally:
        if before is None:
            os.environ.pop(ENV_SOC_MODEL, None)
        else:
            os.environ[ENV_SOC_MODEL] = before


if __name__ == "__main__":
    sys.exit(main())
