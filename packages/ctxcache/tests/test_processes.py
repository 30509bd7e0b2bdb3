"""Multi-process behaviour: races, crashes at every protocol step, lock-holder death, full disks, pins."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ctxcache_helpers import CHILD_PRELUDE, key_for, run_child

import qnnx_ctxcache as cc
from qnnx_ctxcache.testing import FakeBuild, forget_verified

RACE_CHILD = (
    CHILD_PRELUDE
    + """
import time, hashlib
root, go, count, single = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
store = cc.ContextStore(root, options=cc.StoreOptions(single_flight=single))
while not go.exists():
    time.sleep(0.005)
entry = store.get_or_create(key_for(), FakeBuild(sleep=0.3, count_file=pathlib.Path(count), payload=str(__import__("os").getpid()).encode() * 100))
print(json.dumps({"path": str(entry.path), "persisted": entry.persisted,
                  "bin": hashlib.sha256((entry.path / "model_ctx_qnn.bin").read_bytes()).hexdigest()}))
"""
)


def _race(tmp_path: Path, n: int, single_flight: bool) -> tuple[list[dict[str, object]], int]:
    root, go, count = tmp_path / "cache", tmp_path / "go", tmp_path / "count"
    cc.ContextStore(root)  # create the layout once so children start equal
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE_CHILD, str(root), str(go), str(count), "1" if single_flight else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    time.sleep(1.0)  # let every child import and reach the barrier
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results, len(count.read_text().splitlines())


@pytest.mark.parametrize("single_flight", [True, False], ids=["locked", "lock-broken"])
def test_processes_racing_on_one_key_agree(tmp_path: Path, single_flight: bool) -> None:
    """N processes racing on one key all get the one published entry; the lock makes it one compile."""
    results, builds = _race(tmp_path, 5, single_flight)
    assert len({r["path"] for r in results}) == 1
    assert len({r["bin"] for r in results}) == 1
    assert all(r["persisted"] for r in results)
    if single_flight:
        assert builds == 1
    else:
        assert builds >= 1
    store = cc.ContextStore(tmp_path / "cache")
    assert store.verify(full=True).ok
    assert store.stats().entries == 1
    assert list((tmp_path / "cache" / "v1" / "staging").iterdir()) == []


STORE_POINTS = ["staging_created", "compile_done", "files_hashed", "before_fsync", "manifest_written",
                "before_publish", "after_publish"]  # fmt: skip


@pytest.mark.parametrize("point", STORE_POINTS)
def test_sigkill_at_every_store_step_leaves_a_miss_or_a_valid_entry(tmp_path: Path, point: str) -> None:
    """A writer killed at any protocol step leaves either no entry or a valid one; gc clears the staging."""
    root = tmp_path / "cache"
    done = run_child(
        CHILD_PRELUDE + f"cc.ContextStore({str(root)!r}).get_or_create(key_for(), FakeBuild())",
        env={"QNNX_CTXCACHE_FAULT": f"{point}:kill"},
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    store = cc.ContextStore(root, options=cc.StoreOptions(stale_after_seconds=0, min_age_seconds=0))
    entry = store.get(key_for(), full_verify=True)
    if point == "after_publish":
        assert entry is not None
    else:
        assert entry is None
    assert store.verify(full=True).ok
    assert not list((root / "v1" / "quarantine").iterdir())
    store.prune()  # gc: the dead writer's staging dir goes
    assert list((root / "v1" / "staging").iterdir()) == []
    rebuilt = store.get_or_create(key_for(), FakeBuild())
    assert rebuilt.persisted
    assert store.verify(full=True).ok


def test_sigkill_during_touch_keeps_entry_valid(tmp_path: Path) -> None:
    """A reader killed while recording use leaves the entry valid."""
    root = tmp_path / "cache"
    store = cc.ContextStore(root, options=cc.StoreOptions(touch_interval_seconds=0))
    store.get_or_create(key_for(), FakeBuild())
    done = run_child(
        CHILD_PRELUDE
        + f"cc.ContextStore({str(root)!r}, options=cc.StoreOptions(touch_interval_seconds=0)).get(key_for())",
        env={"QNNX_CTXCACHE_FAULT": "before_touch:kill"},
    )
    assert done.returncode == -signal.SIGKILL
    assert store.get(key_for(), full_verify=True) is not None


@pytest.mark.parametrize("point", ["evict_renamed", "evict_deleting"])
def test_sigkill_during_eviction_never_leaves_half_entries(tmp_path: Path, point: str) -> None:
    """An evictor killed mid-way leaves entries/ with only whole entries; the next gc empties the trash."""
    root = tmp_path / "cache"
    store = cc.ContextStore(root, options=cc.StoreOptions(min_age_seconds=0))
    for name in ("a", "b", "c"):
        store.get_or_create(key_for(name), FakeBuild())
    done = run_child(
        CHILD_PRELUDE + f"cc.ContextStore({str(root)!r}).prune(0, min_age_seconds=0)",
        env={"QNNX_CTXCACHE_FAULT": f"{point}:kill"},
    )
    assert done.returncode == -signal.SIGKILL
    forget_verified()
    report = store.verify(full=True)
    assert report.ok
    assert report.checked == 2
    assert len(list((root / "v1" / "trash").iterdir())) == 1
    store.prune(0, min_age_seconds=0)
    assert list((root / "v1" / "trash").iterdir()) == []
    assert store.stats().entries == 0


def test_lock_holder_death_frees_the_key(tmp_path: Path) -> None:
    """When the process compiling a key is SIGKILLed, a waiter gets the lock, compiles and publishes."""
    root, count = tmp_path / "cache", tmp_path / "count"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(f"""
            store = cc.ContextStore({str(root)!r})
            store.get_or_create(key_for(), FakeBuild(sleep=600, count_file=pathlib.Path({str(count)!r})))
        """)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (count.exists() and count.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert count.read_text(), "child never started building"
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = cc.ContextStore(root, options=cc.StoreOptions(lock_timeout=120))
    entry = store.get_or_create(key_for(), FakeBuild())
    assert entry.persisted
    assert "lock:timeout" not in store.stats().counters


@pytest.mark.parametrize("point", ["files_hashed", "before_fsync", "manifest_written", "before_publish"])
def test_injected_enospc_returns_a_usable_uncached_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """ENOSPC during a store gives an uncached but usable entry; existing entries stay intact; retry stores."""
    store = cc.ContextStore(tmp_path / "cache", options=cc.StoreOptions(min_age_seconds=0))
    store.get_or_create(key_for("old"), FakeBuild())
    monkeypatch.setenv("QNNX_CTXCACHE_FAULT", f"{point}:raise:28")
    entry = store.get_or_create(key_for(), FakeBuild(payload=b"fresh"))
    assert (entry.persisted, entry.reason) == (False, "store-failed:ENOSPC")
    assert (entry.path / "model_ctx_qnn.bin").read_bytes() == b"fresh"
    assert entry.model_path.is_file()
    assert list((tmp_path / "cache" / "v1" / "staging").iterdir()) == []
    assert store.stats().counters["store_skipped:ENOSPC"] == 1
    monkeypatch.delenv("QNNX_CTXCACHE_FAULT")
    assert store.verify(full=True).ok
    assert store.get_or_create(key_for(), FakeBuild()).persisted
    entry.release()
    assert not entry.path.exists()


def test_file_size_limit_during_manifest_write_degrades(tmp_path: Path) -> None:
    """With RLIMIT_FSIZE too small for the manifest, the store fails with EFBIG and the result is still usable."""
    root = tmp_path / "cache"
    done = run_child(
        CHILD_PRELUDE
        + textwrap.dedent(f"""
        import resource, signal
        store = cc.ContextStore({str(root)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
        entry = store.get_or_create(key_for(), FakeBuild(metadata={{"blob": "x" * 20000}}))
        print(json.dumps({{"persisted": entry.persisted, "reason": entry.reason,
                          "ok": entry.model_path.is_file() and (entry.path / "model_ctx_qnn.bin").is_file()}}))
    """)
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"persisted": False, "reason": "store-failed:EFBIG", "ok": True}
    store = cc.ContextStore(root)
    assert store.stats().entries == 0
    assert list((root / "v1" / "staging").iterdir()) == []


def test_file_size_limit_during_build_propagates_build_error(tmp_path: Path) -> None:
    """A build that hits the file size limit raises its own error; nothing is stored and staging is cleaned."""
    root = tmp_path / "cache"
    done = run_child(
        CHILD_PRELUDE
        + textwrap.dedent(f"""
        import resource, signal
        store = cc.ContextStore({str(root)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
        try:
            store.get_or_create(key_for(), FakeBuild(payload=b"y" * 65536))
        except OSError as exc:
            print("EFBIG" if exc.errno == 27 else exc)
    """)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "EFBIG"
    assert list((root / "v1" / "staging").iterdir()) == []


def test_pinned_entry_survives_prune_by_another_process(tmp_path: Path) -> None:
    """An entry pinned by a live reader process is kept by prune(max_size=0); after the reader exits it goes."""
    root, ready, release = tmp_path / "cache", tmp_path / "ready", tmp_path / "release"
    store = cc.ContextStore(root, options=cc.StoreOptions(min_age_seconds=0))
    for name in ("pinned", "other"):
        store.get_or_create(key_for(name), FakeBuild())
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(f"""
            import time
            store = cc.ContextStore({str(root)!r})
            with store.pin(key_for("pinned")) as entry:
                assert entry is not None
                pathlib.Path({str(ready)!r}).touch()
                while not pathlib.Path({str(release)!r}).exists():
                    time.sleep(0.02)
                print((entry.path / "model_ctx_qnn.bin").stat().st_size)
        """)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        report = store.prune(0, min_age_seconds=0)
        assert report.removed == (key_for("other").hex,)
        assert report.kept_pinned == (key_for("pinned").hex,)
        release.touch()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert int(out.strip()) > 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert store.prune(0, min_age_seconds=0).removed == (key_for("pinned").hex,)


def test_pin_of_a_dead_process_does_not_block_eviction(tmp_path: Path) -> None:
    """A pin left by a SIGKILLed process is stale and does not keep the entry forever."""
    root = tmp_path / "cache"
    store = cc.ContextStore(root, options=cc.StoreOptions(min_age_seconds=0))
    store.get_or_create(key_for(), FakeBuild())
    done = run_child(
        CHILD_PRELUDE
        + f"""
import os, signal
store = cc.ContextStore({str(root)!r})
with store.pin(key_for()):
    os.kill(os.getpid(), signal.SIGKILL)
"""
    )
    assert done.returncode == -signal.SIGKILL
    assert len(list((root / "v1" / "pins").rglob("*.pin"))) == 1
    assert store.prune(0, min_age_seconds=0).removed == (key_for().hex,)
    assert list((root / "v1" / "pins").iterdir()) == []


def test_readers_during_a_slow_commit_see_miss_or_valid(tmp_path: Path) -> None:
    """While a writer pauses before publishing, readers see a miss; afterwards a fully valid entry."""
    root = tmp_path / "cache"
    cc.ContextStore(root)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD_PRELUDE + f"cc.ContextStore({str(root)!r}).get_or_create(key_for(), FakeBuild())"],
        env={**os.environ, "QNNX_CTXCACHE_FAULT": "manifest_written:sleep:1,before_publish:sleep:1"},
        stderr=subprocess.PIPE,
    )
    reader = cc.ContextStore(root)
    seen: list[bool] = []
    try:
        while proc.poll() is None:
            forget_verified()
            seen.append(reader.get(key_for(), full_verify=True) is not None)
            time.sleep(0.02)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert reader.get(key_for(), full_verify=True) is not None
    assert False in seen
    assert "quarantined" not in reader.stats().counters
    assert seen == sorted(seen)  # once visible, it stays visible and valid


def test_loader_that_kills_the_process_gets_its_entry_rebuilt(tmp_path: Path) -> None:
    """If a process dies inside load() on a hit (native crash), the next process quarantines and rebuilds that entry."""
    root = tmp_path / "cache"
    store = cc.ContextStore(root)
    store.get_or_create(key_for(), FakeBuild(payload=b"poison"))
    done = run_child(
        CHILD_PRELUDE
        + f"""
import os
store = cc.ContextStore({str(root)!r})
store.load_or_rebuild(key_for(), FakeBuild(), lambda entry: os.abort())
"""
    )
    assert done.returncode == -signal.SIGABRT
    assert len(list((root / "v1" / "pins").rglob("*.loading"))) == 1
    build = FakeBuild(payload=b"fresh")
    entry, data = cc.ContextStore(root).load_or_rebuild(
        key_for(), build, lambda e: (e.path / "model_ctx_qnn.bin").read_bytes()
    )
    assert (data, entry.hit, build.calls) == (b"fresh", False, 1)
    reasons = [json.loads(p.read_text())["reason"] for p in (root / "v1" / "quarantine").glob("*.json")]
    assert reasons == ["crashed-loader"]
    assert list((root / "v1" / "pins").rglob("*.loading")) == []


def test_successful_loads_leave_no_marker(tmp_path: Path) -> None:
    """A load that returns normally removes its marker, so the next hit is served."""
    store = cc.ContextStore(tmp_path)
    build = FakeBuild()
    for _ in range(2):
        store.load_or_rebuild(key_for(), build, lambda e: e.model_path.stat().st_size)
    assert build.calls == 1
    assert list((tmp_path / "v1" / "pins").rglob("*")) == []


def test_fault_right_after_staging_creation_leaves_no_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error right after the staging dir is made removes it and builds privately."""
    store = cc.ContextStore(tmp_path)
    monkeypatch.setenv("QNNX_CTXCACHE_FAULT", "staging_created:raise:28")
    entry = store.get_or_create(key_for(), FakeBuild())
    assert (entry.persisted, entry.reason) == (False, "store-failed:ENOSPC")
    assert list((tmp_path / "v1" / "staging").iterdir()) == []


def test_error_after_publish_keeps_the_published_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error after the rename (parent fsync) cannot un-publish: the entry is returned persisted and valid."""
    store = cc.ContextStore(tmp_path)
    monkeypatch.setenv("QNNX_CTXCACHE_FAULT", "after_publish:raise:5")
    entry = store.get_or_create(key_for(), FakeBuild())
    assert (entry.persisted, entry.path) == (True, store.entry_dir(key_for()))
    monkeypatch.delenv("QNNX_CTXCACHE_FAULT")
    assert store.verify(full=True).ok
