"""Whether the target can load a weight-shared QNN context: probed in child processes, kept in the probe cache.

A weight-shared context is one ``_qnn.bin`` holding several graphs over one copy of their weights (a decoder's prefill
buckets and its decode step), made by compiling the graphs in one process with ``ep.share_ep_contexts=1`` (and
``ep.stop_share_ep_contexts=1`` on the last). Making one works wherever the NPU does; loading one may fail with a QNN
error or kill the process (onnxruntime-qnn 2.7.0 on the x86_64 HTP simulator: SIGSEGV in a fresh process). So the
probe never loads in the caller's process: one child generates a group of two tiny MatMul graphs over the same
weights (batch 1 and 2), a second, fresh child (as an application loading a prebuilt context is) loads both with
``ep.share_ep_contexts=1``, runs them and compares the results with the exact ones.

The verdict is kept in the probe cache (:mod:`qnnx_detection._verdicts`) under the same key material as the
backends' verdicts (versions, native libraries, host, boot, the NPU's ``OrtEpDevice``, the SoC), for a day either
way: unlike a busy device, "cannot load a shared context" does not change until one of those does. A child that
times out, or cannot be started, is reported and not recorded.

The children run :func:`child_main` (``generate|load <folder> <soc_model>``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs

from qnnx_detection._probe import HostEnvironment, active_environment, probe
from qnnx_detection._selection import select_device
from qnnx_detection._soc import parse_soc_model
from qnnx_detection._tiny_model import MATMUL_SIZE, matmul_weight, tiny_matmul_model
from qnnx_detection._verdicts import (
    MAX_AGE_USABLE_S,
    VerdictStore,
    host_boot_id,
    key_material,
    loader_environment,
)
from qnnx_detection._version import __version__

logger = logging.getLogger(__name__)

#: Seconds each child of the probe may take (both together take about a second on the x86_64 simulator).
CHILD_TIMEOUT_S = 120.0
# The batches of the two graphs of the probe's group.
_BATCHES = (1, 2)
# What the child prints last on stdout, before its JSON outcome.
_MARK = "QNNX_WEIGHT_SHARING "
# The probe-cache "device" of this verdict: beside the backends' verdicts, never one of them.
_CACHE_DEVICE = "npu:weight-sharing-load"
_CHILD_CODE = "import sys\nfrom qnnx_detection._weight_sharing import child_main\nsys.exit(child_main(sys.argv[1:]))"


@attrs.frozen(kw_only=True)
class WeightSharingReport:
    """Whether the target can load a weight-shared QNN context. Produced by :func:`probe_weight_sharing`.

    Attributes:
        supported: True only when a child process loaded a generated group of two graphs over one weight copy
            and both gave the right results (in this process or, when ``reused``, in an earlier one).
        reason: Why not (None when supported): the QNN error, the signal that killed the child, or why the
            probe could not run (the NPU is not usable, a child timed out).
        soc_model: The SoC the group was compiled for, when known.
        reused: True when the verdict came from the probe cache (no child was started).
        elapsed_s: Seconds the probe took in this process.
    """

    supported: bool
    reason: str | None = None
    soc_model: int | None = None
    reused: bool = False
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields."""
        return {**attrs.asdict(self), "elapsed_s": round(self.elapsed_s, 4)}


_lock = threading.Lock()
_cached: dict[int | None, WeightSharingReport] = {}


