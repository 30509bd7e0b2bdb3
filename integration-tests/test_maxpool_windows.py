"""Max pools QNN HTP has no MaxPool for, written by qnnx-export's translator window element by window element: a
3-D CNN's MaxPool3d (video and volume models), a dilated MaxPool2d, a pool whose indices the model returns (an
encoder that hands them to its decoder), and SegNet-style stages that unpool with them in the same graph, in 2-D and
on a batch of volumes (whose rank-5 indices cross the graph boundary as a merged view). Each runs wholly on QNN under
strict with eager's values; before the translator wrote them, strict refused each (QNN declines 3-D and dilated
MaxPools and computes no indices)."""

from __future__ import annotations

import pytest
import torch
from integration_helpers import assert_close_fp16, cosine, on_qnn_strict
from torch import nn

NPU_STRICT = {"device": "npu", "strict": True, "soc_model": 60}


class _Video(nn.Module):
    """C3D-style: Conv3d-ReLU, a spatial-only MaxPool3d, Conv3d-ReLU, a MaxPool3d over time too, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(3, 8, 3, padding=1)
        self.pool1 = nn.MaxPool3d((1, 2, 2))
        self.conv2 = nn.Conv3d(8, 8, 3, padding=1)
        self.pool2 = nn.MaxPool3d(2, stride=2, padding=1)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(torch.relu(self.conv1(x)))
        x = self.pool2(torch.relu(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3, 4)))


class _DilatedPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.conv(x))


class _Encoder(nn.Module):
    """A SegNet-style encoder stage: its pooled features and the pool's indices, which the decoder unpools with."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2, return_indices=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool(torch.relu(self.conv(x)))


class _SegNetStage(nn.Module):
    """A SegNet-style stage: the encoder pools with indices, the decoder unpools with them into the pooled size."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.mid = nn.Conv2d(6, 6, 3, padding=1)
        self.unpool = nn.MaxUnpool2d(2)
        self.dec = nn.Conv2d(6, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, where = self.pool(torch.relu(self.enc(x)))
        return self.dec(self.unpool(torch.relu(self.mid(y)), where, output_size=x.shape[-2:]))


class _VolumeSegStage(nn.Module):
    """A 3-D (volume) segmentation stage on a batch: it pools with indices, unpools with them in the same graph and
    also returns them, a batched int64 tensor of rank 5, which HTP cannot hold (the graph returns it with its
    leading dims merged)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv3d(2, 4, 3, padding=1)
        self.pool = nn.MaxPool3d(2, return_indices=True)
        self.mid = nn.Conv3d(4, 4, 3, padding=1)
        self.unpool = nn.MaxUnpool3d(2)
        self.dec = nn.Conv3d(4, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, where = self.pool(torch.relu(self.enc(x)))
        return self.dec(self.unpool(torch.relu(self.mid(y)), where, output_size=x.shape[-3:])), where


_MODELS = {
    "video": (_Video, (1, 3, 4, 8, 8)),
    "dilated": (_DilatedPool, (1, 3, 11, 12)),
    "encoder": (_Encoder, (2, 3, 8, 8)),
    "segnet": (_SegNetStage, (1, 3, 10, 12)),
    "segnet3d": (_VolumeSegStage, (2, 2, 4, 6, 6)),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_max_pools_htp_has_no_op_for_run_wholly_on_qnn(name: str) -> None:
    """Every node on QNN under strict, no CPU-EP node; the values within float16's rounding of eager's, the indices
    equal to eager's (the first-call check compares them exactly)."""
    cls, shape = _MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(shape)
    with torch.no_grad():
        expected = model(x)
    got = on_qnn_strict(model, x, options=NPU_STRICT)
    got_all = got if isinstance(got, tuple) else (got,)
    expected_all = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got_all, expected_all, strict=True):
        if e.dtype == torch.int64:
            assert torch.equal(g, e)
        else:
            assert_close_fp16(g, e)
            assert cosine(g, e) >= 0.999
