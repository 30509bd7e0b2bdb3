"""Errors raised by qnnx-ctxcache.

Every error derives from :class:`CtxCacheError` and from the builtin that matches its meaning, so callers
can catch either. Cache problems (a corrupt entry, a read-only or full disk, a busy lock) are *not*
errors: the store logs them, counts them and carries on uncached. Errors are raised only for misuse
(a bad key field, bad options) and for build output that can never be loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BuildOutputError",
    "CtxCacheError",
    "InvalidKeyError",
    "InvalidStoreOptionsError",
    "NotACacheRootError",
    "UnhashableKeyError",
]


class CtxCacheError(Exception):
    """Root of every error raised by qnnx-ctxcache."""


class InvalidKeyError(CtxCacheError, ValueError):
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


class InvalidStoreOptionsError(CtxCacheError, ValueError):
    """A :class:`~qnnx_ctxcache.StoreOptions` field or store argument has a bad value."""


class BuildOutputError(CtxCacheError, RuntimeError):
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


class NotACacheRootError(CtxCacheError, ValueError):
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