def probe_weight_sharing(*, soc_model: int | str | None = None, refresh: bool = False) -> WeightSharingReport:
    """Say whether the NPU here can load a context whose graphs share one copy of their weights. Never raises.

    The first call on a machine generates a tiny weight-shared group and loads it in child processes (a failed
    load may kill its process: never this one); 1-3 s on the x86_64 simulator. The verdict is kept in
    the probe cache (``QNNX_PROBE_CACHE_DIR``; ``QNNX_PROBE_CACHE=0`` turns it off) for a day while versions,
    native libraries, device, SoC, host and boot stay the same, and per process. Concurrent calls wait for one
    probe. Inside ``qnnx_detection.testing.use_environment`` nothing is probed: the report says not supported.

    Args:
        soc_model: The SoC to compile the group for (a number or a chip name). None: the one :func:`probe` uses
            for the NPU (``QNNX_SOC_MODEL``, the detected chip, else 60).
        refresh: Probe again in child processes, replacing the cached verdict.

    Returns:
        A :class:`WeightSharingReport`; ``supported`` is False with the ``reason`` when the target cannot load
        one, when the NPU is not usable, or when the probe could not tell.
    """
    _, fake = active_environment()
    if fake:
        return WeightSharingReport(
            supported=False,
            reason="not probed: a qnnx_detection.testing fake environment is active, and it does not model weight sharing",
        )
    try:
        soc = None if soc_model is None else parse_soc_model(soc_model)
    except Exception as exc:
        return WeightSharingReport(supported=False, reason=f"not probed: {exc}")
    with _lock:
        cached = _cached.get(soc)
        if cached is not None and not refresh:
            return cached
        start = time.perf_counter()
        try:
            report = _probe(soc, refresh)
        except Exception as exc:  # last line of defence: the probe never raises
            logger.debug("the weight-sharing probe failed", exc_info=True)
            report = WeightSharingReport(
                supported=False, reason=f"the weight-sharing probe failed unexpectedly: {exc!r}"
            )
        report = attrs.evolve(report, elapsed_s=time.perf_counter() - start)
        logger.info(
            "weight-shared contexts %s here (%.2f s%s): %s",
            "load" if report.supported else "do not load",
            report.elapsed_s,
            ", from the probe cache" if report.reused else "",
            report.reason or "both graphs ran",
        )
        _cached[soc] = report
        return report


def _probe(soc_model: int | None, refresh: bool) -> WeightSharingReport:
    base = probe()
    npu = base.backend("npu")
    soc = soc_model if soc_model is not None else npu.soc_model
    if not npu.available:
        return WeightSharingReport(supported=False, soc_model=soc, reason=f"the NPU is not usable here: {npu.reason}")
    if soc is None:  # the probe sets the NPU's SoC whenever it reports it usable
        return WeightSharingReport(supported=False, reason="not probed: the NPU's SoC is unknown; pass soc_model=")
    index, _ = select_device("npu", base.devices, base.platform.machine)
    store, material = None, None
    boot = host_boot_id(base.platform.system)
    root = HostEnvironment().probe_cache()
    if root is not None and boot is not None and index is not None:
        store = VerdictStore(root, max_age_unusable_s=MAX_AGE_USABLE_S)
        material = key_material(
            detection_version=__version__,
            platform_info=attrs.asdict(base.platform),
            versions=attrs.asdict(base.versions),
            boot=boot,
            libraries=HostEnvironment().library_identity("npu"),
            loader_env=loader_environment(os.environ, base.platform.system),
            device=_CACHE_DEVICE,
            ep_device=attrs.asdict(base.devices[index]),
            soc_model=soc,
        )
        verdict = None if refresh else store.get(material)
        if verdict is not None:
            return WeightSharingReport(
                supported=verdict.reason is None, reason=verdict.reason, soc_model=soc, reused=True
            )
    where = f"onnxruntime-qnn {base.versions.onnxruntime_qnn}, QAIRT {base.versions.qairt}, soc_model {soc}"
    if npu.is_simulator:
        where += ", the x86_64 HTP simulator"
    reason, definitive = _run_children(soc, where)
    if store is not None and material is not None and definitive:
        store.put(material, reason)
    return WeightSharingReport(supported=reason is None, reason=reason, soc_model=soc)


def _run_children(soc_model: int, where: str) -> tuple[str | None, bool]:
    """``(reason or None, definitive)``: generate the group in one child, load and run it in a fresh one."""
    with tempfile.TemporaryDirectory(prefix="qnnx-weight-sharing-") as folder:
        for stage in ("generate", "load"):
            reason, definitive = _child(stage, folder, soc_model, where)
            if reason is not None:
                return reason, definitive
    return None, True


