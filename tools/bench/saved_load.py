"""Benchmark: start-up of a model saved with ``qnnx_backend.save``, loaded with and without building the model.

Each phase runs in a fresh process, alternating, ``--reps`` times (medians printed, one JSON line per phase):

- ``no-model``: ``qnnx_backend.load`` and the first call (the module is never built; transformers' model code is
  never imported);
- ``with-model``: ``transformers`` imported, the model built from its config, then the same load and first call
  (what a loader that needs the module object pays on top);
- ``arrays``: ``qnnx_backend.load_arrays`` and the first call, in a process where torch is never imported.

Usage: python tools/bench/saved_load.py [--reps 3]. Not a test: timings are never asserted.
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

_BERT = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
}

SAVE = textwrap.dedent(
    """
    import json, sys, torch, transformers, qnnx_backend
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**json.loads(sys.argv[2]))).eval()
    ids = torch.randint(1, 128, (1, 16), generator=torch.Generator().manual_seed(1))
    report = qnnx_backend.save(model, ids, sys.argv[1], options={"soc_model": 60, "strict": True, "cache": False})
    import numpy as np
    np.save(sys.argv[1] + ".ids.npy", ids.numpy())
    print(json.dumps({"file_bytes": report.file_bytes}))
    """
)

CHILD = textwrap.dedent(
    """
    import json, sys, time
    phase, path, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    t0 = time.perf_counter()
    import numpy as np
    if phase != "arrays":
        import torch
    import qnnx_backend
    ids = np.load(path + ".ids.npy")
    t_imports = time.perf_counter()
    if phase == "with-model":
        import transformers
        torch.manual_seed(0)
        transformers.BertModel(transformers.BertConfig(**config)).eval()
    t_model = time.perf_counter()
    if phase == "arrays":
        model = qnnx_backend.load_arrays(path)
        model(ids)
    else:
        model = qnnx_backend.load(path)
        model(torch.from_numpy(ids))
    t_end = time.perf_counter()
    print(json.dumps({
        "imports_s": t_imports - t0,
        "build_model_s": t_model - t_imports,
        "load_and_first_call_s": t_end - t_model,
        "after_imports_s": t_end - t_imports,
        "torch_imported": "torch" in sys.modules,
    }))
    """
)


def _run(code: str, *args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    config = json.dumps(_BERT)
    with tempfile.TemporaryDirectory(prefix="qnnx-bench-saved-") as folder:
        path = str(Path(folder) / "bert.qnnx")
        saved = _run(SAVE, path, config)
        runs: dict[str, list[dict[str, object]]] = {"no-model": [], "with-model": [], "arrays": []}
        for _ in range(args.reps):
            for phase, results in runs.items():
                results.append(_run(CHILD, phase, path, config))
    for phase, results in runs.items():
        medians = {
            key: round(statistics.median(float(r[key]) for r in results), 3)  # type: ignore[arg-type]
            for key in ("imports_s", "build_model_s", "load_and_first_call_s", "after_imports_s")
        }
        row = {"phase": phase, "model": "tiny BERT", **saved, **medians, "torch_imported": results[0]["torch_imported"]}
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
