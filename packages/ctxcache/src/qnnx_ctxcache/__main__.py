"""Command line tool ``qnnx-ctxcache``: look at, check, trim and ship a context cache.

Exit codes: 0 success; 1 problems found (``verify``), entry not found (``inspect``/``rm``/``pack``) or refusal
(``clear`` on a directory that is not a cache root, ``unpack`` of a damaged or unsafe archive); 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from qnnx_ctxcache._key import diff_key_material
from qnnx_ctxcache._store import (
    ROOT_MARKER,
    ContextStore,
    PackReport,
    StoreOptions,
    UnpackReport,
    default_root,
    is_key_prefix,
)
from qnnx_ctxcache._version import __version__
from qnnx_ctxcache.errors import CtxCacheError, NotACacheRootError

__all__ = ["main"]

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

_EPILOG = """\
examples:
  qnnx-ctxcache dir
  qnnx-ctxcache ls --json
  qnnx-ctxcache verify --full            # exit 1 when an entry is corrupt
  qnnx-ctxcache prune --max-size 2GiB --dry-run
  qnnx-ctxcache --root /data/ctx inspect 3fa9
  qnnx-ctxcache explain 3fa9 81c0         # which key fields differ between two entries
  qnnx-ctxcache pack contexts.tar.gz      # every entry in one archive, to ship with an app
  qnnx-ctxcache unpack contexts.tar.gz    # on each machine; exit 1 (nothing added) if it is damaged

exit codes: 0 ok, 1 problems found / not found / refused, 2 usage error
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
    if args.json:
        print(json.dumps(_jsonable(payload), indent=1, sort_keys=True))
    else:
        print(text)


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qnnx-ctxcache",
        description="Inspect and maintain a qnnx-ctxcache store of compiled ONNX Runtime EP contexts.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", type=Path, default=None, help="cache root (default: $QNNX_CTXCACHE_DIR or per-user)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("dir", parents=[common], help="print the cache root")
    sub.add_parser("ls", parents=[common], help="list entries, least recently used first")
    sub.add_parser("stats", parents=[common], help="sizes and counters")
    p = sub.add_parser("inspect", parents=[common], help="show one entry's manifest (key material, files)")
    p.add_argument("key", help="full key or a unique prefix (>= 4 hex chars)")
    p = sub.add_parser("explain", parents=[common], help="show why two entries have different keys")
    p.add_argument("key_a", help="key or unique prefix")
    p.add_argument("key_b", help="key or unique prefix")
    p = sub.add_parser("verify", parents=[common], help="check entries; exit 1 if any is bad")
    p.add_argument("--full", action="store_true", help="hash every file (catches overwritten bytes)")
    p.add_argument("--fix", action="store_true", help="move bad entries to quarantine")
    p = sub.add_parser("prune", parents=[common], help="evict least recently used entries over a size")
    p.add_argument("--max-size", type=parse_size, default=None, help="target size, e.g. 2GiB (default: 10GiB)")
    p.add_argument("--min-age", type=_seconds, default=None, help="grace period in seconds (default 600)")
    p.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    p = sub.add_parser("rm", parents=[common], help="delete one entry")
    p.add_argument("key", help="full key or a unique prefix (>= 4 hex chars)")
    sub.add_parser("clear", parents=[common], help="delete every entry (only in a directory with the root marker)")
    p = sub.add_parser("pack", parents=[common], help="write entries into one archive to install elsewhere")
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


def _open_existing(root: Path, args: argparse.Namespace) -> ContextStore:
    # Maintenance commands must not create a cache where there is none: open read-only unless it exists.
    mode = "auto" if (root / ROOT_MARKER).is_file() else "readonly"
    return ContextStore(root, options=StoreOptions(mode=mode))


def _refuse(args: argparse.Namespace, exc: Exception) -> int:
    """Report an error on stderr (and as JSON on stdout with --json); exit code 1."""
    message = str(exc)
    print(f"error: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"error": message, "type": type(exc).__name__}, indent=1, sort_keys=True))
    return EXIT_PROBLEM


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
    """Run the CLI; returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    root = args.root if args.root is not None else default_root()
    command = args.command

    if command == "dir":
        _emit(args, {"root": str(root), "is_cache_root": (root / ROOT_MARKER).is_file()}, str(root))
        return EXIT_OK
    if command == "clear":
        if not (root / ROOT_MARKER).is_file():
            message = str(NotACacheRootError(str(root)))
            _emit(args, {"error": message, "removed": 0}, f"error: {message}")
            return EXIT_PROBLEM
        store = ContextStore(root)
        removed = store.clear()
        _emit(args, {"removed": removed}, f"removed {removed} entries from {root}")
        return EXIT_OK
    if command == "unpack":
        try:
            unpacked = ContextStore(root).unpack(args.archive)  # creates the cache on a fresh machine
        except (CtxCacheError, OSError) as exc:
            return _refuse(args, exc)
        _emit(args, unpacked, _unpack_text(unpacked))
        return EXIT_OK

    store = _open_existing(root, args)
    if command == "pack":
        try:
            packed = store.pack(args.archive, args.keys or None)
        except (CtxCacheError, OSError) as exc:
            return _refuse(args, exc)
        _emit(args, packed, _pack_text(packed))
        return EXIT_OK
    if command == "ls":
        infos = store.entries()
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
        keys = [store.resolve(args.key_a), store.resolve(args.key_b)]
        pair = [store.inspect(k) if k else None for k in keys]
        if not all(info and "key_material" in info for info in pair):
            message = f"need two readable entries; got {args.key_a!r} -> {keys[0]}, {args.key_b!r} -> {keys[1]}"
            _emit(args, {"error": message}, f"error: {message}")
            return EXIT_PROBLEM
        lines = diff_key_material(pair[0]["key_material"], pair[1]["key_material"])  # type: ignore[index]
        _emit(args, {"differences": lines}, "\n".join(lines) if lines else "identical key material")
        return EXIT_OK
    if command in ("inspect", "rm"):
        key = store.resolve(args.key)
        if key is None:
            message = f"no single entry matches {args.key!r} under {root}; see `qnnx-ctxcache ls`"
            _emit(args, {"error": message}, f"error: {message}")
            return EXIT_PROBLEM
        if command == "inspect":
            info = store.inspect(key)
            _emit(args, info, json.dumps(info, indent=1, sort_keys=True))
            return EXIT_OK
        if store.mode != "readwrite":
            _emit(args, {"error": f"{root} is not writable"}, f"error: {root} is not writable")
            return EXIT_PROBLEM
        ok = store.remove(key)
        _emit(args, {"removed": [key] if ok else []}, f"removed {key}" if ok else f"could not remove {key} (pinned?)")
        return EXIT_OK if ok else EXIT_PROBLEM
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
    return EXIT_USAGE  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
