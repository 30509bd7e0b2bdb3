"""End-to-end runs in fresh processes: the entry point, a quiet stdout, and the context cache across processes."""

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
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, *, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def test_backend_qnn_works_without_importing_qnnx():
    """The issue's one-liner: torch.compile(backend='qnn') in a fresh process that never imports qnnx."""
    proc = _run(
        """
        import torch
        m = torch.nn.Linear(8, 4).eval()
        with torch.no_grad():
            print(torch.compile(m, backend='qnn', options={'device': 'npu', 'strict': True})(torch.randn(2, 8)))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tensor(")


def test_nothing_but_the_program_output_reaches_stdout_and_stderr():
    """The simulator's LIBNATIVE line and ORT's session warnings do not reach the user's stdout or stderr."""
    proc = _run(
        """
        import torch
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
        with torch.no_grad():
            y = torch.compile(m, backend='qnn', options={'device': 'npu', 'strict': True})(torch.randn(2, 8))
        print('shape', tuple(y.shape))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "shape (2, 8)\n"
    assert "LIBNATIVE" not in proc.stderr and "onnxruntime" not in proc.stderr.lower(), proc.stderr


_CACHE_SCRIPT = """
import json, sys, torch
import qnnx_backend
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
x = torch.randn(3, 16)
with torch.no_grad():
    y = torch.compile(m, backend='qnn', options={'device': 'npu', 'strict': True, 'cache': True,
                                                  'cache_dir': sys.argv[1]})(x)
    ref = m(x)
r = qnnx_backend.compile_reports()[-1]
print(json.dumps({"cache": r.cache, "device": r.device, "stages": sorted(r.timings),
                  "err": ((y - ref).abs().max() / ref.abs().max()).item()}))
"""


def test_context_cache_is_reused_by_a_second_process(tmp_path):
    """A second process with the same model and options loads the compiled context: no export, same answer."""
    script = tmp_path / "cached.py"
    script.write_text(_CACHE_SCRIPT)
    results = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "cache")], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = results
    assert first["cache"] == "miss" and "export" in first["stages"]
    assert second["cache"] == "hit" and "export" not in second["stages"]
    assert first["device"] == second["device"] == "npu"
    assert first["err"] < 2e-2 and second["err"] < 2e-2


def test_layering_rule_holds():
    """Leaves never import each other; only export and backend import torch; opcheck/export never import ORT."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "check_layers.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _check_layers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_layers", ROOT / "tools" / "check_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("package", "code", "broken"),
    [
        ("clikit", "import attrs", "foundation qnnx-clikit imports attrs"),
        ("clikit", "import qnnx_detection", "foundation qnnx-clikit imports qnnx_detection"),
        ("detection", "from qnnx_opcheck import check_model", "leaf qnnx-detection imports qnnx_opcheck"),
        ("opcheck", "import torch", "qnnx-opcheck imports torch"),
        ("export", "import onnxruntime", "qnnx-export imports onnxruntime"),
        ("backend", "import qnnx_testkit", "imports qnnx_testkit"),
        ("detection", "def f():\n    import qnnx_testkit.strategies", "imports qnnx_testkit"),
        ("detection", "import qnnx_clikit", None),
        ("backend", "import qnnx_export, qnnx_ctxcache, torch, onnxruntime", None),
        ("testkit", "import qnnx_testkit, hypothesis", None),
    ],
)
def test_the_layering_check_catches_each_broken_rule(tmp_path, package, code, broken):
    """Each rule of tools/check_layers.py fires on a tree that breaks it, and allowed imports pass."""
    src = tmp_path / "packages" / package / "src" / f"qnnx_{package}"
    src.mkdir(parents=True)
    # The backend's modules are declared in its layer order: the last layer may import any package.
    (src / ("__init__.py" if package == "backend" else "mod.py")).write_text(code + "\n")
    found = _check_layers().violations(tmp_path)
    if broken is None:
        assert found == []
    else:
        assert len(found) == 1 and broken in found[0], found


def _backend_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "packages" / "backend" / "src" / "qnnx_backend"
    src.mkdir(parents=True)
    for name, code in files.items():
        (src / f"{name}.py").write_text(textwrap.dedent(code))
    return tmp_path


@pytest.mark.parametrize(
    "code",
    [
        "from qnnx_backend import _compiled",
        "from qnnx_backend._compiled import QnnGraph",
        "import qnnx_backend._compiled",
        "def f():\n    from qnnx_backend import _compiled",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from qnnx_backend._compiled import QnnGraph",
        "from . import _compiled",
        "from qnnx_backend import calibrate",  # the package's face is the last layer
    ],
)
def test_the_layering_check_refuses_an_import_up_the_backend_order(tmp_path, code):
    """A backend module importing a module of a later layer (at module level, in a function, for type checking
    only, relatively, or through the package) breaks the declared order."""
    tree = _backend_tree(tmp_path, {"_export": code, "_compiled": "", "__init__": "from qnnx_backend._export import *"})
    found = _check_layers().violations(tree)
    assert len(found) == 1 and "_export.py: _export (export) imports" in found[0], found


def test_the_layering_check_refuses_an_import_within_one_layer_and_an_undeclared_module(tmp_path):
    """Modules of one layer do not import each other, and every backend module must have a declared layer."""
    tree = _backend_tree(tmp_path, {"_aot": "from qnnx_backend import _aot_load", "_aot_load": "", "_extra": ""})
    found = _check_layers().violations(tree)
    assert len(found) == 2, found
    assert "_aot (save and load) imports _aot_load (save and load)" in found[0]
    assert "_extra is not in tools/check_layers.py's BACKEND_LAYERS" in found[1]


@settings(deadline=None)
@given(data=st.data())
def test_the_backend_order_holds_exactly_when_every_import_points_down(tmp_path_factory, data):
    """For any backend modules importing each other, the check names exactly the imports of a module of the same
    or a later layer."""
    layers = _check_layers().BACKEND_LAYERS
    rank = {m: k for k, (_, names) in enumerate(layers) for m in names}
    names = data.draw(st.lists(st.sampled_from(sorted(rank)), min_size=2, max_size=6, unique=True))
    edges = data.draw(st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names)), max_size=8, unique=True))
    edges = [(a, b) for a, b in edges if a != b and b != "__init__"]
    files = {
        n: "".join(f"def f{k}():\n    from qnnx_backend import {b}\n" for k, (a, b) in enumerate(edges) if a == n)
        for n in names
    }
    tree = _backend_tree(tmp_path_factory.mktemp("tree"), files)
    found = _check_layers().backend_order(tree)
    expected = sorted({(a, b) for a, b in edges if rank[b] >= rank[a]})
    assert [(f.split(": ")[1].split(" ")[0], f.split(" imports ")[1].split(" ")[0]) for f in found] == expected


