"""Scratch folders carry their owner, and a later process removes those of this host's dead processes only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qnnx_backend import _scratch


def _dead_pid() -> int:
    """The id of a process that has exited (and was reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def _entry(folder: Path, name: str, *, age: float, is_dir: bool = True) -> Path:
    path = folder / name
    if is_dir:
        path.mkdir()
        (path / "model.onnx.data").write_bytes(b"weights")
    else:
        path.write_text("{}")
    old = time.time() - age
    os.utime(path, (old, old))
    return path


def test_a_dead_processes_scratch_is_removed_and_the_rest_kept(tmp_path: Path) -> None:
    """Folders and files of a dead process on this host go; those of a live process, another host, a recent
    owner, or without an owner in their name stay."""
    dead, live, host = _dead_pid(), os.getppid(), _scratch.HOST
    gone = [
        _entry(tmp_path, f"qnnx-model-{host}.{dead}-abc", age=600),
        _entry(tmp_path, f"qnnx-aot-ctx-{host}.{dead}-def", age=600),
        _entry(tmp_path, f"qnnx-affinity-{host}.{dead}-x.json", age=600, is_dir=False),
    ]
    kept = [
        _entry(tmp_path, f"qnnx-model-{host}.{live}-abc", age=600),  # its owner runs
        _entry(tmp_path, f"qnnx-model-{'0' * 8 if host != '0' * 8 else '1' * 8}.{dead}-abc", age=600),  # other host
        _entry(tmp_path, f"qnnx-model-{host}.{dead}-new", age=5),  # younger than MIN_AGE
        _entry(tmp_path, "qnnx-model-abc123", age=600),  # no owner in its name (an older qnnx)
        _entry(tmp_path, f"other-{host}.{dead}-abc", age=600),
    ]
    assert _scratch.sweep(tmp_path) == len(gone)
    assert not any(p.exists() for p in gone)
    assert all(p.exists() for p in kept)


def test_names_carry_this_process_and_host(tmp_path: Path, monkeypatch) -> None:
    """A folder made now is named after this process, and a sweep never removes it."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    folder = _scratch.make_dir("model")
    assert folder.parent == tmp_path and folder.name.startswith(f"qnnx-model-{_scratch.HOST}.{os.getpid()}-")
    old = time.time() - 3600
    os.utime(folder, (old, old))
    assert _scratch.sweep(tmp_path) == 0 and folder.exists()


@settings(max_examples=25, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["model", "aot", "aot-ctx", "contexts", "quant", "arrays"]),
            st.sampled_from(["dead", "live", "mine", "foreign"]),
            st.sampled_from([5.0, 30.0, 120.0, 86400.0]),
        ),
        max_size=8,
    )
)
def test_only_old_entries_of_dead_owners_on_this_host_are_swept(
    tmp_path_factory, entries: list[tuple[str, str, float]]
) -> None:
    folder = tmp_path_factory.mktemp("scratch")
    dead, host = _dead_pid(), _scratch.HOST
    other = "f" * 8 if host != "f" * 8 else "e" * 8
    owners = {"dead": (host, dead), "live": (host, os.getppid()), "mine": (host, os.getpid()), "foreign": (other, dead)}
    expected_gone = []
    made = []
    for k, (kind, owner, age) in enumerate(entries):
        h, pid = owners[owner]
        path = _entry(folder, f"qnnx-{kind}-{h}.{pid}-{k}", age=age)
        made.append(path)
        if owner == "dead" and age >= _scratch.MIN_AGE:
            expected_gone.append(path)
    assert _scratch.sweep(folder) == len(expected_gone)
    assert sorted(p for p in made if not p.exists()) == sorted(expected_gone)
