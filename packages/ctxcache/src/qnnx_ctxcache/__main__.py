"""Command line tool ``qnnx-ctxcache``: look at, check, trim and ship a context cache.

Exit codes: 0 success; 1 ``verify`` found bad entries; 2 usage error (a bad option or value, a key prefix shorter
than 4 hex digits); 3 error: the cache root is missing or not a cache, a key prefix matches no entry or several,
a refusal (``clear`` outside a cache root, a damaged or unsafe archive, a pinned entry) or an I/O error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from qnnx_clikit import Parser, command_parser, error, error_of, message_and_fix, out, run_main, soc_model
from qnnx_ctxcache._key import diff_key_material
from qnnx_ctxcache._layout import ROOT_MARKER, default_root, is_key_prefix
from qnnx_ctxcache._options import StoreOptions
from qnnx_ctxcache._results import PackReport, UnpackReport
from qnnx_ctxcache._store import ContextStore
from qnnx_ctxcache._version import __version__
from qnnx_ctxcache.errors import InvalidOptionsError, NotACacheRootError, QnnxCtxcacheError

__all__ = ["main"]

PROG = "qnnx-ctxcache"
EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_ERROR = 3

_EPILOG = """\
examples:
  qnnx-ctxcache dir
  qnnx-ctxcache ls --json
  qnnx-ctxcache verify --full            # exit 1 when an entry is corrupt
  qnnx-ctxcache prune --max-size 2GiB --dry-run
  qnnx-ctxcache --root /data/ctx inspect 3fa9
  qnnx-ctxcache explain 3fa9 81c0         # which key fields differ between two entries
  qnnx-ctxcache compile model.onnx --soc-model SC8380XP --dim batch=1   # prebuild on a build host
  qnnx-ctxcache pack contexts.tar.gz      # every entry in one archive, to ship with an app
  qnnx-ctxcache pack sm8650.tgz --soc-model SM8650   # only the contexts compiled for one chip
  qnnx-ctxcache unpack contexts.tar.gz    # on each machine; exit 3 (nothing added) if it is damaged

exit codes:
  0  ok
  1  verify found bad entries
  2  usage error (bad option or value, a key prefix shorter than 4 hex digits)
  3  error: the cache root is missing or not a cache, a key prefix matches no entry or several, a refusal
     (clear outside a cache root, a damaged or unsafe archive, a pinned entry), an I/O error, or for compile: no
     onnxruntime-qnn, or the QNN compile failed
errors: one line on stderr; with --json, also {"error": {"type", "message", "fix", "exit_code"}} on stdout
environment: QNNX_CTXCACHE_DIR (default root), QNNX_CTXCACHE_MODE (readwrite|readonly|disabled),
  QNNX_CTXCACHE_SALT (mixed into every key), QNNX_CTXCACHE_RECACHE=1 (rebuild each key once)
"""

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}  # fmt: skip


def parse_size(text: str) -> int:
    """Parse ``"10GiB"``, ``"500MB"``, ``"0"`` into bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}; use e.g. 500MB, 10GiB or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return _jsonable(attrs.asdict(value, recurse=False))
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    out(json.dumps(_jsonable(payload), indent=1, sort_keys=True) if args.json else text)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _ago(ts: float) -> str:
    delta = max(0.0, time.time() - ts)
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= seconds:
            return f"{delta / seconds:.0f}{unit} ago"
    return f"{delta:.0f}s ago"


