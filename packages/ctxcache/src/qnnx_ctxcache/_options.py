"""How a store behaves: :class:`StoreOptions` and its validators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from qnnx_ctxcache.errors import InvalidOptionsError

__all__ = ["StoreOptions"]

_MODES = ("auto", "readwrite", "readonly", "disabled")


def _positive(name: str, allow_zero: bool = True) -> Callable[[Any, Any, Any], None]:
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (value >= 0)
        if ok and not allow_zero:
            ok = value > 0
        if not ok:
            bound = ">= 0" if allow_zero else "> 0"
            raise InvalidOptionsError(f"StoreOptions.{name} must be a number {bound}, got {value!r}")

    return check


def _mode_check(_inst: Any, _attr: Any, value: Any) -> None:
    if value not in _MODES:
        raise InvalidOptionsError(f"StoreOptions.mode must be one of {_MODES}, got {value!r}")


@attrs.frozen(kw_only=True)
class StoreOptions:
    """How a :class:`ContextStore` behaves. All fields are keyword-only.

    Attributes:
        max_size_bytes: size cap of all entries, counted in allocated disk blocks. Eviction (automatic
            after a store, or ``prune``) removes least recently used entries until the total fits.
            An entry larger than the cap is never stored (the build result is returned uncached).
        lock_timeout: seconds to wait for another process compiling the same key; then compile anyway.
        verify_on_first_use: hash every file (SHA-256) the first time this process uses an entry it did
            not write. The cheap check (sizes, paths, mtimes) runs on every hit regardless.
        min_age_seconds: grace period: entries used or created this recently are never evicted.
        stale_after_seconds: staging dirs, trash and quarantine older than this are removed by gc.
        touch_interval_seconds: a hit refreshes the entry's last-use time at most this often.
        durable: fsync files and directories before and after publishing.
        auto_prune: run eviction after a store that pushed the total over ``max_size_bytes``.
        mode: ``auto`` (probe the root; ``$QNNX_CTXCACHE_MODE`` may force a mode), ``readwrite``,
            ``readonly`` (serve hits, build misses uncached, write nothing) or ``disabled``.
        min_free_bytes: when the root's filesystem has less free space, build uncached in a temp dir.
        require_ep_context: a build whose model has no EPContext node (the EP compiled nothing) is
            returned uncached instead of stored.
        private: create directories with mode 0o700 (a per-user cache); ``False`` leaves it to the umask.
        single_flight: take a per-key file lock so concurrent misses compile once. Turning it off
            only costs duplicate compiles; correctness never depends on the lock.
        recache: the first ``get_or_create`` of each key by this store quarantines the existing entry and
            compiles again (``$QNNX_CTXCACHE_RECACHE=1`` does the same), e.g. after a suspected bad binary.
    """

    max_size_bytes: int = attrs.field(default=10 * 2**30, validator=_positive("max_size_bytes"))
    lock_timeout: float = attrs.field(default=600.0, validator=_positive("lock_timeout"))
    verify_on_first_use: bool = True
    min_age_seconds: float = attrs.field(default=600.0, validator=_positive("min_age_seconds"))
    stale_after_seconds: float = attrs.field(default=3600.0, validator=_positive("stale_after_seconds"))
    touch_interval_seconds: float = attrs.field(default=60.0, validator=_positive("touch_interval_seconds"))
    durable: bool = True
    auto_prune: bool = True
    mode: str = attrs.field(default="auto", validator=_mode_check)
    min_free_bytes: int = attrs.field(default=0, validator=_positive("min_free_bytes"))
    require_ep_context: bool = True
    private: bool = True
    single_flight: bool = True
    recache: bool = False
