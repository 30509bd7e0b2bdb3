"""Archives of cache entries: the format :meth:`ContextStore.pack` writes and :meth:`ContextStore.unpack` checks.

An archive is a tar file (optionally gzip-compressed) holding regular files only, in this order::

    qnnx-ctxcache-archive.json        the archive manifest (always the first member)
    entries/<key>/manifest.json       each entry's own manifest, byte for byte
    entries/<key>/<path>              every file that manifest lists

No directories, links or devices. The archive manifest records, per entry, the key, a summary of its key
material and the size and SHA-256 of the entry manifest and of every file. It is stored exactly as
:func:`encode_manifest` writes it and carries a checksum of its values, so any changed byte in it is caught
(this guards against damage, not deliberate tampering: there is no signature).
Reading is streamed and refuses anything the archive manifest does not list, before the caller publishes
anything. This module only knows the format; the store does the pinning, entry checks and publishing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._fs import sha256_file
from qnnx_ctxcache._key import canonical_json
from qnnx_ctxcache._manifest import LAST_USED_NAME, MANIFEST_NAME, safe_relpath
from qnnx_ctxcache._version import __version__
from qnnx_ctxcache.errors import ARCHIVE_DAMAGED_FIX, ArchiveError, InvalidOptionsError

__all__ = [
    "ARCHIVE_FORMAT",
    "ARCHIVE_FORMAT_VERSION",
    "ARCHIVE_MANIFEST_NAME",
    "COMPRESSIONS",
    "ArchiveContents",
    "PackItem",
    "encode_manifest",
    "entry_mismatch",
    "extract_archive",
    "key_summary",
    "manifest_checksum",
    "wants_gzip",
    "write_archive",
]

ARCHIVE_FORMAT = "qnnx-ctxcache-archive"
#: Bump when the layout changes in a way an older reader would misread; readers refuse versions they do not know.
ARCHIVE_FORMAT_VERSION = 1
_READABLE_VERSIONS = (1,)
ARCHIVE_MANIFEST_NAME = "qnnx-ctxcache-archive.json"
#: ``auto`` compresses when the archive name ends in ``.gz`` or ``.tgz``.
COMPRESSIONS = ("auto", "gz", "none")
_ENTRIES = "entries"
_SUMMARY_FIELDS = ("ep_name", "model_digest", "target", "versions", "host")
_MAX_MANIFEST_BYTES = 64 * 2**20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
_UNTRUSTED_FIX = (
    "do not use this archive: `qnnx-ctxcache pack` never writes such a member; pack again on the build host"
)


@attrs.frozen(kw_only=True)
class PackItem:
    """One checked entry to pack: its directory, manifest bytes as stored and the parsed manifest."""

    key: str
    entry_dir: Path
    manifest_bytes: bytes
    manifest: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class ArchiveContents:
    """What an extracted archive declared: who packed it, when, and one record per entry (in order)."""

    packed_by: str
    created: float
    records: tuple[Mapping[str, Any], ...]


@attrs.frozen
class _Want:
    """What the archive manifest says one member must be."""

    key: str
    path: str
    size: int
    sha256: str


def key_summary(material: Mapping[str, Any]) -> dict[str, Any]:
    """The key material fields an operator needs to see which machines an entry is for."""
    return {name: material.get(name) for name in _SUMMARY_FIELDS}


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of an archive manifest without its ``checksum`` field."""
    return hashlib.sha256(canonical_json({k: v for k, v in manifest.items() if k != "checksum"})).hexdigest()


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """The exact bytes of an archive manifest (format 1): a reader refuses any other spelling of the same values."""
    return json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False).encode("utf-8")


def _file_triples(files: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, str]]:
    return sorted((f["path"], f["size"], f["sha256"]) for f in files)