def _seconds(text: str) -> float:
    """A number of seconds >= 0, for argparse (a bad value exits 2 with the accepted form)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0 (e.g. 600 or 0.5)")
    return value


def _key_prefix(text: str) -> str:
    """A full key or a prefix of at least 4 hex digits, for argparse (anything else exits 2)."""
    if not is_key_prefix(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a key; use a full key or a prefix of at least 4 hex digits (see `qnnx-ctxcache ls`)"
        )
    return text


class _Failure(Exception):
    """A command that cannot do what was asked (exit 3): the message, and what to do about it."""

    def __init__(self, message: str, fix: str | None, kind: str = "CommandError") -> None:
        super().__init__(message)
        self.fix = fix
        self.kind = kind


def _parser() -> argparse.ArgumentParser:
    parser = command_parser(
        PROG, "Inspect and maintain a qnnx-ctxcache store of compiled ONNX Runtime EP contexts.", _EPILOG
    )
    parser.add_argument("--root", type=Path, default=None, help="cache root (default: $QNNX_CTXCACHE_DIR or per-user)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--json", action="store_true", help="machine-readable output (also after the command)")
    common = Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    soc = Parser(add_help=False)
    soc.add_argument(
        "--soc-model",
        type=soc_model,
        metavar="SOC",
        help="only entries compiled for this SoC: a QNN SoC number or a chip name, e.g. 60 or SC8380XP, SM8650",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    sub.add_parser("dir", parents=[common], help="print the cache root")
    sub.add_parser("ls", parents=[common, soc], help="list entries, least recently used first")
    sub.add_parser("stats", parents=[common], help="sizes and counters")
    p = sub.add_parser("inspect", parents=[common], help="show one entry's manifest (key material, files)")
    p.add_argument("key", type=_key_prefix, help="full key or a unique prefix (>= 4 hex chars)")
    p = sub.add_parser("explain", parents=[common], help="show why two entries have different keys")
    p.add_argument("key_a", type=_key_prefix, help="key or unique prefix")
    p.add_argument("key_b", type=_key_prefix, help="key or unique prefix")
    p = sub.add_parser("verify", parents=[common], help="check entries; exit 1 if any is bad")
    p.add_argument("--full", action="store_true", help="hash every file (catches overwritten bytes)")
    p.add_argument("--fix", action="store_true", help="move bad entries to quarantine")
    p = sub.add_parser("prune", parents=[common], help="evict least recently used entries over a size")
    p.add_argument("--max-size", type=parse_size, default=None, help="target size, e.g. 2GiB (default: 10GiB)")
    p.add_argument("--min-age", type=_seconds, default=None, help="grace period in seconds (default 600)")
    p.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    p = sub.add_parser("rm", parents=[common], help="delete one entry")
    p.add_argument("key", type=_key_prefix, help="full key or a unique prefix (>= 4 hex chars)")
    sub.add_parser("clear", parents=[common], help="delete every entry (only in a directory with the root marker)")
    p = sub.add_parser(
        "compile", parents=[common], help="compile an ONNX model for QNN into the cache (needs onnxruntime-qnn)"
    )
    p.add_argument("model", type=Path, metavar="MODEL", help="the .onnx file")
    p.add_argument("--device", choices=("npu", "htp", "gpu"), default="npu", help="QNN device (default npu)")
    p.add_argument("--soc-model", type=soc_model, metavar="SOC", help="target SoC: 60, SC8380XP, SM8650, ...")
    p.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=N", help="free dim size (repeat)")
    p.add_argument("--option", type=_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="QNN provider option (repeat)")  # fmt: skip
    p.add_argument("--config", type=_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="session config entry, e.g. session.disable_cpu_ep_fallback=1 (repeat)")  # fmt: skip
    p = sub.add_parser("pack", parents=[common, soc], help="write entries into one archive to install elsewhere")
    p.add_argument(
        "archive",
        type=Path,
        metavar="ARCHIVE",
        help="archive to write; a name ending in .gz or .tgz is gzip-compressed",
    )
    p.add_argument(
        "keys", nargs="*", type=_key_prefix, metavar="KEY", help="full keys or unique prefixes (default: all)"
    )
    p = sub.add_parser("unpack", parents=[common], help="check an archive from `pack`, then add its entries")
    p.add_argument("archive", type=Path, metavar="ARCHIVE", help="archive written by `qnnx-ctxcache pack`")
    return parser


def _pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` for ``--option`` / ``--config``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE; accepted: e.g. htp_graph_finalization_optimization_mode=3"
        )
    return key.strip(), value.strip()


def _dim(text: str) -> tuple[str, int]:
    """``NAME=N`` for ``--dim``: a free dimension and its positive size."""
    key, value = _pair(text) if "=" in text else ("", "")
    if not key or not (value.isascii() and value.isdecimal() and int(value) >= 1):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=N; accepted: a dim name and a positive size, e.g. batch=1"
        )
    return key, int(value)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """The HTP simulator prints a line on file descriptor 1 at the first session of a process: keep stdout ours."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _compile(args: argparse.Namespace, root: Path) -> int:
    try:
        from qnnx_ctxcache.ort import compile_model

        started = time.monotonic()
        with _stdout_to_stderr():
            entry = compile_model(
                args.model,
                device=args.device,
                soc_model=args.soc_model,
                free_dims=dict(args.dim),
                provider_options=dict(args.option),
                session_options=dict(args.config),
                cache_dir=root,
            )
    except InvalidOptionsError as exc:
        return error_of(PROG, args.json, exc, EXIT_USAGE)
    except ImportError as exc:
        return error(PROG, args.json, "ImportError", *message_and_fix(exc), EXIT_ERROR)
    except (QnnxCtxcacheError, OSError):
        raise
    except Exception as exc:  # the QNN compile failed: onnxruntime's own error
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fix = "check the model with `qnnx-opcheck MODEL` (and its --dim flags) to see which nodes QNN refuses"
        return error(PROG, args.json, type(exc).__name__, f"compiling {args.model} failed: {message}", fix, EXIT_ERROR)
    seconds = time.monotonic() - started
    state = (
        "already cached" if entry.hit else ("compiled" if entry.persisted else f"compiled, not cached ({entry.reason})")
    )
    info = {"key": entry.key.hex, "hit": entry.hit, "persisted": entry.persisted, "reason": entry.reason,
            "model_path": str(entry.model_path), "seconds": round(seconds, 3)}  # fmt: skip
    _emit(args, info, f"{state}: {entry.key.hex[:16]}  {entry.model_path}  ({seconds:.2f} s)")
    return EXIT_OK if entry.persisted else EXIT_ERROR


