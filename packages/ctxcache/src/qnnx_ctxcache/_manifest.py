"""Entry manifests: what a build wrote, how to check it cheaply and fully."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import attrs

from qnnx_ctxcache._fs import sha256_file
from qnnx_ctxcache._key import canonical_json

__all__ = [
    "LAST_USED_NAME",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA_VERSION",
    "CheckResult",
    "check_entry",
    "collect_files",
    "inspect_context_model",
    "read_manifest",
]

MANIFEST_NAME = "manifest.json"
LAST_USED_NAME = ".last_used"
MANIFEST_FORMAT = "qnnx-ctxcache-entry"
MANIFEST_SCHEMA_VERSION = 1
_RESERVED = frozenset({MANIFEST_NAME, LAST_USED_NAME})

#: (inode, size, mtime_ns, ctime_ns) of a file. ctime cannot be set from user space, so a file rewritten
#: in place and given back its old mtime still gets a new signature.
Signature = tuple[int, int, int, int]


@attrs.frozen
class CheckResult:
    """Outcome of checking one entry. ``reason`` is empty when the entry is good."""

    reason: str = ""
    detail: str = ""
    manifest: Mapping[str, Any] | None = None
    signatures: Mapping[str, Signature] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        return not self.reason


def safe_relpath(rel: object) -> str | None:
    """Return ``rel`` when it is a relative POSIX path that stays inside its folder, else None."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel:
        return None
    pure = PurePosixPath(rel)
    if pure.is_absolute() or any(part in ("..", "") for part in pure.parts) or rel.startswith("/"):
        return None
    if len(pure.parts) and pure.parts[0] == ".":
        return None
    return pure.as_posix()