def entry_mismatch(record: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
    """Why an entry manifest (already checked by ``check_entry``) disagrees with its archive record, or ``""``."""
    if _file_triples(record["files"]) != _file_triples(manifest["files"]):
        return "its manifest lists other files, sizes or SHA-256s than the archive manifest"
    if record["key_material"] != key_summary(manifest["key_material"]):
        return "the key material summary in the archive manifest differs from the entry's key material"
    return ""


# ---------------------------------------------------------------------------------------------------- writing
def wants_gzip(target: Path, compression: str) -> bool:
    """Whether to gzip ``target``; raises InvalidOptionsError for an unknown ``compression``."""
    if compression not in COMPRESSIONS:
        raise InvalidOptionsError(
            f"compression must be one of {COMPRESSIONS}, got {compression!r}; fix: pass 'gz' or 'none', or "
            "'auto' to compress archives named *.tar.gz or *.tgz"
        )
    if compression == "auto":
        return target.name.endswith((".gz", ".tgz"))
    return compression == "gz"


def _member(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = int(mtime)
    info.mode = 0o644
    info.type = tarfile.REGTYPE
    return info


def _record(item: PackItem) -> dict[str, Any]:
    return {
        "key": item.key,
        "key_material": key_summary(item.manifest["key_material"]),
        "manifest": {"size": len(item.manifest_bytes), "sha256": hashlib.sha256(item.manifest_bytes).hexdigest()},
        "files": [{"path": f["path"], "size": f["size"], "sha256": f["sha256"]} for f in item.manifest["files"]],
    }


def write_archive(
    target: Path, items: Sequence[PackItem], *, created: float, gz: bool, durable: bool
) -> tuple[int, str]:
    """Write an archive of ``items`` through a temp file beside ``target`` and one rename.

    Returns:
        ``(size in bytes, SHA-256 of the archive file)``.
    """
    manifest: dict[str, Any] = {
        "format": ARCHIVE_FORMAT,
        "format_version": ARCHIVE_FORMAT_VERSION,
        "ctxcache_version": __version__,
        "created": created,
        "hash_algorithm": "sha256",
        "entries": [_record(item) for item in items],
    }
    manifest["checksum"] = manifest_checksum(manifest)
    data = encode_manifest(manifest)
    tmp = target.with_name(f".{target.name}.{_fs.unique_suffix()}.tmp")
    try:
        with tmp.open("xb") as raw:
            # zlib's default level 6; tarfile's default 9 is slower for little gain.
            options: dict[str, Any] = {"compresslevel": 6} if gz else {}
            mode: Literal["w:gz", "w"] = "w:gz" if gz else "w"
            with tarfile.open(target.name, mode, fileobj=raw, format=tarfile.PAX_FORMAT, **options) as tar:
                tar.addfile(_member(ARCHIVE_MANIFEST_NAME, len(data), created), io.BytesIO(data))
                for item in items:
                    base = f"{_ENTRIES}/{item.key}"
                    info = _member(f"{base}/{MANIFEST_NAME}", len(item.manifest_bytes), created)
                    tar.addfile(info, io.BytesIO(item.manifest_bytes))
                    for f in item.manifest["files"]:
                        with (item.entry_dir / f["path"]).open("rb") as fh:
                            tar.addfile(_member(f"{base}/{f['path']}", f["size"], created), fh)
            raw.flush()
            if durable:
                os.fsync(raw.fileno())
        size, digest = tmp.stat().st_size, sha256_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        _fs.fsync_dir(target.parent)
    return size, digest


# ---------------------------------------------------------------------------------------------------- reading
@contextlib.contextmanager
def _reading(archive: Path) -> Iterator[None]:
    """Turn any failure to read the archive (truncated, not a tar, bad gzip data) into an ArchiveError."""
    try:
        yield
    except ArchiveError:
        raise
    except Exception as exc:  # tarfile.ReadError, EOFError, zlib.error, OSError, lzma.LZMAError...
        raise ArchiveError(
            str(archive),
            f"it cannot be read as a tar archive ({type(exc).__name__}: {exc}); it is damaged or truncated",
        ) from exc


def _digest_problem(item: object, what: str) -> str:
    if not isinstance(item, dict):
        return f"{what} is not an object"
    size, digest = item.get("size"), item.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"{what} has size {size!r}; accepted: an integer >= 0"
    if not isinstance(digest, str) or not _HEX64.match(digest):
        return f"{what} has sha256 {digest!r}; accepted: 64 lowercase hex digits"
    return ""


def _record_problem(record: object) -> str:
    """Why one ``entries[i]`` record of an archive manifest is malformed, or ``""``."""
    if not isinstance(record, dict):
        return "is not an object"
    key = record.get("key")
    if not isinstance(key, str) or not _HEX64.match(key):
        return f"key {key!r} is not a cache key; accepted: 64 lowercase hex digits"
    if not isinstance(record.get("key_material"), dict):
        return "key_material is not an object"
    problem = _digest_problem(record.get("manifest"), "the entry manifest record")
    files = record.get("files")
    if problem or not isinstance(files, list) or not files:
        return problem or "files is not a non-empty list"
    paths: set[str] = set()
    for item in files:
        path = item.get("path") if isinstance(item, dict) else None
        if not isinstance(path, str) or safe_relpath(path) != path or path in (MANIFEST_NAME, LAST_USED_NAME):
            return f"file path {path!r} is not a plain relative path inside the entry; accepted: e.g. 'model_ctx.onnx'"
        problem = _digest_problem(item, f"file {path!r}")
        if problem or path in paths:
            return problem or f"file {path!r} is listed twice"
        paths.add(path)
    for path in paths:
        inside = next((str(p) for p in PurePosixPath(path).parents if str(p) in paths), None)
        if inside is not None:
            return f"file {path!r} lies inside the file {inside!r}"
    return ""


def _parse_manifest(archive: Path, data: bytes) -> tuple[ArchiveContents, dict[str, _Want]]:
    """Validate the archive manifest; return what it declares and the member each name must be."""

    def refuse(problem: str, fix: str = ARCHIVE_DAMAGED_FIX) -> ArchiveError:
        return ArchiveError(str(archive), f"its manifest {ARCHIVE_MANIFEST_NAME!r} {problem}", fix)

    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise refuse(f"is not valid JSON ({type(exc).__name__}: {exc})") from exc
    if not isinstance(manifest, dict):
        raise refuse(f"is a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != ARCHIVE_FORMAT:
        raise refuse(
            f"has format {manifest.get('format')!r}; accepted: {ARCHIVE_FORMAT!r}",
            "pass an archive written by `qnnx-ctxcache pack` (or ContextStore.pack)",
        )
    packed_by = manifest.get("ctxcache_version")
    if manifest.get("format_version") not in _READABLE_VERSIONS:
        raise refuse(
            f"has format_version {manifest.get('format_version')!r}, which qnnx-ctxcache {__version__} cannot read; "
            f"accepted: {', '.join(map(str, _READABLE_VERSIONS))}",
            f"install the qnnx-ctxcache that packed it ({packed_by!r}) or newer here, or pack with qnnx-ctxcache "
            f"{__version__} on the build host",
        )
    if manifest.get("checksum") != manifest_checksum(manifest) or encode_manifest(manifest) != data:
        raise refuse("does not match its checksum or its exact form: it was changed or damaged after packing")
    created = manifest.get("created")
    if not isinstance(packed_by, str) or not isinstance(created, int | float) or isinstance(created, bool):
        raise refuse(f"has ctxcache_version {packed_by!r} and created {created!r}; accepted: a string and a number")
    if manifest.get("hash_algorithm") != "sha256":
        raise refuse(f"has hash_algorithm {manifest.get('hash_algorithm')!r}; accepted: 'sha256'")
    records = manifest.get("entries")
    if not isinstance(records, list):
        raise refuse("has no 'entries' list")
    wanted: dict[str, _Want] = {}
    for index, record in enumerate(records):
        problem = _record_problem(record)
        if not problem and f"{_ENTRIES}/{record['key']}/{MANIFEST_NAME}" in wanted:
            problem = f"key {record['key']} is listed twice"
        if problem:
            raise refuse(f"entries[{index}]: {problem}")
        key = record["key"]
        entry_manifest = record["manifest"]
        wanted[f"{_ENTRIES}/{key}/{MANIFEST_NAME}"] = _Want(
            key, MANIFEST_NAME, entry_manifest["size"], entry_manifest["sha256"]
        )
        for f in record["files"]:
            wanted[f"{_ENTRIES}/{key}/{f['path']}"] = _Want(key, f["path"], f["size"], f["sha256"])
    return ArchiveContents(packed_by=packed_by, created=float(created), records=tuple(records)), wanted


def _open_stream(archive: Path, raw: Any) -> tarfile.TarFile:
    """Open ``raw`` for one front-to-back pass (``r|*``: plain, gzip, bz2 or xz, never seeking)."""
    with _reading(archive):
        return tarfile.open(fileobj=raw, mode="r|*")


def _next_member(archive: Path, members: Iterator[tarfile.TarInfo]) -> tarfile.TarInfo | None:
    with _reading(archive):
        return next(members, None)


def _check_member(archive: Path, member: tarfile.TarInfo, dest_root: Path) -> None:
    """Refuse any member that is not a regular file with a plain relative name (tar path traversal)."""
    name = member.name
    if not member.isreg():
        kind = (
            "a directory" if member.isdir() else "a symlink" if member.issym() else "a hard link"
            if member.islnk() else "a device, FIFO or other special file"
        )  # fmt: skip
        raise ArchiveError(str(archive), f"member {name!r} is {kind}; accepted: regular files only", _UNTRUSTED_FIX)
    if safe_relpath(name) != name:
        raise ArchiveError(
            str(archive),
            f"member name {name!r} is not a plain relative path (absolute, '..', '.', empty parts or backslashes); "
            f"accepted: {ARCHIVE_MANIFEST_NAME!r} and '{_ENTRIES}/<key>/<file>'",
            _UNTRUSTED_FIX,
        )
    data_filter = getattr(tarfile, "data_filter", None)  # Python >= 3.11.4: the stdlib's own traversal check
    if data_filter is not None:
        try:
            data_filter(member, str(dest_root))
        except tarfile.FilterError as exc:
            raise ArchiveError(str(archive), f"member {name!r} is unsafe ({exc})", _UNTRUSTED_FIX) from exc


def _copy_member(archive: Path, tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, want: _Want, *,
                 durable: bool) -> None:  # fmt: skip
    """Stream one member into ``dest`` (a new file), hashing it; refuse it unless it is what ``want`` says."""
    with _reading(archive):
        src = tar.extractfile(member)
    assert src is not None  # a regular file always has data
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    try:
        fd = os.open(dest, _OPEN_FLAGS, 0o666)
    except (FileExistsError, IsADirectoryError, NotADirectoryError) as exc:  # e.g. names equal on a case-folding FS
        raise ArchiveError(str(archive), f"member {member.name!r} collides with another member ({exc})") from exc
    with os.fdopen(fd, "wb") as out:
        while True:
            with _reading(archive):
                chunk = src.read(_fs.CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    if digest.hexdigest() != want.sha256:
        raise ArchiveError(
            str(archive),
            f"member {member.name!r} has SHA-256 {digest.hexdigest()[:16]}..., the archive manifest says "
            f"{want.sha256[:16]}...: the archive is damaged",
        )


def extract_archive(
    archive: Path, staging_for: Callable[[str], Path], *, dest_root: Path, durable: bool
) -> ArchiveContents:
    """Check every member of ``archive`` and stream each entry's files into ``staging_for(key)``.

    Reads the archive once, front to back. Raises :class:`ArchiveError` (having written only into staging
    directories, which the caller deletes) unless the archive manifest is well formed, of a known version and
    intact, and every member is a regular file with a plain relative name that the manifest lists, appearing
    once, with the listed size and SHA-256, and no listed member is missing.
    """
    try:
        raw = archive.open("rb")
    except OSError as exc:
        raise ArchiveError(str(archive), f"it cannot be opened ({exc})", "check the archive path") from exc
    with raw, _open_stream(archive, raw) as tar:
        members = iter(tar)
        first = _next_member(archive, members)
        if first is None or first.name != ARCHIVE_MANIFEST_NAME:
            found = "missing" if first is None else f"{first.name!r}"
            raise ArchiveError(str(archive), f"its first member is {found}; accepted: {ARCHIVE_MANIFEST_NAME!r}")
        _check_member(archive, first, dest_root)
        if first.size > _MAX_MANIFEST_BYTES:
            raise ArchiveError(str(archive), f"its manifest has {first.size} bytes; accepted: <= {_MAX_MANIFEST_BYTES}")
        with _reading(archive):
            handle = tar.extractfile(first)
            data = handle.read() if handle is not None else b""
        contents, wanted = _parse_manifest(archive, data)
        seen: set[str] = set()
        while (member := _next_member(archive, members)) is not None:
            _check_member(archive, member, dest_root)
            want = wanted.pop(member.name, None)
            if want is None:
                problem = "appears twice" if member.name in seen else "is not listed in the archive manifest"
                raise ArchiveError(str(archive), f"member {member.name!r} {problem}", _UNTRUSTED_FIX)
            seen.add(member.name)
            if member.size != want.size:
                raise ArchiveError(
                    str(archive),
                    f"member {member.name!r} has {member.size} bytes, the archive manifest says {want.size}",
                )
            _copy_member(archive, tar, member, staging_for(want.key) / want.path, want, durable=durable)
    if wanted:
        missing = sorted(wanted)
        raise ArchiveError(
            str(archive),
            f"{len(missing)} member(s) listed in its manifest are missing, e.g. {missing[0]!r}: it is truncated",
        )
    return contents