_ROOT_FIX = (
    "pass --root (or set QNNX_CTXCACHE_DIR) to a cache directory; `qnnx-ctxcache dir` prints the default, and a "
    "cache is created by the first compile with cache=True or by `qnnx-ctxcache unpack`"
)


def _open_existing(root: Path) -> ContextStore:
    """The store at ``root`` for a command that reads or trims it; never creates a cache where there is none."""
    if not root.exists():
        raise _Failure(f"cache root {root} does not exist", _ROOT_FIX, "NotACacheRootError")
    if not root.is_dir():
        raise _Failure(f"cache root {root} is a file, not a directory", _ROOT_FIX, "NotACacheRootError")
    if not (root / ROOT_MARKER).is_file():
        raise _Failure(
            f"{root} is not a qnnx-ctxcache root (no {ROOT_MARKER} marker)",
            "pass the directory printed by `qnnx-ctxcache dir`",
            "NotACacheRootError",
        )
    return ContextStore(root, options=StoreOptions(mode="auto"))


def _resolve(store: ContextStore, prefix: str) -> str:
    """The one entry key starting with ``prefix`` (already checked to be >= 4 hex digits)."""
    matches = sorted(info.key for info in store.entries() if info.key.startswith(prefix.lower()))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise _Failure(
            f"no entry under {store.root} has a key starting with {prefix!r}",
            "pick a key from `qnnx-ctxcache ls`",
            "EntryNotFoundError",
        )
    shown = ", ".join(k[:16] for k in matches[:5]) + (" ..." if len(matches) > 5 else "")
    raise _Failure(
        f"{prefix!r} is ambiguous: {len(matches)} entries under {store.root} have keys starting with it ({shown})",
        "give more hex digits of the key, or the full key",
        "EntryNotFoundError",
    )


def _soc_of(store: ContextStore, key: str) -> int | None:
    """The SoC an entry was compiled for (its key's target, else its EP options), when the key says."""
    info = store.inspect(key)
    material = (info.key_material if info is not None else None) or {}
    for place in (material.get("target"), material.get("ep_options")):
        if isinstance(place, dict) and str(place.get("soc_model", "")).isdecimal():
            return int(place["soc_model"])
    return None


def _pack_text(report: PackReport) -> str:
    lines = [
        f"packed {len(report.entries)} entries into {report.archive} ({_human(report.size_bytes)}, "
        f"compression {report.compression})",
        f"sha256 {report.sha256}",
    ]
    lines += [f"skipped {p.key[:16]}  {p.reason}  {p.detail}" for p in report.skipped]
    return "\n".join(lines)


