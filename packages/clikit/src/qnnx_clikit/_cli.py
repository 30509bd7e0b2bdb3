"""What every qnnx command line does alike: argument parsing where a usage error exits 2 in the common error form,
stdout that survives a reader that left, and the error report.

Exit codes: 0 ok, 1 the answer is no, 2 usage error (:data:`EXIT_USAGE`), 3 an input or the environment cannot be
used. An error is a ``<prog>: error: <message>`` line on stderr, then a ``<prog>: fix: <fix>`` line when there is a
fix; with ``--json`` also ``{"error": {"type", "message", "fix", "exit_code"}}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

__all__ = [
    "EXIT_USAGE",
    "Parser",
    "UsageError",
    "command_parser",
    "error",
    "error_of",
    "message_and_fix",
    "out",
    "parse_args",
    "run_main",
]

#: The exit code of a bad command line (an unknown option, a bad value).
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad command line (exit 2); the message is argparse's."""


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` that prints the usage on stderr and raises :class:`UsageError` on a usage
    error, instead of exiting 2 with argparse's own message (use it for subparsers and parents too)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(message)


def command_parser(prog: str, description: str, epilog: str) -> Parser:
    """The top-level :class:`Parser` of a qnnx command: its name, its description, and an epilog (examples, exit
    codes) printed as written."""
    return Parser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace | int:
    """Parse ``argv`` (None: ``sys.argv[1:]``) with a :class:`Parser`.

    Returns:
        The parsed arguments; or the exit code to return at once: ``--help`` and ``--version`` (0, after argparse
        printed them), or a usage error (2, after :func:`error` reported it, as JSON too when ``--json`` is in
        ``argv``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return parser.parse_args(args)
    except UsageError as exc:
        prog = parser.prog
        return error(prog, "--json" in args, "UsageError", str(exc), f"see `{prog} --help`", EXIT_USAGE)
    except SystemExit as exc:  # --help, --version
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE


def run_main(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, run: Callable[[argparse.Namespace], int]
) -> int:
    """A command's ``main``: parse ``argv`` with ``parser`` (see :func:`parse_args`) and return ``run(args)``, or the
    exit code of ``--help``, ``--version`` or a usage error (reported) at once."""
    args = parse_args(parser, argv)
    return args if isinstance(args, int) else run(args)


def out(text: str) -> None:
    """Print ``text`` to stdout; a reader that left (``| head``) is not an error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # keep Python from failing again on the flush at exit
        os.close(devnull)


def error(prog: str, as_json: bool, kind: str, message: str, fix: str | None, code: int) -> int:
    """Report an error of program ``prog``: one line on stderr (and the fix); with ``as_json``, one JSON document
    ``{"error": {"type": kind, "message", "fix", "exit_code": code}}`` on stdout too.

    Returns:
        ``code``, for ``return error(...)``.
    """
    print(f"{prog}: error: {message}", file=sys.stderr)
    if fix:
        print(f"{prog}: fix: {fix}", file=sys.stderr)
    if as_json:
        out(json.dumps({"error": {"type": kind, "message": message, "fix": fix, "exit_code": code}}, indent=2))
    return code


def message_and_fix(exc: Exception) -> tuple[str, str | None]:
    """An error's message, and the fix it names after ``" Fix: "`` (None when it names none; the final period is
    dropped)."""
    text = str(exc).strip()
    head, sep, fix = text.partition(" Fix: ")
    return (head, fix.rstrip(".") or None) if sep else (text, None)


def error_of(prog: str, as_json: bool, exc: Exception, code: int, fix: str | None = None) -> int:
    """Report the exception ``exc`` with :func:`error`: its type name, its message, and the fix the message names
    (see :func:`message_and_fix`), else ``fix``.

    Returns:
        ``code``, for ``return error_of(...)``.
    """
    message, named = message_and_fix(exc)
    return error(prog, as_json, type(exc).__name__, message, named or fix, code)
