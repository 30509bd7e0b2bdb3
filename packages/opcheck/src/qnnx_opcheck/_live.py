"""``qnnx-opcheck --live``: the live answer of the installed QNN EP for a model, beside the static verdict.

:func:`live_check` runs this module as a child process (QNN may stop a process natively): it builds the session on
the QNN EP (the NPU on a device, the HTP simulator on x86_64), records ONNX Runtime's node assignment, runs
generated inputs and compares the outputs with the CPU EP. The only module of qnnx-opcheck that uses onnxruntime,
and only in that child: the static check needs none. ``narrow_failure`` (``_narrow.py``) starts the same child to
only build a session (:func:`build_only`).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import onnx

__all__ = ["LiveReport", "live_check"]

_EP = "QNNExecutionProvider"


def _session_options(ort: Any, request: dict[str, Any]) -> Any:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for name, size in request["free_dims"].items():
        so.add_free_dimension_override_by_name(name, int(size))
    return so


def _feeds(session: Any, request: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(int(request.get("seed", 0)))
    feeds = {}
    for i in session.get_inputs():
        shape = request["input_shapes"].get(i.name)
        if shape is None:
            shape = [d if isinstance(d, int) else request["free_dims"].get(d) for d in i.shape]
            if any(not isinstance(d, int) for d in shape):
                raise ValueError(
                    f"input {i.name!r} has shape {i.shape}: give its free dims (--dim NAME=N) or --shape {i.name}=..."
                )
        kind = i.type[len("tensor(") : -1]
        if kind in ("float", "float16", "double"):
            dtype = {"float": np.float32, "float16": np.float16, "double": np.float64}[kind]
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        elif kind == "bool":
            feeds[i.name] = rng.integers(0, 2, shape).astype(bool)
        else:  # integers: small non-negative values stay valid as indices and lengths
            feeds[i.name] = rng.integers(0, 4, shape).astype(np.dtype(kind))
    return feeds


def _compare(got: Any, want: Any) -> dict[str, Any]:
    import numpy as np

    a, b = np.asarray(got), np.asarray(want)
    if a.shape != b.shape:
        return {"match": False, "why": f"shape {list(a.shape)} vs {list(b.shape)}"}
    if a.size == 0:
        return {"match": True, "max_abs_error": 0.0, "cosine": 1.0}
    if not np.issubdtype(b.dtype, np.floating):
        same = bool(np.array_equal(a, b))
        return {"match": same, "max_abs_error": float(np.abs(a.astype(np.float64) - b).max())}
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    finite = np.isfinite(b64)
    if not np.array_equal(finite, np.isfinite(a64)):
        return {"match": False, "why": "non-finite values differ"}
    a64, b64 = a64[finite], b64[finite]
    err = float(np.abs(a64 - b64).max()) if a64.size else 0.0
    scale = float(np.abs(b64).max()) if b64.size else 0.0
    norm = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    cosine = float(a64 @ b64 / norm) if norm > 0 else (1.0 if err == 0 else 0.0)
    # fp16-level: HTP computes float graphs in float16 (relative error ~1e-3 of the output's scale).
    # An absolute floor of 1e-3: outputs near zero (a probability map on random input) underflow in fp16.
    match = err <= max(2e-2 * scale, 1e-3) or cosine >= 0.999
    return {"match": bool(match), "max_abs_error": err, "scale": scale, "cosine": cosine}


def run(request: dict[str, Any]) -> dict[str, Any]:
    """The live check of ``request`` (model, soc_model, free_dims, input_shapes, fallback, seed)."""
    import onnxruntime as ort
    import onnxruntime_qnn as oq

    ort.set_default_logger_severity(3)
    if not any(d.ep_name == _EP for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(_EP, oq.get_library_path())
    device = next(d for d in ort.get_ep_devices() if d.ep_name == _EP)
    so = _session_options(ort, request)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if request["fallback"] else "1")
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices(
        [device], {"backend_path": oq.get_qnn_htp_path(), "soc_model": str(request["soc_model"])}
    )
    result: dict[str, Any] = {"onnxruntime": ort.__version__}
    try:
        session = ort.InferenceSession(request["model"], sess_options=so)
    except Exception as exc:  # the answer "QNN cannot build it" is a finding, not a failure of the check
        result["session_error"] = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
        return result
    assignment = [
        [n.name, n.op_type, group.ep_name]
        for group in session.get_provider_graph_assignment_info()
        for n in group.get_nodes()
    ]
    result["assignment"] = assignment
    cpu = ort.InferenceSession(
        request["model"], sess_options=_session_options(ort, request), providers=["CPUExecutionProvider"]
    )
    try:
        feeds = _feeds(session, request)
        got = session.run(None, feeds)
    except Exception as exc:
        result["run_error"] = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
        return result
    want = cpu.run(None, feeds)
    result["outputs"] = {o.name: _compare(g, w) for o, g, w in zip(session.get_outputs(), got, want, strict=True)}
    return result


def build_only(request: dict[str, Any]) -> dict[str, Any]:
    """Build the QNN session of ``request["model"]`` (the child's work); its error. The CPU fallback is off, unless
    ``request["cpu_op_types"]`` pins op types to the CPU EP (with onnxruntime-qnn's ``op_affinity`` file)."""
    import os

    import onnxruntime as ort
    import onnxruntime_qnn as oq

    ort.set_default_logger_severity(3)
    if not any(d.ep_name == _EP for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(_EP, oq.get_library_path())
    device = next(d for d in ort.get_ep_devices() if d.ep_name == _EP)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    cpu_op_types = list(request.get("cpu_op_types") or ())
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if cpu_op_types else "1")
    options = {"backend_path": oq.get_qnn_htp_path(), "soc_model": str(request["soc_model"])}
    options.update({str(k): str(v) for k, v in request.get("provider_options", {}).items()})
    if cpu_op_types:
        affinity = request["model"] + ".affinity.json"
        with open(affinity, "w") as fh:
            json.dump({"op_type": dict.fromkeys(cpu_op_types, "cpu")}, fh)
        options["op_affinity"] = affinity
    so.add_provider_for_devices([device], options)
    try:
        ort.InferenceSession(request["model"], sess_options=so)
    except Exception as exc:
        text = str(exc).strip()
        return {"error": " ".join(text.split())[:800] if text else type(exc).__name__}
    finally:
        if cpu_op_types:
            os.unlink(options["op_affinity"])
    return {"error": None}


@attrs.frozen(kw_only=True)
class LiveReport:
    """What the installed QNN EP did with a model.

    Attributes:
        soc_model: The HTP SoC the session was built for.
        fallback: Whether CPU fallback was allowed (then nodes QNN declines run on the CPU EP and are listed so).
        assignment: ``(node name, op type, execution provider)`` per node ONNX Runtime kept, after its graph
            optimizations (folded nodes are absent; layout changes add nodes of its own).
        outputs: Output name -> ``{"match", "max_abs_error", "scale", "cosine"}`` against the CPU EP on the same
            generated inputs.
        session_error: Why the session could not be built, else None.
        run_error: Why the run failed, else None.
        crashed: The signal or exit status when the child process died, else None.
        onnxruntime: The onnxruntime version of the child.
    """

    soc_model: int
    fallback: bool
    assignment: tuple[tuple[str, str, str], ...] = ()
    outputs: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    session_error: str | None = None
    run_error: str | None = None
    crashed: str | None = None
    onnxruntime: str | None = None

    @property
    def ran(self) -> bool:
        """The session built and ran."""
        return not (self.session_error or self.run_error or self.crashed) and bool(self.outputs)

    @property
    def whole_on_qnn(self) -> bool:
        """Every node ONNX Runtime kept went to the QNN EP."""
        return self.ran and all(ep == "QNNExecutionProvider" for _, _, ep in self.assignment)

    @property
    def outputs_match(self) -> bool:
        """Every output matches the CPU EP within fp16-level tolerance."""
        return self.ran and all(o.get("match") for o in self.outputs.values())

    def summary(self) -> str:
        """One line: where the nodes went and whether the outputs match."""
        if self.crashed:
            return f"live (soc_model {self.soc_model}): the process died ({self.crashed})"
        if self.session_error:
            return f"live (soc_model {self.soc_model}): session creation failed: {self.session_error}"
        if self.run_error:
            return f"live (soc_model {self.soc_model}): the run failed: {self.run_error}"
        on_qnn = sum(ep == "QNNExecutionProvider" for _, _, ep in self.assignment)
        match = "match" if self.outputs_match else "DO NOT match"
        return (
            f"live (soc_model {self.soc_model}): {on_qnn}/{len(self.assignment)} nodes on QNN; outputs {match} "
            f"the CPU EP"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields and the derived verdicts."""
        out = attrs.asdict(self)
        out["assignment"] = [{"node": n, "op_type": o, "ep": e} for n, o, e in self.assignment]
        out.update(ran=self.ran, whole_on_qnn=self.whole_on_qnn, outputs_match=self.outputs_match)
        return out


def signal_name(code: int) -> str:
    """How a child process ended, from its return code (a signal's name, or the exit status)."""
    try:
        return signal.Signals(-code).name if code < 0 else f"exit status {code}"
    except ValueError:
        return f"signal {-code}"


def live_check(
    model: onnx.ModelProto | str | Path,
    *,
    soc_model: int = 60,
    free_dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    fallback: bool = True,
    seed: int = 0,
    timeout: float = 900.0,
) -> LiveReport:
    """Build the session on the installed QNN EP (HTP) in a child process, record ONNX Runtime's node assignment,
    run it on generated inputs and compare with the CPU EP.

    Args:
        model: A ModelProto or the path of a ``.onnx`` file (its external data beside it).
        soc_model: The HTP SoC (60: device-like fp16 numerics on the x86 simulator).
        free_dims: Free-dimension overrides by name, as ``check_model`` takes them.
        input_shapes: Shapes of the generated inputs by input name.
        fallback: Allow the CPU EP to take what QNN declines (to see where each node goes).
        seed: Seed of the generated inputs.
        timeout: Seconds before the child is stopped (the simulator is slow).

    Returns:
        The report; a failing or crashing session is a normal result.
    """
    with tempfile.TemporaryDirectory(prefix="qnnx-opcheck-live-") as tmp:
        if input_shapes:
            # onnxruntime overrides named free dims only: an input shape is written into a copy of the model, as a
            # user fixes an unnamed dim before compiling.
            from qnnx_opcheck._shapes import apply_static_shapes

            proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
            copy = onnx.ModelProto()
            copy.CopyFrom(proto)
            apply_static_shapes(copy, None, input_shapes)
            model = copy
        if isinstance(model, onnx.ModelProto):
            path = Path(tmp) / "model.onnx"
            onnx.save(model, path)
        else:
            path = Path(model).resolve()
        request = {
            "model": str(path),
            "soc_model": int(soc_model),
            "free_dims": dict(free_dims or {}),
            "input_shapes": {k: list(v) for k, v in (input_shapes or {}).items()},
            "fallback": bool(fallback),
            "seed": seed,
        }
        req, res = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(request))
        cmd = [sys.executable, "-m", "qnnx_opcheck._live", str(req), str(res)]
        try:
            proc = subprocess.run(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return LiveReport(soc_model=soc_model, fallback=fallback, crashed=f"timeout after {timeout:.0f} s")
        if proc.returncode != 0 or not res.exists():
            tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
            return LiveReport(
                soc_model=soc_model, fallback=fallback, crashed=f"{signal_name(proc.returncode)} {tail[0]}".strip()
            )
        found = json.loads(res.read_text())
    return LiveReport(
        soc_model=soc_model,
        fallback=fallback,
        assignment=tuple((str(n), str(o), str(e)) for n, o, e in found.get("assignment", [])),
        outputs=found.get("outputs", {}),
        session_error=found.get("session_error"),
        run_error=found.get("run_error"),
        onnxruntime=found.get("onnxruntime"),
    )


if __name__ == "__main__":
    request_file, result_file = sys.argv[1:3]
    request = json.loads(Path(request_file).read_text())
    Path(result_file).write_text(json.dumps(build_only(request) if request.get("build_only") else run(request)))
