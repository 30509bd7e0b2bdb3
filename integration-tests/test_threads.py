"""Threads: concurrent first compiles in a fresh process, and calls of compiled graphs during another compile."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from integration_helpers import assert_close_fp16

from qnnx_testkit import pythonpath_env

HERE = Path(__file__).resolve().parent

# Each thread compiles a different tiny model and calls it; two barriers make the first torch.compile calls (the
# backend's entry-point lookup) and then the first calls (Dynamo's trace and qnnx's compile) start together. qnnx is
# imported only afterwards, so the process's first backend="qnn" really goes through the entry point.
_CONCURRENT = textwrap.dedent(
    """
    import sys, threading, traceback
    import torch
    from torch import nn
    from integration_models import MLP, SmallCNN, randomize_batchnorm

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    cases = [
        (MLP((16, 32, 8)), (4, 16)),
        (randomize_batchnorm(SmallCNN()), (2, 3, 16, 16)),
        (nn.Sequential(nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16)), (2, 32)),
        (Residual(), (3, 16)),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()), (2, 3, 8, 8)),
    ]
    inputs = [torch.randn(*shape) for _, shape in cases]
    refs, got, errors = [None] * len(cases), [None] * len(cases), []
    before_compile, before_call = threading.Barrier(len(cases)), threading.Barrier(len(cases))

    def work(i):
        model = cases[i][0].eval()
        try:
            with torch.no_grad():
                refs[i] = model(inputs[i])
                before_compile.wait()
                compiled = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True})
                before_call.wait()
                got[i] = compiled(inputs[i])
        except BaseException:
            errors.append(f"model {i}: {traceback.format_exc()}")
            before_compile.abort()
            before_call.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import qnnx_backend

    reports = [(r.graph_id, r.device, r.reason) for r in qnnx_backend.compile_reports()]
    torch.save({"refs": refs, "got": got, "errors": errors, "reports": reports}, sys.argv[1])
    """
)

_MODELS = 5


def _run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **pythonpath_env(HERE)}  # the child imports integration_models
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout, cwd=HERE, env=env
    )


def _concurrent_compiles_in_fresh_processes(tmp_path: Path, runs: int) -> None:
    for run in range(runs):
        out = tmp_path / f"run{run}.pt"
        proc = _run(_CONCURRENT, str(out))
        assert proc.returncode == 0, f"run {run}: {proc.stderr[-3000:]}"
        result = torch.load(out, weights_only=True)
        assert not result["errors"], f"run {run}:\n" + "\n".join(result["errors"])
        for i, (got, ref) in enumerate(zip(result["got"], result["refs"], strict=True)):
            assert got is not None, f"run {run}: model {i} gave no output"
            assert_close_fp16(got, ref, rel=1e-2)
        devices = [device for _, device, _ in result["reports"]]
        assert devices == ["npu"] * _MODELS, f"run {run}: {result['reports']}"


def test_concurrent_first_compiles_in_a_fresh_process_all_run_on_the_npu(tmp_path):
    """Five threads compiling and calling different models at once in a fresh process all get NPU results equal to eager."""
    _concurrent_compiles_in_fresh_processes(tmp_path, runs=3)


@pytest.mark.slow
def test_concurrent_first_compiles_in_a_fresh_process_many_times(tmp_path):
    """Opt-in: the same, in 20 fresh processes (the races it guards against were intermittent)."""
    _concurrent_compiles_in_fresh_processes(tmp_path, runs=20)


# Thread A calls an already compiled graph in a loop; thread B compiles another model, and B's export (which runs
# under Dynamo's compile lock) waits until A has completed calls while it is inside: so A's calls overlapped B's
# compile, ordered by events rather than by timing. The wait's timeout only turns a deadlock into a failure.
_CALLS_DURING_COMPILE = textwrap.dedent(
    """
    import json, sys, threading, traceback
    import torch
    from torch import nn
    import qnnx_backend
    import qnnx_export
    from torch._dynamo.convert_frame import compile_lock

    NPU = {"device": "npu", "strict": True}
    torch.manual_seed(0)
    model_a = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    model_b = nn.Sequential(nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 16)).eval()
    x_a, x_b = torch.randn(4, 16), torch.randn(2, 32)
    cond = threading.Condition()
    state = {"calls": 0, "in_export": False, "at_start": None, "during": None, "at_end": None, "lock_held": None}
    a_ready, stop, errors = threading.Event(), threading.Event(), []
    real_export = qnnx_export.export

    def slow_export(*args, **kwargs):
        if threading.current_thread().name == "B":
            # Is Dynamo's compile lock held here (by B)? Ask from another thread, without waiting.
            free = []

            def probe():
                free.append(compile_lock.acquire(blocking=False))
                if free[0]:
                    compile_lock.release()

            t = threading.Thread(target=probe)
            t.start()
            t.join()
            with cond:
                state["lock_held"] = not free[0]
                state["in_export"] = True
                start = state["at_start"] = state["calls"]
                cond.wait_for(lambda: state["calls"] >= start + 3, timeout=120)
                state["during"] = state["calls"] - start
                state["in_export"] = False
        return real_export(*args, **kwargs)

    qnnx_export.export = slow_export

    def caller():
        try:
            with torch.no_grad():
                compiled = torch.compile(model_a, backend="qnn", options=NPU)
                ref = model_a(x_a)
                compiled(x_a)  # compiles A's graph
                a_ready.set()
                while not stop.is_set():
                    err = ((compiled(x_a) - ref).abs().max() / ref.abs().max()).item()
                    assert err <= 1e-2, err
                    with cond:
                        state["calls"] += 1
                        cond.notify_all()
        except BaseException:
            errors.append("A: " + traceback.format_exc())
            a_ready.set()

    def compiler():
        try:
            a_ready.wait()
            with torch.no_grad():
                got = torch.compile(model_b, backend="qnn", options=NPU)(x_b)
                ref = model_b(x_b)
            state["at_end"] = state["calls"]
            state["b_err"] = ((got - ref).abs().max() / ref.abs().max()).item()
        except BaseException:
            errors.append("B: " + traceback.format_exc())
        finally:
            stop.set()

    threads = [threading.Thread(target=caller, name="A"), threading.Thread(target=compiler, name="B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state["errors"] = errors
    state["devices"] = [r.device for r in qnnx_backend.compile_reports()]
    with open(sys.argv[1], "w") as f:
        json.dump(state, f)
    """
)


def test_calls_of_a_compiled_graph_run_while_another_thread_compiles(tmp_path):
    """A compiled graph keeps answering in one thread while another thread's compile holds Dynamo's compile lock."""
    import json

    out = tmp_path / "state.json"
    proc = _run(_CALLS_DURING_COMPILE, str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads(out.read_text())
    assert not state["errors"], "\n".join(state["errors"])
    assert state["lock_held"] is True, "B's export did not run under Dynamo's compile lock"
    assert state["during"] >= 3, f"A completed {state['during']} calls while B was compiling"
    assert state["at_start"] + state["during"] <= state["at_end"]  # counted between compile start and end
    assert state["b_err"] <= 1e-2
    assert state["devices"] == ["npu", "npu"]


_HANDLER_TABLE = textwrap.dedent(
    """
    import json, sys, threading
    from qnnx_export import _fast

    builds, real_register = [], _fast._register

    def counting_register():
        builds.append(threading.current_thread().name)
        real_register()

    _fast._register = counting_register
    start, sizes = threading.Barrier(6), []

    def use():
        start.wait()
        sizes.append(len(_fast.supported_ops()))

    threads = [threading.Thread(target=use) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"builds": len(builds), "sizes": sizes}))
    """
)


def test_fast_path_handler_table_is_built_once_for_concurrent_first_uses():
    """Six threads using the fast exporter's handler table at once build it once and all see it whole."""
    import json

    proc = _run(_HANDLER_TABLE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["builds"] == 1
    assert len(result["sizes"]) == 6 and len(set(result["sizes"])) == 1 and result["sizes"][0] > 50
