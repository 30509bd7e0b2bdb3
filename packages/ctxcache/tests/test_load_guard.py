"""Crash records for contexts loaded from outside the store: a context that killed its loader is not tried again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import qnnx_ctxcache as cc

_DIES_LOADING = textwrap.dedent(
    """
    import os, sys
    import qnnx_ctxcache as cc

    store = cc.ContextStore(sys.argv[1])
    with store.guard_load(sys.argv[2]):
        os._exit(3)  # as a native crash in the EP would: no clean-up
    """
)


def _die_loading(root: Path, name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _DIES_LOADING, str(root), name], capture_output=True, timeout=120)
    assert proc.returncode == 3, proc.stderr


def _markers(root: Path) -> list[Path]:
    """The loading markers anywhere under the cache root."""
    return list(root.rglob("*.loading"))


def test_a_process_that_dies_loading_a_context_marks_it_for_every_later_process(tmp_path: Path) -> None:
    """After a loader died inside guard_load, load_crashed is True here and in any later store object, until
    clear(); other names are unaffected."""
    root = tmp_path / "cache"
    store = cc.ContextStore(root)
    assert not store.load_crashed("app-model@sha256:aa")
    _die_loading(root, "app-model@sha256:aa")
    assert store.load_crashed("app-model@sha256:aa")
    assert cc.ContextStore(root).load_crashed("app-model@sha256:aa")  # remembered, not a one-shot
    assert not store.load_crashed("app-model@sha256:bb")
    store.clear()
    assert not store.load_crashed("app-model@sha256:aa")


def test_a_live_or_finished_loader_is_not_a_crash(tmp_path: Path) -> None:
    """Inside the block of this (live) process, and after it ends normally, nothing counts as crashed."""
    store = cc.ContextStore(tmp_path / "cache")
    with store.guard_load("ctx"):
        assert _markers(tmp_path / "cache")  # marked while loading
        assert not store.load_crashed("ctx")
    assert not store.load_crashed("ctx")
    assert not _markers(tmp_path / "cache")  # the marker is gone


def test_a_read_only_store_marks_nothing(tmp_path: Path) -> None:
    """A read-only store neither writes markers nor records crashes, and still answers."""
    root = tmp_path / "cache"
    cc.ContextStore(root)
    store = cc.ContextStore(root, options=cc.StoreOptions(mode="readonly"))
    with store.guard_load("ctx"):
        assert not _markers(root)
    assert not store.load_crashed("ctx")


@given(names=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=4, unique=True))
def test_names_never_collide_with_entries_or_each_other(names: list[str]) -> None:
    """Every name gets its own marker folder, which is never the name of a store entry (64 hex digits)."""
    from qnnx_ctxcache._pins import external_hex

    folders = [external_hex(n) for n in names]
    assert len(set(folders)) == len(names)
    assert all(len(f) != 64 and not all(c in "0123456789abcdef" for c in f) for f in folders)