@pytest.mark.parametrize(
    ("code", "broken"),
    [
        ("from qnnx_detection._ep import _secret", "qnnx_detection._ep._secret"),
        ("from ._ep import _secret", "qnnx_detection._ep._secret"),
        ("from qnnx_detection import _ep\nx = _ep._secret", "qnnx_detection._ep._secret"),
        ("import qnnx_detection._ep as ep\nx = ep._secret", "qnnx_detection._ep._secret"),
        ("import qnnx_detection\nx = qnnx_detection._ep._secret", "qnnx_detection._ep._secret"),
        ("from qnnx_detection import _hidden", "qnnx_detection._hidden"),
        ("from qnnx_detection import _ep\nx = _ep.secret", None),
        ("from qnnx_detection._ep import __doc__", None),
        ("import attrs\nx = attrs._make", None),
    ],
)
def test_the_layering_check_refuses_another_modules_private_name(tmp_path, code, broken):
    """A module importing or reading another module's private name (not a submodule) breaks the rule, in any
    package; public internal names, dunders and other projects' names pass."""
    src = tmp_path / "packages" / "detection" / "src" / "qnnx_detection"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("_hidden = 1\n")
    (src / "_ep.py").write_text("_secret = secret = 1\nprint(_secret)\n")
    (src / "_reader.py").write_text(code + "\n")
    found = _check_layers().violations(tmp_path)
    if broken is None:
        assert found == []
    else:
        assert found == [
            f"packages/detection/src/qnnx_detection/_reader.py: uses the private name {broken} of another module "
            "(make it a public internal name)"
        ]


