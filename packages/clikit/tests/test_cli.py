"""Parsing (usage errors exit 2), the error report (stderr, and JSON with --json), stdout and a closed pipe."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

import qnnx_clikit as clikit


def _parser() -> clikit.Parser:
    parser = clikit.Parser(prog="tool")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--version", action="version", version="%(prog)s 1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=clikit.Parser)
    sub.add_parser("go").add_argument("--soc-model", type=clikit.soc_model)
    return parser


def test_parse_args_returns_the_arguments() -> None:
    args = clikit.parse_args(_parser(), ["--count", "3", "go", "--soc-model", "SM8650"])
    assert isinstance(args, argparse.Namespace)
    assert (args.count, args.command, args.soc_model, args.json) == (3, "go", 57, False)


def test_parse_args_reads_sys_argv_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["tool", "--count", "5"])
    args = clikit.parse_args(_parser())
    assert isinstance(args, argparse.Namespace) and args.count == 5


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["go", "--help"]])
def test_help_and_version_return_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert clikit.parse_args(_parser(), argv) == 0
    assert "tool" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--no-such-flag"], ["--count", "x"], ["go", "--soc-model", "banana"]])
def test_a_usage_error_returns_2_and_is_reported(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The usage, then `tool: error: ...` and `tool: fix: see `tool --help``, all on stderr; nothing on stdout."""
    assert clikit.parse_args(_parser(), argv) == clikit.EXIT_USAGE == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    usage, error, fix = captured.err.strip().splitlines()[-3:]
    assert usage.startswith("usage: tool") and error.startswith("tool: error: ")
    assert fix == "tool: fix: see `tool --help`"


def test_a_usage_error_with_json_is_a_json_document_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert clikit.parse_args(_parser(), ["--json", "--count", "x"]) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert error == {
        "type": "UsageError",
        "message": "argument --count: invalid int value: 'x'",
        "fix": "see `tool --help`",
        "exit_code": 2,
    }
    assert f"tool: error: {error['message']}" in captured.err


@pytest.mark.parametrize("fix", ["do this", None])
def test_error_writes_stderr_and_returns_the_code(fix: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert clikit.error("tool", False, "OSError", "it broke", fix, 3) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "tool: error: it broke\n" + (f"tool: fix: {fix}\n" if fix else "")


def test_error_with_json_prints_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert clikit.error("tool", True, "ModelLoadError", "no such file", None, 3) == 3
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc == {"error": {"type": "ModelLoadError", "message": "no such file", "fix": None, "exit_code": 3}}
    assert captured.out == json.dumps(doc, indent=2) + "\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("it broke. Fix: reinstall it.", ("it broke.", "reinstall it")),
        ("  it broke  ", ("it broke", None)),
        ("it broke. Fix: ", ("it broke. Fix:", None)),
        ("a. Fix: b. Fix: c.", ("a.", "b. Fix: c")),
    ],
)
def test_message_and_fix(text: str, expected: tuple[str, str | None]) -> None:
    assert clikit.message_and_fix(ValueError(text)) == expected


def test_out_survives_a_reader_that_left() -> None:
    """`tool | head -c 1`: the writer exits 0 with nothing on stderr (no BrokenPipeError traceback)."""
    code = "import qnnx_clikit\nfor _ in range(50):\n    qnnx_clikit.out('x' * 100_000)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1) == b"x"
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, stderr
    assert stderr == b""


def test_importing_does_no_work_and_needs_only_the_standard_library() -> None:
    """No module outside the standard library, and the name lookup table is built on first use."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import qnnx_clikit, qnnx_clikit._soc as soc\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'qnnx_clikit'}), soc._numbers_by_name.cache_info().currsize)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["[]", "0"]


def test_run_main_runs_the_command_or_returns_the_parse_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert clikit.run_main(_parser(), ["--count", "4"], lambda args: args.count + 10) == 14
    assert clikit.run_main(_parser(), ["--version"], lambda args: 99) == 0
    assert clikit.run_main(_parser(), ["--count", "x"], lambda args: 99) == clikit.EXIT_USAGE
    assert "tool: error:" in capsys.readouterr().err


def test_error_of_reports_the_type_the_message_and_the_named_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert clikit.error_of("tool", True, ValueError("bad value. Fix: pass a good one."), 3) == 3
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["tool: error: bad value.", "tool: fix: pass a good one"]
    assert json.loads(captured.out)["error"] == {
        "type": "ValueError",
        "message": "bad value.",
        "fix": "pass a good one",
        "exit_code": 3,
    }
    clikit.error_of("tool", False, KeyError("k"), 1, fix="the fallback fix")
    assert capsys.readouterr().err.splitlines() == ["tool: error: 'k'", "tool: fix: the fallback fix"]


def test_command_parser_prints_its_epilog_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    parser = clikit.command_parser("tool", "Do one thing.", "examples:\n  tool --x\n  tool --y")
    assert isinstance(parser, clikit.Parser) and parser.prog == "tool"
    assert clikit.parse_args(parser, ["--help"]) == 0
    help_text = capsys.readouterr().out
    assert "Do one thing." in help_text and "examples:\n  tool --x\n  tool --y" in help_text
