"""Errors raised by qnnx-ctxcache.

Every error derives from :class:`QnnxCtxcacheError` and from the builtin that matches its meaning, so callers
can catch either. Cache problems (a corrupt entry, a read-only or full disk, a busy lock) are *not*
errors: the store logs them, counts them and carries on uncached. Errors are raised only for misuse
(a bad key field, bad options) and for build output that can never be loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

from qnnx_clikit import renamed_attributes

__all__ = [
    "ArchiveError",
    "BuildOutputError",
    "EntryNotFoundError",
    "InvalidKeyError",
    "InvalidOptionsError",
    "NotACacheRootError",
    "QnnxCtxcacheError",
    "SharedContextError",
    "StoreNotWritableError",
    "UnhashableKeyError",
]


class QnnxCtxcacheError(Exception):
    """Root of every error raised by qnnx-ctxcache."""


class InvalidKeyError(QnnxCtxcacheError, ValueError):
    """The key material is not acceptable (a wrong type, an empty required field)."""


class UnhashableKeyError(InvalidKeyError):
    """A key field holds a value with no canonical JSON form (a callable, a float, NaN, a set...).

    Attributes:
        field: dotted path of the offending value inside the key material, e.g. ``ep_options.vtcm_mb``.
        value_type: the Python type name of the offending value.

    The caller should bypass the cache for this compile and log the reason; never cache under a
    partial key.
    """

    def __init__(self, field: str, value_type: str, detail: str = "") -> None:
        self.field = field
        self.value_type = value_type
        message = (
            f"cannot hash key field {field!r}: value of type {value_type} has no canonical form"
            f"{': ' + detail if detail else ''}; accepted are str, int, bool, None and lists/dicts "
            "of those (no floats, sets or objects). Fix: convert the value to a string or an int, "
            "or bypass the cache for this compile."
        )
        super().__init__(message)


class InvalidOptionsError(QnnxCtxcacheError, ValueError):
    """A :class:`~qnnx_ctxcache.StoreOptions` field or store argument has a bad value."""


class BuildOutputError(QnnxCtxcacheError, RuntimeError):
    """The build callback produced a context model that cannot be loaded as written.

    Raised when the model file is missing or unparsable, or an EPContext node references a file
    that is absent, empty, outside the build directory or a symlink. All problems are listed.

    Attributes:
        problems: one human-readable line per problem found.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        message = (
            f"the build wrote {len(self.problems)} unusable output(s):\n{lines}\n"
            "Fix: make the build write the context model named in BuildResult.model_file and every file "
            "its EPContext nodes reference (embed_mode=0) into the staging directory it was given."
        )
        super().__init__(message)


class SharedContextError(QnnxCtxcacheError, RuntimeError):
    """A weight-shared EPContext group is not one binary holding every graph (``qnnx_ctxcache.ort``).

    Attributes:
        problems: one human-readable line per problem found.
        directory: the group's folder.
    """

    def __init__(self, problems: Sequence[str], directory: str) -> None:
        self.problems = tuple(problems)
        self.directory = directory
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(
            f"the context group in {directory} is not weight-shared ({len(self.problems)} problem(s)):\n{lines}\n"
            "accepted: exactly one context binary that every EPContext node of every _ctx.onnx of the group names, "
            "about the size of one graph compiled apart. Fix: compile the whole group with "
            "qnnx_ctxcache.ort.compile_shared_group in one process and one empty directory (it sets "
            "ep.share_ep_contexts on every session and ep.stop_share_ep_contexts on the last)."
        )


class NotACacheRootError(QnnxCtxcacheError, ValueError):
    """A destructive command was pointed at a directory that is not a qnnx-ctxcache root.

    Attributes:
        path: the directory that lacks the root marker.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path!r} is not a qnnx-ctxcache root (no ctxcache-root.json marker); refusing to delete "
            "anything there. Fix: pass the directory printed by `qnnx-ctxcache dir`."
        )


class EntryNotFoundError(QnnxCtxcacheError, LookupError):
    """A key or key prefix given to :meth:`~qnnx_ctxcache.ContextStore.pack` names no single entry.

    Attributes:
        key: the key or prefix as given.
        root: the cache root that was searched.
        matches: how many entries start with it (None when it is not a hex prefix of >= 4 digits).
    """

    def __init__(self, key: str, root: str, matches: int | None) -> None:
        self.key = key
        self.root = root
        self.matches = matches
        if matches is None:
            found = f"{key!r} is not a cache key"
        elif matches == 0:
            found = f"no entry under {root} has a key starting with {key!r}"
        else:
            found = f"{matches} entries under {root} have keys starting with {key!r}"
        super().__init__(
            f"{found}; accepted: a full key (64 hex digits) or a unique prefix of at least 4 hex digits of an "
            "entry listed by `qnnx-ctxcache ls`. Fix: pass the full key or a longer prefix, or give no keys to "
            "take every entry."
        )


#: What to do about a damaged archive: the copy went wrong, so copy or pack it again.
ARCHIVE_DAMAGED_FIX = (
    "copy the archive again from the build host and compare its SHA-256 with the one `qnnx-ctxcache pack` "
    "printed, or pack it again there"
)


class ArchiveError(QnnxCtxcacheError, ValueError):
    """:meth:`~qnnx_ctxcache.ContextStore.unpack` refused an archive; nothing was added to the cache.

    Raised for an archive that cannot be read, is truncated, damaged or tampered with (a size or SHA-256
    differs from a manifest, an entry's key does not match its key material), has an unknown format version,
    or holds a member that is not a regular file inside the archive (absolute paths, ``..``, links, devices).

    Attributes:
        archive: the archive path.
        problem: what is wrong, naming the member or field and the accepted values.
        fix: what to do about it.
    """

    def __init__(self, archive: str, problem: str, fix: str = ARCHIVE_DAMAGED_FIX) -> None:
        self.archive = archive
        self.problem = problem
        self.fix = fix
        super().__init__(f"refusing archive {archive!r}: {problem}; nothing was added to the cache. Fix: {fix}.")


class StoreNotWritableError(QnnxCtxcacheError, PermissionError):
    """An operation that must write the cache (``unpack``) was given a store that is not read-write.

    Attributes:
        root: the cache root.
        mode: the store's mode (``readonly`` or ``disabled``).
    """

    def __init__(self, root: str, mode: str) -> None:
        self.root = root
        self.mode = mode
        super().__init__(
            f"cannot add entries to the cache at {root}: the store is {mode!r}; accepted: a store in mode "
            "'readwrite'. Fix: pass a writable --root (or ContextStore root), and unset $QNNX_CTXCACHE_MODE "
            "or StoreOptions(mode=...) if it forces read-only."
        )


# Former names, kept for one minor release: importing them warns.
__getattr__ = renamed_attributes(
    __name__, {"CtxCacheError": "QnnxCtxcacheError", "InvalidStoreOptionsError": "InvalidOptionsError"}, globals()
)
