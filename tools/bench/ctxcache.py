"""Benchmark: QNN HTP session start-up cold (compile) vs warm (qnnx-ctxcache hit), each in a fresh process.

Usage: python tools/bench/ctxcache.py [--reps 3] [--width 256] [--depth 4]
Prints a JSON line per phase with the median seconds. Not a test: timings are never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import os, sys, time, json
    phase, model, root = sys.argv[1], sys.argv[2], sys.argv[3]
    t0 = time.perf_counter()
    import onnxruntime as ort, onnxruntime_qnn as oq
    import qnnx_ctxcache as cc
    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")
    opts = {"backend_path": oq.get_qnn_htp_path(), "soc_model": "60"}
    def so(extra=()):
        s = ort.SessionOptions()
        s.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        for k, v in extra:
            s.add_session_config_entry(k, v)
        s.add_provider_for_devices([dev], opts)
        return s
    t_ready = time.perf_counter()
    if phase == "cold":
        ort.InferenceSession(model, sess_options=so())
        hit = None
    else:
        store = cc.ContextStore(root)
        key = cc.make_key(model_digest=cc.digest_model(model), ep_name="QNNExecutionProvider",
                          ep_options=opts, versions={"onnxruntime": ort.__version__, "onnxruntime-qnn": oq.__version__})
        def build(staging):
            ort.InferenceSession(model, sess_options=so([("ep.context_enable", "1"),
                ("ep.context_file_path", str(staging / "model_ctx.onnx")), ("ep.context_embed_mode", "0")]))
            return cc.BuildResult()
        entry = store.get_or_create(key, build)
        t_lookup = time.perf_counter()
        ort.InferenceSession(str(entry.model_path), sess_options=so())
        hit = entry.hit
    t_done = time.perf_counter()
    lookup = (t_lookup - t_ready) if phase != "cold" else None
    print(json.dumps({"phase": phase, "hit": hit, "session_s": t_done - t_ready, "store_s": lookup}))
    """
)


def make_model(path: Path, width: int, depth: int) -> int:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(depth):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]),
            helper.make_node("Relu", [f"h{i}"], [f"r{i}"]),
        ]
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, width])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [8, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path.stat().st_size


def run(phase: str, model: Path, root: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, phase, str(model), str(root)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ctxcache-bench-"))
    model = work / "mlp.onnx"
    size = make_model(model, args.width, args.depth)
    results: dict[str, list[float]] = {"cold": [], "compile+store": [], "warm": [], "warm_store_lookup": []}
    for rep in range(args.reps):
        root = work / f"cache{rep}"
        results["cold"].append(float(run("cold", model, root)["session_s"]))  # type: ignore[arg-type]
        first = run("cached", model, root)
        assert first["hit"] is False
        results["compile+store"].append(float(first["session_s"]))  # type: ignore[arg-type]
        second = run("cached", model, root)
        assert second["hit"] is True
        results["warm"].append(float(second["session_s"]))  # type: ignore[arg-type]
        results["warm_store_lookup"].append(float(second["store_s"]))  # type: ignore[arg-type]
    for phase, values in results.items():
        median = round(statistics.median(values), 4)
        print(
            json.dumps(
                {"phase": phase, "model_bytes": size, "median_s": median, "all_s": [round(v, 4) for v in values]}
            )
        )


if __name__ == "__main__":
    main()
