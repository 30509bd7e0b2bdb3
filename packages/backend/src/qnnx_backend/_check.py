"""The check stage: whether one device can take the exported graph, before and after its session is built
(private).

qnnx-opcheck's verdicts decide the graph's CPU-EP part (:func:`check_ops`), the float16 range of the graph's outputs
decides whether HTP may compute it (:func:`fp16_range_refusal`), and ONNX Runtime's real placement must keep the
split's promise (:func:`check_share`). A device that cannot take the graph raises ``_session.DeviceRejected``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from qnnx_backend._compare import FP16_MAX, EagerReference, run_eager
from qnnx_backend._export import CompilableModel, CompileContext
from qnnx_backend._options import OPCHECK_BACKEND, BackendOptions
from qnnx_backend._session import DeviceRejected, placement_counts
from qnnx_backend._split import CpuPlan, opcheck, plan_cpu_nodes

logger = logging.getLogger(__name__)


def check_ops(model: CompilableModel, device: str, soc: int, ctx: CompileContext) -> CpuPlan:
    """opcheck's verdicts for ``device``, turned into the graph's CPU-EP part (empty: wholly on QNN).

    Raises DeviceRejected when the graph cannot be placed: a refused node under whole-graph placement, or, with
    ``partition="auto"``, a split that would leave half of the nodes or more on the CPU.
    """
    opts = ctx.options
    t = time.perf_counter()
    report = opcheck(model.structure, device, soc)
    ctx.timings[f"opcheck_{device}"] = time.perf_counter() - t
    mode = opts.resolved_partition
    if mode == "whole":
        if report.supported:
            return CpuPlan()
        nodes = ", ".join(f"{v.op_type} ({v.node_name}): {v.reason}" for v in report.unsupported)
        err = DeviceRejected(
            f"{len(report.unsupported)} ONNX node(s) not supported by QNN {OPCHECK_BACKEND[device]}: {nodes}"
        )
        try:
            report.raise_for_unsupported()
        except Exception as exc:
            raise err from exc
        raise err
    plan = plan_cpu_nodes(model.structure, report)
    if plan and mode == "auto" and not plan.keeps_majority():
        raise DeviceRejected(minority(plan.on_qnn, plan.on_cpu, plan))
    if plan:
        logger.info("qnn backend: partition=%r: %s", opts.partition, plan.describe())
    return plan


def minority(on_qnn: int, on_cpu: int, plan: CpuPlan) -> str:
    """Why a split that leaves QNN half of the nodes or fewer runs in PyTorch under partition='auto'."""
    return (
        f"QNN would keep only {on_qnn} of {on_qnn + on_cpu} ONNX nodes once the nodes qnnx-opcheck does not vouch "
        f"for (or that fail QNN's graph finalize) are pinned to ONNX Runtime's CPU EP (by op type); with half or less on QNN the graph runs in "
        f"PyTorch, or pass partition='mixed' to split it anyway. {plan.describe()}"
    )


def with_plan(kwargs: Mapping[str, Any], plan: CpuPlan) -> dict[str, Any]:
    """Session arguments that pin ``plan`` to the CPU EP (create_for_device reads the two private keys; without
    them a split session plans itself again from opcheck)."""
    fallback = bool(plan) or bool(kwargs.get("allow_cpu_fallback"))
    return {**kwargs, "allow_cpu_fallback": fallback, "cpu_op_types": plan.op_types, "cpu_nodes": tuple(plan.nodes)}


def check_share(session: Any, plan: CpuPlan, opts: BackendOptions) -> None:
    """partition='auto': ORT's real placement must leave QNN more than half of the nodes too (the QNN EP may
    decline more than opcheck predicted)."""
    if not plan or opts.resolved_partition != "auto":
        return
    import qnnx_detection

    counts = placement_counts(session)
    on_qnn = counts.get(qnnx_detection.EP_NAME, 0)
    on_cpu = sum(counts.values()) - on_qnn
    if on_qnn <= on_cpu:
        raise DeviceRejected(minority(on_qnn, on_cpu, plan).replace("would keep", "kept", 1))


def fp16_range_refusal(ctx: CompileContext) -> str | None:
    """Why HTP's float16 cannot hold the graph's result on the example inputs, or None.

    HTP computes a float graph in float16 and saturates silently at +-65504: an output that eager PyTorch computes
    beyond that (or as an infinity) would come back as a wrong finite number. The graph runs once in eager
    PyTorch on the example inputs to see (once per graph; under no_grad, on one intra-op thread when it is small). Later inputs are not checked (the
    ``verify`` option compares a first call with eager). Graphs that write into their arguments are not run here,
    since the run would apply the writes.
    """
    memo = ctx.memo
    if memo.range_checked:
        return memo.range_refusal
    memo.range_checked = True
    if ctx.analysis.mutated_indices:
        return None
    t = time.perf_counter()
    outputs = run_eager(ctx.gm, ctx.args)
    memo.eager = EagerReference(ctx.args, outputs)
    leaves = torch.utils._pytree.tree_leaves(outputs)
    for k, value in enumerate(leaves):
        if isinstance(value, torch.Tensor) and value.is_complex():  # returned as its real pair
            value = torch.view_as_real(value.resolve_conj())
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0:
            continue
        beyond = value.detach().abs().nan_to_num(nan=0.0) > FP16_MAX
        if bool(beyond.any()):
            worst = float(value.detach().abs().nan_to_num(nan=0.0).max())
            memo.range_refusal = (
                f"output {k} reaches {worst:.4g} on the example inputs, beyond float16's +-65504, where HTP (which "
                "computes float graphs in float16) would saturate it to a wrong finite value"
            )
            break
    ctx.timings["range_check"] = time.perf_counter() - t
    return memo.range_refusal
