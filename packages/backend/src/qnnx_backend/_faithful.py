"""Check that an exported ONNX model computes what the PyTorch graph computes, before QNN ever sees it (private).

torch.onnx, the fallback exporter, lowers some ops unfaithfully without any error (torch 2.13: ``avg_pool2d`` with
``divisor_override``, ``rms_norm`` with a non-default ``eps``, ...). A wrong lowering on QNN would look like a QNN
precision problem, or pass unnoticed. So every model torch.onnx produced is run once on ONNX Runtime's CPU EP, in
float32, with the graph's real example inputs and compared with eager PyTorch: a model that disagrees is never
compiled for QNN and the graph runs in PyTorch, with the figure in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from qnnx_backend._compare import FP16_MAX, RTOL_FP16, RTOL_FP32, compare_outputs, run_eager
from qnnx_backend._session import StagedModel


def check_on_cpu(
    exported: Any, gm: torch.fx.GraphModule, args: Sequence[object], export_args: Sequence[object]
) -> str | None:
    """Run ``exported`` on ONNX Runtime's CPU EP and compare with ``gm(*args)``.

    Returns:
        None when they agree, else the reason the model is not faithful (a sentence for the report). A model the
        CPU EP cannot load or run counts as not verified, with ORT's message.
    """
    import onnxruntime

    fp16 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float16 for a in export_args) and not any(
        isinstance(a, torch.Tensor) and a.dtype == torch.float16 for a in args
    )
    signature = exported.signature
    # A graph that writes into its arguments (a cache) runs on copies of what it writes: the check must not move
    # the caller's state (the compiled call then writes it once, as eager would).
    written = {arg for _, arg in signature.writebacks} | {w.arg_index for w in signature.row_writebacks}
    copies = {i: args[i].clone() for i in written if isinstance(args[i], torch.Tensor)}
    ref = run_eager(gm, [copies.get(i, a) for i, a in enumerate(args)])
    try:
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        # From a file with external data, like the QNN session: no 2 GiB protobuf limit, and ORT maps the weights
        # instead of holding a second serialized copy in memory.
        staged = StagedModel(exported)
        session = onnxruntime.InferenceSession(
            staged.__fspath__(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        staged.keep_for(session)
        feeds = {
            name: t.numpy() for name, t in zip(signature.input_names, signature.onnx_inputs(export_args), strict=True)
        }
        outs = session.run(list(signature.onnx_output_names), feeds)
    except Exception as exc:  # any failure means "not verified"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"ONNX Runtime's CPU EP could not run it to verify it ({first[:300]})"
    got = signature.assemble([torch.from_numpy(o) for o in outs], export_args)
    ref_leaves = torch.utils._pytree.tree_leaves(ref)
    got_leaves = torch.utils._pytree.tree_leaves(got)
    # fp16 export: outputs come back as the model's fp16; compare in the caller's dtype.
    got_leaves = [
        g.to(r.dtype)
        if isinstance(g, torch.Tensor) and isinstance(r, torch.Tensor) and g.dtype != r.dtype and fp16
        else g
        for g, r in zip(got_leaves, ref_leaves, strict=False)
    ]
    # What a whole-tensor write returns is checked against eager's new value too.
    for index, arg in signature.writebacks:
        if arg in copies:
            got_leaves.append(torch.from_numpy(outs[index]).to(copies[arg].dtype))
            ref_leaves.append(copies[arg])
    # Values beyond float16's range are no question of the exporter's faithfulness: HTP cannot hold them, and the
    # output-range check refuses such a graph with that reason. qnnx-export's passes may also saturate there (an
    # Exp's input is clipped to log(65504)), so they are left out of this comparison.
    got_leaves = [_within_fp16(g, r) for g, r in zip(got_leaves, ref_leaves, strict=False)]
    return compare_outputs(got_leaves, ref_leaves, RTOL_FP16 if fp16 else RTOL_FP32)


def _within_fp16(got: object, ref: object) -> object:
    """``got`` with eager's value wherever eager's is beyond float16's range (NaN positions kept)."""
    if not (isinstance(got, torch.Tensor) and isinstance(ref, torch.Tensor)) or got.shape != ref.shape:
        return got
    if not (got.is_floating_point() and ref.is_floating_point()):
        return got
    beyond = ref.abs() > FP16_MAX
    return torch.where(beyond, ref.to(got.dtype), got) if bool(beyond.any()) else got
