"""Transposed convolutions QNN HTP refuses or computes wrongly, rewritten by qnnx-export into forms it computes
right: a dilation above 1 (``convtranspose_dilated_kernel``), and 3-D pads or strides differing between axes, grouped
3-D ones and output_padding (``convtranspose_normal_form``). Each runs wholly on the simulator under strict
with eager's numbers; without the passes qnnx-opcheck refuses each, so strict raises instead of returning numbers
that are 1-3 times the output's scale off."""

from __future__ import annotations

import pytest
import torch
from integration_helpers import assert_close_fp16, cosine

import qnnx_backend
from qnnx_backend.errors import QnnDeviceError

NPU_STRICT = {"device": "npu", "strict": True, "soc_model": 60}
PASSES = ["convtranspose_dilated_kernel", "convtranspose_normal_form"]

CASES = [
    # a video decoder's upsampling: space doubled, time kept
    (3, {"kernel_size": (1, 3, 3), "stride": (1, 2, 2), "padding": (0, 1, 1), "output_padding": (0, 1, 1)}, 4),
    (3, {"kernel_size": (3, 2, 3), "padding": (1, 0, 0)}, 4),
    (3, {"kernel_size": 2, "stride": (2, 2, 1)}, 4),
    (3, {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2}, 3),
    (3, {"kernel_size": 2, "stride": 2, "groups": 2}, 3),
    (2, {"kernel_size": 3, "stride": (1, 2), "padding": 1, "output_padding": (0, 1)}, 5),
    (2, {"kernel_size": 3, "stride": 2, "padding": 2, "dilation": (2, 3), "groups": 2}, 5),
    (2, {"kernel_size": 4, "stride": 2, "output_padding": 1}, 5),
    (1, {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 3}, 7),
    (1, {"kernel_size": 4, "stride": 3, "padding": 1, "output_padding": 2, "groups": 2, "dilation": 4}, 4),
]
_IDS = [f"{rank}d-" + "-".join(f"{k}{v}" for k, v in kw.items()) for rank, kw, _ in CASES]


def _module(rank: int, kwargs: dict[str, object], side: int) -> tuple[torch.nn.Module, torch.Tensor]:
    cls = {1: torch.nn.ConvTranspose1d, 2: torch.nn.ConvTranspose2d, 3: torch.nn.ConvTranspose3d}[rank]
    shape = (2, 4, *([3] if rank == 3 else []), *([side] * min(rank, 2)))
    return cls(4, 6, **kwargs).eval(), torch.randn(shape)


@pytest.mark.parametrize(("rank", "kwargs", "side"), CASES, ids=_IDS)
def test_transposed_convolution_runs_wholly_on_qnn(rank: int, kwargs: dict[str, object], side: int) -> None:
    """Every node on QNN under strict, no CPU-EP node, and eager's outputs on two calls (the second with new data,
    after the first call's accuracy guard)."""
    model, x = _module(rank, kwargs, side)
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        for data in (x, torch.randn_like(x) * 3):
            got, expected = compiled(data), model(data)
            assert_close_fp16(got, expected)
            assert cosine(got, expected) >= 0.999
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and set(report.placement) == {"QNNExecutionProvider"}, report.summary()
    assert set(report.passes_applied) & set(PASSES)


@pytest.mark.parametrize(("rank", "kwargs", "side"), CASES, ids=_IDS)
def test_without_the_passes_strict_refuses(rank: int, kwargs: dict[str, object], side: int) -> None:
    """Without the rewrites qnnx-opcheck refuses each of these ConvTransposes, so strict raises naming it."""
    model, x = _module(rank, kwargs, side)
    options = {**NPU_STRICT, "disable_passes": PASSES}
    with torch.no_grad(), pytest.raises(QnnDeviceError, match="ConvTranspose"):
        torch.compile(model, backend="qnn", options=options)(x)
