"""Benchmark qnnx_opcheck.check_model on a large graph (speed lives here, never in tests).

    python tools/opcheck/bench.py                 # 10,000-node chain with external weights, 5 runs
    python tools/opcheck/bench.py --nodes 50000

Prints the median and best wall time of check_model (load without weights + inline + shape inference +
verdicts) and of its stages.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(path: Path, n_nodes: int) -> None:
    nodes, inits = [], []
    prev = "x"
    for i in range(n_nodes // 2):
        inits.append(numpy_helper.from_array(np.full((256,), i, np.float32), f"b{i}"))
        nodes.append(helper.make_node("Add", [prev, f"b{i}"], [f"a{i}"], name=f"add{i}"))
        nodes.append(helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    g = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4, 256])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.save_model(m, path, save_as_external_data=True, location=path.name + ".data", size_threshold=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    import qnnx_opcheck as oc
    from qnnx_opcheck import _model, _rules, _tables

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.onnx"
        build(path, args.nodes)
        size = path.stat().st_size + (Path(tmp) / "bench.onnx.data").stat().st_size
        oc.check_model(path)  # warm caches (schemas, tables)
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            rep = oc.check_model(path)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        proto, source, notes = _model.load_model(path)
        t1 = time.perf_counter()
        facts = _model.read_facts(proto, notes, source)
        t2 = time.perf_counter()
        table, _ = _tables.load_table("htp")
        _rules.Checker(table, facts).verdicts()
        t3 = time.perf_counter()
    print(f"{args.nodes} nodes, {size / 1e6:.1f} MB on disk: {rep.summary()}")
    print(f"check_model: median {statistics.median(times):.3f} s, best {min(times):.3f} s over {args.runs} runs")
    print(f"stages: load {t1 - t0:.3f} s, inline+infer+facts {t2 - t1:.3f} s, verdicts {t3 - t2:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
