"""A context-cache hit: a prune of the store, run by another process while the backend loads one of its entries,
does not break the load (the entry is pinned while ONNX Runtime reads it); and a hit needs no operator check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_processes import _CACHE_SCRIPT

# Another process empties the store (size limit 0, no grace period), as `qnnx-ctxcache prune` or a second
# application sharing the cache folder would, and prints its report.
_PRUNE = """
import json, sys, attrs, qnnx_ctxcache
report = qnnx_ctxcache.ContextStore(sys.argv[1]).prune(0, min_age_seconds=0)
print(json.dumps(attrs.asdict(report)))
"""

# The cache script, with the backend's session creation wrapped: when it is about to load a cached context (the
# store has pinned the entry and ONNX Runtime has not read it yet), the other process prunes everything.
_PRUNING_LOAD = (
    "import json, subprocess, sys\n"
    "import qnnx_backend._session as s\n"
    "real = s.create_for_device\n"
    "prunes = []\n"
    "def prune_then_load(model, *a, **k):\n"
    "    if str(model).endswith('model_ctx.onnx'):\n"
    f"        out = subprocess.run([sys.executable, '-c', {_PRUNE!r}, sys.argv[1]], capture_output=True, text=True)\n"
    "        assert out.returncode == 0, out.stderr\n"
    "        prunes.append(json.loads(out.stdout))\n"
    "    return real(model, *a, **k)\n"
    "s.create_for_device = prune_then_load\n" + _CACHE_SCRIPT + "print(json.dumps(prunes))\n"
)


def _last_json(proc: subprocess.CompletedProcess[str], line: int = -1) -> Any:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[line])


def _entries(cache: Path) -> list[Path]:
    return sorted(p.parent for p in cache.rglob("model_ctx.onnx") if "entries" in p.parts)


def test_prune_while_the_backend_loads_an_entry_keeps_it(tmp_path: Path) -> None:
    """A prune of everything in the middle of a cache-hit load keeps the pinned entry: the load works, gives the
    right answer and leaves the entry in place; the same prune once nothing is loading removes it."""
    plain, pruning = tmp_path / "cached.py", tmp_path / "pruning.py"
    plain.write_text(_CACHE_SCRIPT)
    pruning.write_text(_PRUNING_LOAD)
    cache = tmp_path / "cache"

    def run(script: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, timeout=300)

    assert _last_json(run(plain))["cache"] == "miss"
    (entry,) = _entries(cache)

    proc = run(pruning)
    loaded, prunes = _last_json(proc, -2), _last_json(proc)
    assert loaded["cache"] == "hit" and loaded["device"] == "npu"
    assert loaded["err"] < 2e-2
    (during,) = prunes
    assert during["removed"] == [] and not during["skipped"]
    assert during["kept_pinned"] == [entry.name]  # an entry's folder is named by its key
    assert _entries(cache) == [entry]

    after = subprocess.run(
        [sys.executable, "-c", _PRUNE, str(cache)], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(after.stdout)["removed"] == [entry.name]  # unpinned, the same prune evicts it
    assert _entries(cache) == []


def test_a_cache_hit_imports_neither_opcheck_nor_onnx(tmp_path: Path) -> None:
    """A process that loads its graph from the context cache runs no operator check, so it does not pay for
    importing qnnx-opcheck and onnx (the key names qnnx-opcheck's version all the same); neither a compile nor a
    hit imports the modules that save and load compiled functions."""
    script = tmp_path / "cached.py"
    watched = ("onnx", "qnnx_opcheck", "qnnx_backend._aot", "qnnx_backend._aot_load")
    script.write_text(_CACHE_SCRIPT + f"print(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))\n")
    cache = tmp_path / "cache"
    runs = [
        subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    (miss, miss_modules), (hit, hit_modules) = [(_last_json(p, -2), _last_json(p)) for p in runs]
    assert miss["cache"] == "miss" and miss_modules == ["onnx", "qnnx_opcheck"]
    assert hit["cache"] == "hit" and hit_modules == []
