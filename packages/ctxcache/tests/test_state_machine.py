"""Model-based test: the store behaves like a dict under put/get/corrupt/prune/reopen."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ctxcache_helpers import key_for
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import qnnx_ctxcache as cc
from qnnx_ctxcache.testing import FakeBuild, forget_verified

NAMES = st.sampled_from(["a", "b", "c", "d"])


class StoreMachine(RuleBasedStateMachine):
    """Compares a ContextStore with ``dict[name] -> payload`` plus the set of corrupted names."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="ctxcache-sm-"))
        self.store = self._open()
        self.model: dict[str, bytes] = {}
        self.corrupted: set[str] = set()
        self.builds = 0

    def _open(self) -> cc.ContextStore:
        return cc.ContextStore(self.tmp, options=cc.StoreOptions(min_age_seconds=0, auto_prune=False, durable=False))

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _bin(self, name: str) -> Path:
        return self.store.entry_dir(key_for(name)) / "model_ctx_qnn.bin"

    @rule(name=NAMES)
    def put(self, name: str) -> None:
        self.builds += 1
        payload = f"{name}-{self.builds}".encode() * 50  # builds are not deterministic, like QNN's
        entry = self.store.get_or_create(key_for(name), FakeBuild(payload=payload))
        if entry.hit:
            assert name in self.model
            assert name not in self.corrupted
            assert (entry.path / "model_ctx_qnn.bin").read_bytes() == self.model[name]
        else:
            assert name not in self.model or name in self.corrupted
            self.model[name] = payload
            self.corrupted.discard(name)
        assert entry.persisted

    @rule(name=NAMES)
    def get(self, name: str) -> None:
        entry = self.store.get(key_for(name), full_verify=True)
        if name not in self.model or name in self.corrupted:
            assert entry is None
            self.model.pop(name, None)
            self.corrupted.discard(name)
        else:
            assert entry is not None
            assert (entry.path / "model_ctx_qnn.bin").read_bytes() == self.model[name]

    @rule(name=NAMES, kind=st.sampled_from(["flip", "truncate", "delete", "manifest"]), offset=st.integers(0, 10**6))
    def corrupt(self, name: str, kind: str, offset: int) -> None:
        if name not in self.model or name in self.corrupted:
            return  # one corruption per entry keeps the harness simple; it is already bad
        target = self._bin(name)
        if kind == "flip":
            data = bytearray(target.read_bytes())
            st_ = target.stat()
            data[offset % len(data)] ^= 0x5A
            target.write_bytes(bytes(data))
            os.utime(target, ns=(st_.st_atime_ns, st_.st_mtime_ns))
        elif kind == "truncate":
            os.truncate(target, offset % target.stat().st_size)
        elif kind == "delete":
            target.unlink()
        else:
            manifest = target.parent / "manifest.json"
            data = json.loads(manifest.read_text())
            data["files"][0]["sha256"] = "0" * 64
            manifest.write_text(json.dumps(data))
        self.corrupted.add(name)

    @rule(limit_entries=st.integers(0, 4))
    def prune(self, limit_entries: int) -> None:
        sizes = {e.key: e.size_bytes for e in self.store.entries()}
        limit = limit_entries * (max(sizes.values()) if sizes else 0)
        report = self.store.prune(limit)
        assert not report.skipped
        assert report.total_bytes_after <= limit
        by_hex = {key_for(n).hex: n for n in self.model}
        for key_hex in report.removed:
            name = by_hex[key_hex]
            self.model.pop(name)
            self.corrupted.discard(name)

    @rule()
    def reopen(self) -> None:
        forget_verified()
        self.store = self._open()

    @invariant()
    def disk_matches_model(self) -> None:
        report = self.store.verify(full=True)
        assert {p.key for p in report.problems} == {key_for(n).hex for n in self.corrupted}
        assert report.checked == len(self.model)
        assert list((self.tmp / "v1" / "staging").iterdir()) == []


StoreMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=12, deadline=None)


class TestStoreMatchesDictModel(StoreMachine.TestCase):  # type: ignore[name-defined,misc]
    """Across random put/get/corrupt/prune/reopen sequences the store never serves stale or corrupt data."""
