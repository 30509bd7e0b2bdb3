"""The targets the benchmark report holds qnnx to: one declaration, read by the figures, the tables and the prose."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A ratio (or seconds) that should stay at or below ``bound``; ``label`` is its row in the targets table."""

    bound: float
    label: str


TARGETS: dict[str, Target] = {
    "warm_cold": Target(0.15, "qnnx warm first call / cold first call"),
    "aot_cold": Target(0.15, "qnnx AOT warm start (load a saved function + first call) / cold first call"),
    "qnnx_host_s": Target(0.15, "qnnx host work in a cold first call above Dynamo and ORT+QNN, in seconds"),
    "warm_cold_host": Target(
        0.15, "the same without the first `run()` (host-side work only; a diagnostic, not a target)"
    ),
    "warm_cold_qnnx_part": Target(
        0.15, "the same for qnnx's compile step only, without Dynamo (a diagnostic, not a target)"
    ),
    "qnnx_ov_cold": Target(1.0, "qnnx cold first call / OpenVINO cold first call (no cache)"),
    "qnnx_ov_cold_host": Target(
        1.0, "the same without qnnx's first simulator `run()` (host-side work; a diagnostic, not a target)"
    ),
    "ortqnn_ov_cold": Target(
        1.0, "ONNX Runtime + QNN alone (session + first run) / OpenVINO cold first call (the floor)"
    ),
    "floor_ov_cold": Target(
        1.0,
        "Dynamo's trace + ONNX Runtime + QNN alone / OpenVINO cold first call (the floor of any "
        "torch.compile backend on ORT+QNN; a diagnostic, not a target)",
    ),
    "compiled_raw": Target(1.05, "qnnx steady-state call / raw `InferenceSession.run` on the same context"),
    "mem_weights": Target(2.5, "qnnx peak compile memory above baseline / weight bytes"),
}