def inspect_context_model(directory: Path, model_file: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse a context model and list its EPContext nodes.

    Returns:
        ``(contexts, problems)``: one dict per EPContext node (name, embed_mode, file, source,
        ep_sdk_version, partition_name) and every problem found (all of them, not the first).
    """
    import onnx  # deferred: importing the package must stay cheap

    problems: list[str] = []
    path = directory / model_file
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ... depending on the damage
        return [], [f"model file {model_file!r} cannot be parsed as ONNX: {exc}"]
    contexts: list[dict[str, Any]] = []
    for index, node in enumerate(proto.graph.node):
        if node.op_type != "EPContext" or node.domain != "com.microsoft":
            continue
        attrs_ = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        embed_mode = int(attrs_.get("embed_mode", 1))
        info: dict[str, Any] = {
            "node": node.name or f"#{index}",
            "embed_mode": embed_mode,
            "file": None,
            "source": _text(attrs_.get("source")),
            "ep_sdk_version": _text(attrs_.get("ep_sdk_version")),
            "partition_name": _text(attrs_.get("partition_name")),
        }
        shared = int(attrs_.get("main_context", 1)) == 0 and attrs_.get("ep_cache_context") is None
        if embed_mode == 0 and not shared:
            # A model split between an EP and the CPU has one EPContext node per EP partition: the first
            # (main_context=1) names the binary, the others (main_context=0) are graphs inside that same binary
            # and reference no file (onnxruntime-qnn 2.7.0).
            raw = _text(attrs_.get("ep_cache_context"))
            # ORT resolves ep_cache_context relative to the folder of the ctx model, which may be a
            # sub-folder of the entry; record it relative to the entry root.
            model_dir = PurePosixPath(model_file).parent
            rel = safe_relpath(raw)
            if rel is not None:
                rel = safe_relpath((model_dir / rel).as_posix()) if str(model_dir) != "." else rel
            if rel is None:
                problems.append(
                    f"EPContext node {info['node']!r} references {raw!r}: not a relative path inside the "
                    "build directory"
                )
            else:
                target = directory / rel
                if target.is_symlink() or not target.is_file():
                    problems.append(f"EPContext node {info['node']!r} references {rel!r}, which is missing")
                elif target.stat().st_size == 0:
                    problems.append(f"EPContext node {info['node']!r} references {rel!r}, which is empty")
                info["file"] = rel
        contexts.append(info)
    return contexts, problems


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def collect_files(directory: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """List every regular file under ``directory`` with size, SHA-256 and mtime; flag anything else."""
    files: list[dict[str, Any]] = []
    problems: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        base = Path(dirpath)
        for name in sorted(dirnames):
            if (base / name).is_symlink():
                problems.append(f"{(base / name).relative_to(directory).as_posix()!r} is a symlink")
        for name in sorted(filenames):
            full = base / name
            rel = full.relative_to(directory).as_posix()
            if rel in _RESERVED:
                continue
            st = full.lstat()
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{rel!r} is not a regular file (symlinks and devices are not stored)")
                continue
            files.append({"path": rel, "size": st.st_size, "sha256": sha256_file(full), "mtime_ns": st.st_mtime_ns})
    files.sort(key=lambda f: f["path"])
    return files, problems


def read_manifest(entry_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """Load ``manifest.json``; return ``(manifest, "")`` or ``(None, reason)``."""
    path = entry_dir / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, "manifest:missing"
    except OSError as exc:
        return None, f"manifest:unreadable:{exc.errno}"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, "manifest:invalid-json"
    if not isinstance(data, dict):
        return None, "manifest:not-an-object"
    return data, ""


def check_entry(
    entry_dir: Path,
    key_hex: str,
    key_material: Mapping[str, Any] | None,
    *,
    full: bool,
    known: Mapping[str, Signature] | None = None,
) -> CheckResult:
    """Check one published entry.

    The cheap check (every hit): manifest parses, format/schema/key match, every listed file is a regular
    file inside the entry with the recorded size, every EPContext reference is listed. A file is hashed
    when ``full`` is set, when its signature differs from ``known`` (the signatures this process saw when
    it last verified the entry), or, with no ``known``, when its mtime differs from the manifest's.
    The result carries the signatures seen, for the caller's memo.
    """
    manifest, reason = read_manifest(entry_dir)
    if manifest is None:
        return CheckResult(reason)
    if manifest.get("format") != MANIFEST_FORMAT:
        return CheckResult("manifest:format", f"format={manifest.get('format')!r}")
    if manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        return CheckResult("manifest:schema", f"schema_version={manifest.get('schema_version')!r}")
    if manifest.get("key") != key_hex:
        return CheckResult("manifest:key", f"key={str(manifest.get('key'))[:16]!r}")
    stored_material = manifest.get("key_material")
    if key_material is not None:
        if stored_material != json.loads(json.dumps(dict(key_material))):
            return CheckResult("manifest:key-material", "stored key material differs from the requested key")
    elif (
        not isinstance(stored_material, dict) or hashlib.sha256(canonical_json(stored_material)).hexdigest() != key_hex
    ):
        # Without the caller's key (verify, CLI) the stored material must still hash to the entry's name.
        return CheckResult("manifest:key-material", "stored key material does not hash to the entry's key")
    if manifest.get("hash_algorithm") != "sha256":
        return CheckResult("manifest:hash-algorithm", f"hash_algorithm={manifest.get('hash_algorithm')!r}")
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return CheckResult("manifest:files", "no file list")
    listed: set[str] = set()
    signatures: dict[str, Signature] = {}
    root_real = os.path.realpath(entry_dir)
    for item in files:
        if not isinstance(item, dict):
            return CheckResult("manifest:files", "file record is not an object")
        rel = safe_relpath(item.get("path"))
        size, digest, mtime_ns = item.get("size"), item.get("sha256"), item.get("mtime_ns")
        if rel is None:
            return CheckResult("untrusted:path", f"path {item.get('path')!r} escapes the entry")
        if not isinstance(size, int) or not isinstance(digest, str) or len(digest) != 64:
            return CheckResult("manifest:files", f"bad size/sha256 for {rel!r}")
        full_path = entry_dir / rel
        real = os.path.realpath(full_path)
        if os.path.commonpath([root_real, real]) != root_real:
            return CheckResult("untrusted:path", f"{rel!r} resolves outside the entry")
        try:
            st = full_path.lstat()
        except FileNotFoundError:
            return CheckResult("corrupt:missing", f"{rel!r} is missing")
        except OSError as exc:
            return CheckResult("corrupt:unreadable", f"{rel!r}: {exc}")
        if not stat.S_ISREG(st.st_mode):
            return CheckResult("untrusted:not-regular", f"{rel!r} is not a regular file")
        if st.st_size != size:
            return CheckResult("corrupt:size", f"{rel!r} has {st.st_size} bytes, manifest says {size}")
        signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        signatures[rel] = signature
        must_hash = full or (known.get(rel) != signature if known is not None else st.st_mtime_ns != mtime_ns)
        if must_hash:
            try:
                actual = sha256_file(full_path)
            except OSError as exc:
                return CheckResult("corrupt:unreadable", f"{rel!r}: {exc}")
            if actual != digest:
                return CheckResult("corrupt:checksum", f"{rel!r} SHA-256 {actual[:16]}... != {digest[:16]}...")
        listed.add(rel)
    model_file = manifest.get("model_file")
    if model_file not in listed:
        return CheckResult("manifest:model-file", f"model_file {model_file!r} is not listed")
    contexts = manifest.get("ep_contexts")
    if not isinstance(contexts, list):
        return CheckResult("manifest:ep-contexts", "ep_contexts is not a list")
    for ctx in contexts:
        ref = ctx.get("file") if isinstance(ctx, dict) else None
        if ref is not None and ref not in listed:
            return CheckResult("corrupt:missing", f"EPContext file {ref!r} is not in the manifest")
    return CheckResult("", "", manifest, signatures)