def _unpack_text(report: UnpackReport) -> str:
    lines = [
        f"added {len(report.added)}, already present {len(report.already_present)}, skipped "
        f"{len(report.skipped)} from {report.archive} (packed by qnnx-ctxcache {report.packed_by})"
    ]
    lines += [f"skipped {p.key[:16]}  {p.reason}  {p.detail}" for p in report.skipped]
    if report.other_host:
        lines.append(
            f"note: {len(report.other_host)} entries were compiled on another OS or CPU (the host in their key); "
            "lookups on this machine never return them"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see ``--help``)."""
    return run_main(_parser(), argv, _reported)


def _reported(args: argparse.Namespace) -> int:
    """Run the command; a refusal or a failure is reported in the common error form."""
    try:
        return _run(args)
    except _Failure as exc:
        return error(PROG, args.json, exc.kind, str(exc), exc.fix, EXIT_ERROR)
    except (QnnxCtxcacheError, OSError) as exc:
        return error_of(PROG, args.json, exc, EXIT_ERROR)


def _run(args: argparse.Namespace) -> int:
    root = args.root if args.root is not None else default_root()
    command = args.command

    if command == "dir":
        _emit(args, {"root": str(root), "is_cache_root": (root / ROOT_MARKER).is_file()}, str(root))
        return EXIT_OK
    if command == "clear":
        if not (root / ROOT_MARKER).is_file():
            raise NotACacheRootError(str(root))
        removed = ContextStore(root).clear()
        _emit(args, {"removed": removed}, f"removed {removed} entries from {root}")
        return EXIT_OK
    if command == "compile":
        return _compile(args, root)  # creates the cache on a fresh build host
    if command == "unpack":
        unpacked = ContextStore(root).unpack(args.archive)  # creates the cache on a fresh machine
        _emit(args, unpacked, _unpack_text(unpacked))
        return EXIT_OK

    store = _open_existing(root)
    if command == "pack":
        keys = [_resolve(store, k) for k in args.keys] or None
        if args.soc_model is not None:
            keys = [k for k in (keys or [i.key for i in store.entries()]) if _soc_of(store, k) == args.soc_model]
            if not keys:
                raise _Failure(
                    f"no entry under {root} was compiled for soc_model {args.soc_model}",
                    "see the SoC of each entry with `qnnx-ctxcache inspect KEY` (key_material.target)",
                    "EntryNotFoundError",
                )
        packed = store.pack(args.archive, keys)
        _emit(args, packed, _pack_text(packed))
        return EXIT_OK
    if command == "ls":
        infos = store.entries()
        if args.soc_model is not None:
            infos = [i for i in infos if _soc_of(store, i.key) == args.soc_model]
        lines = [f"{i.key[:16]}  {_human(i.size_bytes):>10}  used {_ago(i.last_used)}{'  pinned' if i.pinned else ''}"
                 for i in infos]  # fmt: skip
        _emit(args, {"entries": infos}, "\n".join(lines) if lines else f"no entries in {root}")
        return EXIT_OK
    if command == "stats":
        s = store.stats()
        text = (
            f"root: {s.root}\nmode: {s.mode}\nentries: {s.entries}\nsize: {_human(s.total_bytes)} of "
            f"{_human(s.max_size_bytes)}\nquarantined: {s.quarantined}\nstaging: {s.staging}\n"
            + "".join(f"{k}: {v}\n" for k, v in sorted(s.totals.items()))
        ).rstrip()
        _emit(args, s, text)
        return EXIT_OK
    if command == "explain":
        keys = [_resolve(store, args.key_a), _resolve(store, args.key_b)]
        material = [info.key_material if info is not None else None for info in map(store.inspect, keys)]
        first, second = material
        if first is None or second is None:
            unreadable = [k[:16] for k, m in zip(keys, material) if m is None]
            raise _Failure(
                f"entry {', '.join(unreadable)} has no readable key material",
                "check it with `qnnx-ctxcache verify --full` (and --fix to quarantine it)",
            )
        lines = diff_key_material(first, second)
        _emit(args, {"differences": lines}, "\n".join(lines) if lines else "identical key material")
        return EXIT_OK
    if command in ("inspect", "rm"):
        key = _resolve(store, args.key)
        if command == "inspect":
            details = store.inspect(key)
            info = details.to_dict() if details is not None else None
            _emit(args, info, json.dumps(info, indent=1, sort_keys=True))
            return EXIT_OK
        if store.mode != "readwrite":
            raise _Failure(f"{root} is not writable (mode {store.mode})", "run as a user who may write the cache")
        if not store.remove(key):
            raise _Failure(f"could not remove {key}: a process is using it", "try again when it is done")
        _emit(args, {"removed": [key]}, f"removed {key}")
        return EXIT_OK
    if command == "verify":
        report = store.verify(full=args.full, fix=args.fix)
        lines = [f"{p.key[:16]}  {p.reason}  {p.detail}" for p in report.problems]
        lines += [f"junk: {j}" for j in report.junk]
        lines.append(f"checked {report.checked} entries ({'full' if report.full else 'cheap'}): "
                     f"{len(report.problems)} bad, {len(report.quarantined)} quarantined")  # fmt: skip
        _emit(args, {**attrs.asdict(report, recurse=True), "ok": report.ok}, "\n".join(lines))
        return EXIT_OK if report.ok else EXIT_PROBLEM
    if command == "prune":
        pruned = store.prune(args.max_size, min_age_seconds=args.min_age, dry_run=args.dry_run)
        verb = "would remove" if pruned.dry_run else "removed"
        text = (
            f"{verb} {len(pruned.removed)} entries ({_human(pruned.freed_bytes)}); "
            f"size {_human(pruned.total_bytes_before)} -> {_human(pruned.total_bytes_after)}"
            + (f"; kept {len(pruned.kept_pinned)} pinned" if pruned.kept_pinned else "")
            + (f"; kept {len(pruned.kept_young)} within the grace period" if pruned.kept_young else "")
            + ("; another process is pruning, skipped" if pruned.skipped else "")
        )
        _emit(args, pruned, text)
        return EXIT_OK
    raise AssertionError(f"unknown command {command!r}")  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
