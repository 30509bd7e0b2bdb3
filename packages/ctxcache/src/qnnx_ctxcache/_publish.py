"""Building into a private staging directory, checking the output and publishing it as an entry with one rename."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from qnnx_ctxcache import _fs
from qnnx_ctxcache._key import CacheKey, canonical_json
from qnnx_ctxcache._layout import HOST_ID, errname
from qnnx_ctxcache._lookup import Lookup
from qnnx_ctxcache._manifest import (
    LAST_USED_NAME,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_SCHEMA_VERSION,
    collect_files,
    inspect_context_model,
    safe_relpath,
)
from qnnx_ctxcache._part import StorePart
from qnnx_ctxcache._prune import Pruner
from qnnx_ctxcache._results import BuildResult, Entry
from qnnx_ctxcache._verify import memo_token, remember, safe_check
from qnnx_ctxcache._version import __version__
from qnnx_ctxcache.errors import BuildOutputError

_log = logging.getLogger(__name__)

#: Private temp dirs of entries that were not persisted, deleted when the process exits.
PRIVATE_TMP: list[Path] = []


@attrs.define(eq=False)
class Publisher(StorePart):
    """A build's way into the store (an unpacked entry takes the same last steps): staging, checks, one rename."""

    _lookup: Lookup
    _pruner: Pruner

    def build_private(self, key: CacheKey, build: Callable[[Path], BuildResult], reason: str) -> Entry:
        """Build into a private temp dir outside the cache; the entry is not persisted."""
        self._counters.count(f"uncached:{reason.split(':')[0]}")
        tmp = Path(tempfile.mkdtemp(prefix="qnnx-ctxcache-"))
        PRIVATE_TMP.append(tmp)
        try:
            result = build(tmp)
            model_file, metadata, _contexts = _validate(tmp, result)
        except BaseException:
            _fs.rmtree_quiet(tmp)
            raise
        return Entry(
            key=key, path=tmp, model_path=tmp / model_file, metadata=metadata, hit=False, persisted=False, reason=reason
        )

    def new_staging(self, key_hex: str) -> Path:
        """A fresh, empty staging directory for ``key_hex``, named after this host and process."""
        staging = self._layout.folder("staging") / f"{key_hex}.{HOST_ID}.{os.getpid()}.{_fs.unique_suffix()}"
        staging.mkdir(mode=0o700 if self._layout.options.private else 0o777)
        return staging

    def build_and_publish(self, key: CacheKey, build: Callable[[Path], BuildResult]) -> Entry:
        """Build in a staging directory and publish the result; uncached when the root cannot take it."""
        layout, counters = self._layout, self._counters
        if layout.options.min_free_bytes:
            try:
                free = shutil.disk_usage(layout.base).free
            except OSError:
                free = 0
            if free < layout.options.min_free_bytes:
                layout.warn_once("low-disk", f"only {free} bytes free under {layout.root}; compiling uncached")
                return self.build_private(key, build, "low-disk")
        staging: Path | None = None
        try:
            staging = self.new_staging(key.hex)
            _fs.fault("staging_created")
        except OSError as exc:
            if staging is not None:
                _fs.rmtree_quiet(staging)
            layout.warn_once("staging", f"cannot create a staging dir under {layout.root} ({exc}); compiling uncached")
            counters.count(f"store_skipped:{errname(exc)}")
            return self.build_private(key, build, f"store-failed:{errname(exc)}")
        counters.count("build")
        started = time.monotonic()
        try:
            result = build(staging)
        except BaseException:
            counters.count("build_failed")
            _fs.rmtree_quiet(staging)
            raise
        seconds = time.monotonic() - started
        try:
            return self._commit(key, staging, result, seconds)
        except OSError as exc:
            layout.warn_once(
                f"store:{errname(exc)}", f"could not store a context under {layout.root} ({exc}); using it uncached"
            )
            counters.count(f"store_skipped:{errname(exc)}")
            return _rescue(key, staging, result, f"store-failed:{errname(exc)}")
        except BaseException:
            _fs.rmtree_quiet(staging)
            raise

    def _commit(self, key: CacheKey, staging: Path, result: BuildResult, seconds: float) -> Entry:
        options, counters = self._layout.options, self._counters
        _fs.fault("compile_done")
        model_file, metadata, contexts = _validate(staging, result)
        if not contexts and options.require_ep_context:
            _log.warning(
                "build for %s produced no EPContext node (the EP compiled nothing); not caching it", key.hex[:16]
            )
            counters.count("store_skipped:no-ep-context")
            return _rescue(key, staging, result, "no-ep-context")
        files, problems = collect_files(staging)
        if problems:
            raise BuildOutputError(problems)
        _fs.fault("files_hashed")
        if options.durable:
            _fs.fault("before_fsync")
            for item in files:
                _fs.fsync_file(staging / item["path"])
        (staging / LAST_USED_NAME).touch()
        manifest = {
            "format": MANIFEST_FORMAT,
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "key": key.hex,
            "key_material": json.loads(canonical_json(key.material)),
            "hash_algorithm": "sha256",
            "model_file": model_file,
            "files": files,
            "ep_contexts": contexts,
            "metadata": metadata,
            "created": self._layout.clock(),
            "compile_seconds": round(seconds, 6),
            "writer": {"ctxcache": __version__, "host": HOST_ID, "pid": os.getpid()},
        }
        _fs.write_json_atomic(staging / MANIFEST_NAME, manifest, durable=options.durable)
        _fs.fault("manifest_written")
        if options.durable:
            _fs.fsync_dir(staging)
        size = _fs.tree_disk_usage(staging)
        if size > options.max_size_bytes:
            _log.warning(
                "context for %s takes %d bytes, more than max_size_bytes=%d; not caching it",
                key.hex[:16],
                size,
                options.max_size_bytes,
            )
            counters.count("store_skipped:too-large")
            return _rescue(key, staging, result, "too-large")
        _fs.fault("before_publish")
        final = self._layout.entry_dir(key)
        self._layout.mkdir(final.parent)
        published = self.publish(key, staging, final)
        if not published:
            # Lost the race: another writer's entry is authoritative (first writer wins).
            existing = self._lookup.find(key, count=False)
            if existing is not None:
                _fs.rmtree_quiet(staging)
                counters.count("store_lost_race")
                return attrs.evolve(existing, hit=False)
            # Something unusable sits at the entry path and could not be moved away: keep our build
            # uncached (the OSError handler rescues it out of staging).
            raise OSError(errno.EEXIST, "entry path is occupied by an invalid entry", str(final))
        self.after_publish(final, key.hex)
        counters.count("store")
        counters.count("bytes_stored", size)
        _log.info("ctxcache stored %s (%d bytes, compiled in %.2fs)", key.hex[:16], size, seconds)
        counters.flush()
        if options.auto_prune:
            self._pruner.auto_prune(keep=frozenset({key.hex}))
        return Entry(
            key=key,
            path=final,
            model_path=final / model_file,
            metadata=metadata,
            hit=False,
            persisted=True,
        )

    def after_publish(self, final: Path, key_hex: str) -> None:
        """The steps after the rename (fsync of the parent, the memo); nothing here can fail the publish."""
        try:
            if self._layout.options.durable:
                _fs.fsync_dir(final.parent)
            _fs.fault("after_publish")
        except OSError as exc:
            _log.warning("published %s but could not fsync its parent (%s)", key_hex[:16], exc)
        # We hashed these bytes ourselves a moment ago: remember the files' signatures so this process
        # does not hash them again on the next hit (the check itself only stats the files here).
        token = memo_token(final)
        if token is not None:
            seen = safe_check(final, key_hex, None, full=False)
            if seen.ok:
                remember(token, seen)

    def publish(self, key: CacheKey, staging: Path, final: Path) -> bool:
        """Rename staging onto ``final``; False when another valid entry is already there."""
        for attempt in range(2):
            try:
                _rename(staging, final)
                return True
            except OSError as exc:
                exists = exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR) or isinstance(
                    exc, FileExistsError | NotADirectoryError
                )
                if not exists:
                    raise
            if self._lookup.find(key, count=False) is not None or attempt:
                return False
            # The squatter was invalid and is quarantined now: try once more.
        return False