def _child(stage: str, folder: str, soc_model: int, where: str) -> tuple[str | None, bool]:
    what = "generating" if stage == "generate" else "loading"
    try:
        done = _spawn([sys.executable, "-c", _CHILD_CODE, stage, folder, str(soc_model)], folder)
    except subprocess.TimeoutExpired:
        return (
            f"{what} a weight-shared context did not finish in {CHILD_TIMEOUT_S:.0f} s ({where}); not recorded",
            False,
        )
    except OSError as exc:
        return f"the weight-sharing probe could not start a Python child process ({exc}); not recorded", False
    outcome = _outcome(done.stdout)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        logger.debug("weight-sharing probe child (%s) output:\n%s\n%s", stage, done.stdout, done.stderr)
        return (
            f"{what} a weight-shared context (two graphs over one weight copy in one _qnn.bin) killed the process with "
            f"{name} ({where}); compile each graph with its own weights here",
            True,
        )
    if outcome is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return f"the weight-sharing probe's child ({stage}) exited with status {done.returncode}: {tail}", False
    if outcome.get("error"):
        return f"{what} a weight-shared context failed ({where}): {outcome['error']}", outcome.get("definitive") is True
    return None, True


def _spawn(argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    """Run a child of the probe (a module attribute, so a test can count the children)."""
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)


def _outcome(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_MARK):
            try:
                value = json.loads(line[len(_MARK) :])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _generate(folder: Path, soc_model: int) -> str | None:
    from qnnx_detection._ep import create_session

    for index, batch in enumerate(_BATCHES):
        config = {
            "ep.context_enable": "1",
            "ep.context_embed_mode": "0",
            "ep.context_file_path": str(folder / f"mm{batch}_ctx.onnx"),
            "ep.share_ep_contexts": "1",
        }
        if index == len(_BATCHES) - 1:
            config["ep.stop_share_ep_contexts"] = "1"
        # From a file: the EP names a graph of the group after its model's path, and two graphs of one name collide.
        source = folder / f"mm{batch}.onnx"
        source.write_bytes(tiny_matmul_model(batch))
        create_session(source, "npu", soc_model=soc_model, session_config=config)
    binaries = sorted(p.name for p in folder.glob("*.bin"))
    if len(binaries) != 1:
        return (
            f"the QNN EP wrote {len(binaries)} context binaries ({', '.join(binaries) or 'none'}) for a group of "
            f"{len(_BATCHES)} graphs: it does not share weights here"
        )
    return None


def _load(folder: Path, soc_model: int) -> str | None:
    import numpy as np

    from qnnx_detection._ep import create_session

    sessions = [
        create_session(
            folder / f"mm{b}_ctx.onnx", "npu", soc_model=soc_model, session_config={"ep.share_ep_contexts": "1"}
        )
        for b in _BATCHES
    ]
    n = MATMUL_SIZE
    weight = np.array([[matmul_weight(r, c) for c in range(n)] for r in range(n)], dtype=np.float32)
    for batch, session in zip(_BATCHES, sessions, strict=True):
        x = np.arange(batch * n, dtype=np.float32).reshape(batch, n) / (batch * n)
        (y,) = session.run(None, {"x": x})
        error = float(np.max(np.abs(np.asarray(y) - x @ weight)))
        if not error <= 0.05:
            return f"the graph at batch {batch} loaded from the shared context computed wrong results (max error {error:.3g})"
    return None


def child_main(argv: list[str]) -> int:
    """The child: ``generate|load <folder> <soc_model>``; prints its outcome as the last line of stdout."""
    from qnnx_detection.errors import SessionCreationError

    stage, folder, soc = argv
    error: str | None
    definitive = True  # QNN's answer (or the results): kept; anything else may be this machine's passing trouble
    try:
        run = _generate if stage == "generate" else _load
        error = run(Path(folder), int(soc))
    except SessionCreationError as exc:
        error = exc.cause
    except Exception as exc:
        error, definitive = f"{type(exc).__name__}: {exc}", False
    sys.stdout.flush()
    sys.stdout.write(_MARK + json.dumps({"error": error, "definitive": definitive}) + "\n")
    sys.stdout.flush()
    return 0
