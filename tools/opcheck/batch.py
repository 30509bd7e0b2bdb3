"""The batched form of tools/opcheck/conformance.py's runner: many models through one child process on QNN HTP.

conformance.py runs one child per case; that costs a process start and the simulator's set-up per case. Here one
child takes a list of models in order and writes one JSON line per finished model, so a native crash costs the one
model that was running: the parent records it as ``crash`` and starts a new child after it. Each session is built
as conformance.py builds it (tools/opcheck/probe.py's ``_session``: CPU fallback disabled, explicit soc_model).

Used by tools/opcheck/node_tests.py; ``python tools/opcheck/batch.py --child FOLDER`` is the child's entry.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
# fp16-level: HTP computes float graphs in float16 (conformance.py's tolerance, plus an absolute floor for outputs
# near zero).
TOLERANCE = 1e-2
ABSOLUTE_FLOOR = 1e-3


def within_tolerance(got: Any, want: Any) -> tuple[bool, float, str]:
    """Whether one output of QNN matches the expected one at fp16 level: same shape; integers and bools equal; floats
    within 1e-2 of the output's scale plus an absolute floor of 1e-3 over the finite values, with NaN and inf at the
    same positions. Returns (match, error relative to the scale, why not)."""
    a, b = np.asarray(got), np.asarray(want)
    if a.shape != b.shape:
        return False, float("inf"), f"shape {list(a.shape)} vs {list(b.shape)}"
    if a.size == 0:
        return True, 0.0, ""
    if b.dtype.kind not in "fc":
        same = bool(np.array_equal(a.astype(b.dtype) if a.dtype != b.dtype else a, b))
        return same, 0.0 if same else 1.0, "" if same else f"{int((a != b).sum())} of {b.size} values differ"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if not np.array_equal(np.isnan(a64), np.isnan(b64)):
        return False, float("inf"), "NaN positions differ"
    if not np.array_equal(np.isinf(a64), np.isinf(b64)) or not np.array_equal(a64[np.isinf(b64)], b64[np.isinf(b64)]):
        return False, float("inf"), "inf positions differ"
    fin = np.isfinite(b64)
    if not fin.any():
        return True, 0.0, ""
    scale = float(np.abs(b64[fin]).max())
    err = float(np.abs(a64[fin] - b64[fin]).max())
    rel = err / max(scale, 1e-6)
    ok = err <= TOLERANCE * scale + ABSOLUTE_FLOOR
    return ok, rel, "" if ok else f"max error {err:.3g} at scale {scale:.3g}"


@dataclass
class LiveItem:
    """One model for :func:`run_batch`: feeds, and the expected outputs (None: compare with the CPU EP)."""

    name: str
    model: bytes
    feeds: dict[str, Any]
    expected: list[Any] | None = None


def _run_one(ort: Any, oq: Any, item: LiveItem, soc_model: str) -> dict[str, Any]:
    """The outcome of one item on QNN HTP with CPU fallback disabled: refused (with the error), right or wrong."""
    import probe

    want = item.expected
    if want is None:
        try:
            want = ort.InferenceSession(item.model, providers=["CPUExecutionProvider"]).run(None, item.feeds)
        except Exception as exc:  # no reference: the case says nothing
            return {"outcome": "no_reference", "error": str(exc)[-200:]}
    stage = "session"
    try:
        session = probe._session(ort, oq, item.model, soc_model, fallback=False, severity=3)
        stage = "run"
        got = session.run(None, item.feeds)
    except Exception as exc:  # any refusal of the EP is an outcome
        text = str(exc).strip().splitlines()[0][-240:] if str(exc).strip() else type(exc).__name__
        result: dict[str, Any] = {"outcome": "refused", "stage": stage, "error": text}
        if "assigned to the default CPU EP" in text:
            # Again at log severity 0, only for the EP's REASON lines (which node it declined, and why).
            with contextlib.suppress(Exception):
                probe._session(ort, oq, item.model, soc_model, fallback=False, severity=0)
            result["declined"] = "see log"
        return result
    if len(got) != len(want):
        return {"outcome": "wrong", "err": float("inf"), "why": f"{len(got)} outputs, expected {len(want)}"}
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        ok, err, reason = within_tolerance(g, w)
        worst = max(worst, err)
        if not ok:
            return {
                "outcome": "wrong",
                "err": err,
                "why": reason,
                "fp16_inputs": _fp16_explains(ort, item, got),
                "nonfinite_inputs": _nonfinite_explains(item, got, want),
            }
    return {"outcome": "right", "err": worst}


def _nonfinite_explains(item: LiveItem, got: list[Any], want: list[Any]) -> bool:
    """Whether a float feed holds inf or NaN and the outputs match wherever the expected one is finite: HTP has no
    infinities nor NaN (it reads them as large finite numbers), a property of the hardware for runtime data."""
    floats = [v for v in item.feeds.values() if getattr(v, "dtype", np.dtype("O")).kind == "f"]
    if not any(not np.isfinite(v).all() for v in floats):
        return False
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        if w.dtype.kind != "f":
            if not within_tolerance(g, w)[0]:
                return False
            continue
        g = np.asarray(g)
        if g.shape != w.shape:
            return False
        fin = np.isfinite(w)
        if not within_tolerance(np.where(fin, g, 0), np.where(fin, w, 0))[0]:
            return False
    return True


def _fp16_explains(ort: Any, item: LiveItem, got: list[Any]) -> bool:
    """Whether QNN's outputs match the CPU EP's on the float32 feeds rounded to fp16: the difference is then what
    HTP's fp16 arithmetic does to the inputs (10001 is 10000 in fp16), not a defect of the op."""
    feeds = {k: v.astype(np.float16).astype(np.float32) if getattr(v, "dtype", None) == np.float32 else v
             for k, v in item.feeds.items()}  # fmt: skip
    if all(feeds[k] is item.feeds[k] for k in feeds):
        return False
    try:
        ref = ort.InferenceSession(item.model, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:
        return False
    return all(within_tolerance(g, r)[0] for g, r in zip(got, ref, strict=True))


def _batch_child(folder: str, soc_model: str) -> None:
    """Run the pickled items of ``folder`` in order, appending one JSON line per finished item to its results file
    (the parent restarts after the item that was running when a crash stopped this process)."""
    import pickle

    sys.path.insert(0, str(HERE))
    import onnxruntime as ort
    import onnxruntime_qnn as oq
    import probe

    items: list[LiveItem] = pickle.loads(Path(folder, "items.pkl").read_bytes())
    start = int(Path(folder, "start").read_text())
    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
    log = os.path.join(folder, "native.log")
    with open(os.path.join(folder, "results.jsonl"), "a") as out:
        for item in items[start:]:
            Path(log).write_text("")
            saved = probe._quiet_fds(log)
            try:
                result = _run_one(ort, oq, item, soc_model)
            finally:
                probe._restore_fds(saved)
            if result.get("declined"):
                result["declined"] = probe._reasons(Path(log).read_text(errors="replace"))
            out.write(json.dumps({"name": item.name, **result}) + "\n")
            out.flush()


def run_batch(items: list[LiveItem], soc_model: str, timeout: float) -> dict[str, dict[str, Any]]:
    """Run ``items`` in as few child processes as crashes allow: one child takes the items in order; when it dies
    (a signal, or no item finished within ``timeout`` seconds), the item it was running is a ``crash`` and a new
    child goes on with the next one. Returns name -> outcome."""
    import pickle
    import shutil

    folder = tempfile.mkdtemp(prefix="qnnx-batch-")
    Path(folder, "items.pkl").write_bytes(pickle.dumps(items))
    results_path = Path(folder, "results.jsonl")
    results_path.touch()
    done: dict[str, dict[str, Any]] = {}
    try:
        while len(done) < len(items):
            start = len(done)
            Path(folder, "start").write_text(str(start))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", folder, "--soc-model", soc_model]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            seen, last = start, time.monotonic()
            while proc.poll() is None:
                time.sleep(0.2)
                lines = results_path.read_text().splitlines()
                if len(lines) > seen:
                    seen, last = len(lines), time.monotonic()
                elif time.monotonic() - last > timeout:
                    os.killpg(proc.pid, 9)
                    proc.wait()
            rc = proc.returncode
            stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            for line in results_path.read_text().splitlines()[len(done) :]:
                row = json.loads(line)
                done[row.pop("name")] = row
            if len(done) < len(items):
                name = items[len(done)].name
                if rc == 0:  # the child ended without a crash and without finishing: a harness error
                    done[name] = {"outcome": "probe_error", "error": stderr[-300:]}
                else:
                    done[name] = {"outcome": "crash", "rc": "timeout" if rc == -9 else rc}
                with results_path.open("a") as fh:  # the next child starts after it
                    fh.write(json.dumps({"name": name, **done[name]}) + "\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", metavar="FOLDER", required=True)
    parser.add_argument("--soc-model", default="60")
    args = parser.parse_args(argv)
    _batch_child(args.child, args.soc_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