def test_known_private_uses_are_allowed_and_a_gone_one_is_reported(tmp_path, monkeypatch):
    """An entry of KNOWN_PRIVATE_USES lets that one use pass; once the use is gone the entry is reported stale."""
    check = _check_layers()
    src = tmp_path / "packages" / "detection" / "src" / "qnnx_detection"
    src.mkdir(parents=True)
    (src / "_ep.py").write_text("_x = 1\n")
    (src / "_probe.py").write_text("from qnnx_detection._ep import _x\n")
    entry = "packages/detection/src/qnnx_detection/_probe.py: qnnx_detection._ep._x"
    monkeypatch.setattr(check, "KNOWN_PRIVATE_USES", frozenset({entry}))
    assert check.violations(tmp_path) == [] and check.stale_allowances(tmp_path) == []
    (src / "_probe.py").write_text("from qnnx_detection import _ep\n")
    assert check.stale_allowances(tmp_path) == [entry]


def test_the_backend_follows_its_declared_order_and_uses_no_private_name_of_another_module():
    """The real tree: every backend module is declared and imports down the order only; no backend module uses
    another module's private name."""
    check = _check_layers()
    assert check.backend_order(ROOT) == []
    assert [u for u in check.private_uses(ROOT) if u.startswith("packages/backend/")] == []