def _validate(directory: Path, result: object) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    if not isinstance(result, BuildResult):
        raise TypeError(f"build must return a qnnx_ctxcache.BuildResult, got {type(result).__name__}")
    problems: list[str] = []
    model_file = safe_relpath(result.model_file)
    metadata = dict(result.metadata)
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"BuildResult.metadata is not JSON-able: {exc}")
    contexts: list[dict[str, Any]] = []
    if model_file is None:
        problems.append(f"BuildResult.model_file {result.model_file!r} is not a relative path inside the build dir")
    elif (directory / model_file).is_symlink() or not (directory / model_file).is_file():
        problems.append(f"model file {model_file!r} was not written")
    else:
        contexts, more = inspect_context_model(directory, model_file)
        problems.extend(more)
    if problems:
        raise BuildOutputError(problems)
    assert model_file is not None
    return model_file, metadata, contexts


def _rescue(key: CacheKey, staging: Path, result: BuildResult, reason: str) -> Entry:
    """Move a finished build out of staging into a private temp dir so the caller can still use it."""
    with contextlib.suppress(OSError):
        (staging / MANIFEST_NAME).unlink(missing_ok=True)
        (staging / LAST_USED_NAME).unlink(missing_ok=True)
    target = staging
    try:
        tmp = Path(tempfile.mkdtemp(prefix="qnnx-ctxcache-"))
        PRIVATE_TMP.append(tmp)
        target = Path(shutil.move(str(staging), str(tmp / "entry")))
    except OSError as exc:  # e.g. /tmp is full too: leave it in staging (gc spares live owners)
        _log.debug("could not move %s out of staging: %s", staging, exc)
        PRIVATE_TMP.append(staging)
    return Entry(
        key=key,
        path=target,
        model_path=target / result.model_file,
        metadata=result.metadata,
        hit=False,
        persisted=False,
        reason=reason,
    )


def _rename(src: Path, dst: Path) -> None:
    if os.name != "nt":
        os.rename(src, dst)  # POSIX: never replaces a non-empty directory
        return
    deadline = time.monotonic() + 1.0
    while True:  # Windows: a reader holding a file open makes rename fail transiently (WinError 5)
        try:
            os.rename(src, dst)
            return
        except PermissionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