def test_importing_packages_does_no_work():
    """Importing any qnnx package starts no QNN session and imports neither torch nor onnxruntime (leaves)."""
    proc = _run(
        """
        import sys
        import qnnx_detection, qnnx_opcheck, qnnx_ctxcache
        heavy = sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules)
        import qnnx_backend
        print(','.join(heavy) or '-', 'torch' in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["-", "False"]


def test_corrupted_cached_context_is_detected_and_rebuilt(tmp_path):
    """Bytes overwritten in a cached QNN context (which QNN would load and run wrongly) are caught by the cache's
    checksums in the next process: the entry is rebuilt and the answer is right."""
    script = tmp_path / "cached.py"
    script.write_text(_CACHE_SCRIPT)
    cache = tmp_path / "cache"

    def run() -> dict:
        proc = subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert run()["cache"] == "miss"
    (binary,) = [p for p in cache.rglob("*.bin") if "quarantine" not in p.parts]
    data = bytearray(binary.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = b"\xff" * 8  # same size: only a checksum can tell
    binary.write_bytes(bytes(data))
    again = run()
    assert again["cache"] == "miss" and again["err"] < 2e-2
    assert run()["cache"] == "hit"


def test_a_context_whose_load_kills_the_process_is_quarantined_and_rebuilt(tmp_path):
    """A process that dies while loading a cached context (a native crash in the EP) leaves the store's loading
    marker behind: the next process quarantines that entry and compiles again instead of crashing too."""
    script = tmp_path / "cached.py"
    script.write_text(_CACHE_SCRIPT)
    crashing = tmp_path / "crashing.py"
    crashing.write_text(
        "import os, qnnx_backend._session as s\n"
        "real = s.create_for_device\n"
        "def dies(model, *a, **k):\n"
        "    if str(model).endswith('model_ctx.onnx'):\n"
        "        os._exit(3)  # as a native crash would: no Python clean-up\n"
        "    return real(model, *a, **k)\n"
        "s.create_for_device = dies\n" + _CACHE_SCRIPT
    )
    cache = tmp_path / "cache"

    def run(path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(path), str(cache)], capture_output=True, text=True, timeout=300)

    assert json.loads(run(script).stdout.strip().splitlines()[-1])["cache"] == "miss"
    assert run(crashing).returncode == 3
    again = run(script)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["cache"] == "miss"  # rebuilt, not loaded
    assert any(p.name.endswith(".json") for p in cache.glob("*/quarantine/*"))  # with its reason
    assert json.loads(run(script).stdout.strip().splitlines()[-1])["cache"] == "hit"


_COMPILE_SCRIPT = """
import json, sys, warnings, torch
import qnnx_backend
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
x = torch.randn(3, 16)
options = {'strict': True} if sys.argv[1:] == ['strict'] else {}
if sys.argv[1:] == ['explain']:
    with torch.no_grad():
        g = qnnx_backend.explain(m, x).graphs[0]
    print(json.dumps({"device": g.final_device, "reasons": [d.reason for d in g.devices]}))
    raise SystemExit(0)
with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter('ignore')
    try:
        y = torch.compile(m, backend='qnn', options=options)(x)
    except Exception as exc:
        print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
        raise SystemExit(0)
    ref = m(x)
r = qnnx_backend.compile_reports()[-1]
print(json.dumps({"device": r.device, "reason": r.reason, "err": ((y - ref).abs().max() / ref.abs().max()).item()}))
"""


def test_a_graph_whose_compile_killed_a_process_is_not_compiled_again(tmp_path):
    """A process that dies while QNN compiles a graph (a native crash: SIGABRT here, as ONNX Runtime's own bounds
    assertions end it) leaves a record in the context store: the next process with the same graph and options does
    not compile it for the NPU again, runs it on the next device with eager's answer and says why (strict raises
    it); clearing the store forgets the record."""
    script = tmp_path / "compile.py"
    script.write_text(_COMPILE_SCRIPT)
    crashing = tmp_path / "crashing.py"
    crashing.write_text(
        "import os, qnnx_backend._session as s\n"
        "def dies(model, *a, **k):\n"
        "    os.abort()  # as a native crash in the EP would: SIGABRT, no Python clean-up\n"
        "s.create_for_device = dies\n" + _COMPILE_SCRIPT
    )
    store, scratch = tmp_path / "store", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "QNNX_CTXCACHE_DIR": str(store), "QNNX_CACHE": "0", "TMPDIR": str(scratch)}

    def run(path, *args) -> dict:
        proc = subprocess.run(
            [sys.executable, str(path), *args], capture_output=True, text=True, timeout=300, env=env, check=False
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert run(script)["device"] == "npu"
    assert run(script, "explain")["device"] == "npu"
    died = subprocess.run([sys.executable, str(crashing)], capture_output=True, text=True, timeout=300, env=env)
    assert died.returncode == -signal.SIGABRT
    left = [p for p in scratch.iterdir() if p.name.startswith("qnnx-model-")]  # the dead process's staged model
    assert left, sorted(p.name for p in scratch.iterdir())
    for path in left:  # as if it died a while ago
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    after = run(script)
    assert not any(p.exists() for p in left), "the next process removes a dead process's scratch folders"
    assert after["device"] != "npu" and after["err"] < 1e-5, after
    assert "died while QNN compiled this graph" in after["reason"], after
    explained = run(script, "explain")  # explain() reads the same record as the compile
    assert explained["device"] != "npu" and "died while QNN compiled" in explained["reasons"][0], explained
    strict = run(script, "strict")
    assert strict.get("raised") == "QnnDeviceError" and "died while QNN compiled" in strict["message"], strict
    cleared = subprocess.run(
        [sys.executable, "-m", "qnnx_ctxcache", "--root", str(store), "clear"], capture_output=True, text=True
    )
    assert cleared.returncode == 0, cleared.stderr
    assert run(script)["device"] == "npu"
