"""The translator's pools and resampling on the HTP simulator against eager: avg_pool2d/3d (with divisor_override),
adaptive_avg_pool3d, F.interpolate's trilinear, antialiased bilinear and 1-d nearest modes, and Tensor.unfold's
sliding windows."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from export_qnn_helpers import close_on_qnn_fast
from hypothesis import given, settings
from hypothesis import strategies as st

from qnnx_testkit.strategies import seeds, shapes


def _close_on_qnn(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    """Through the translator on the HTP simulator: eager's values to 2e-3 of the output's scale (weighted sums)."""
    close_on_qnn_fast(fn, *inputs, tol=2e-3)


@settings(max_examples=8, deadline=None)
@given(spatial=st.sampled_from([2, 3]), data=st.data(), seed=seeds())
def test_avg_pool_on_qnn(spatial: int, data: st.DataObject, seed: int) -> None:
    """avg_pool2d and avg_pool3d with any window PyTorch takes (kernel, stride, padding up to half the kernel),
    ceil_mode, count_include_pad and divisor_override run wholly on the HTP simulator within float16 rounding of
    eager."""
    kernel = data.draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    stride = data.draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    padding = [data.draw(st.integers(0, k // 2)) for k in kernel]
    sides = [data.draw(st.integers(k, 6)) for k in kernel]
    ceil_mode, count_include_pad = data.draw(st.booleans()), data.draw(st.booleans())
    divisor = data.draw(st.none() | st.integers(1, 5))
    pool = F.avg_pool2d if spatial == 2 else F.avg_pool3d
    x = torch.randn((2, 3, *sides), generator=torch.Generator().manual_seed(seed))

    def fn(t: torch.Tensor) -> torch.Tensor:
        return pool(t, kernel, stride, padding, ceil_mode, count_include_pad, divisor)  # type: ignore[operator]  # F's pools take these positionally

    _close_on_qnn(fn, x)


@settings(max_examples=6, deadline=None)
@given(
    sides=st.tuples(*(st.integers(1, 6),) * 3),
    out=st.tuples(*(st.integers(1, 5),) * 3),
    batched=st.booleans(),
    seed=seeds(),
)
def test_adaptive_avg_pool3d_on_qnn(
    sides: tuple[int, int, int], out: tuple[int, int, int], batched: bool, seed: int
) -> None:
    """adaptive_avg_pool3d over even, uneven, overlapping and repeated windows, batched or not, runs wholly on the
    HTP simulator within float16 rounding of eager."""
    x = torch.randn((2, 3, *sides) if batched else (3, *sides), generator=torch.Generator().manual_seed(seed))
    _close_on_qnn(lambda t: F.adaptive_avg_pool3d(t, out), x)


@settings(max_examples=8, deadline=None)
@given(
    mode=st.sampled_from(["trilinear", "bilinear-aa", "nearest-1d"]),
    data=st.data(),
    align_corners=st.booleans(),
    by_scale=st.booleans(),
    seed=seeds(),
)
def test_interpolate_on_qnn(mode: str, data: st.DataObject, align_corners: bool, by_scale: bool, seed: int) -> None:
    """F.interpolate, trilinear, antialiased bilinear and 1-d nearest, up and down, to a size or by a scale factor
    (align_corners both ways for the linear modes), runs wholly on the HTP simulator within float16 rounding of
    eager: each output the same weighted sum of the same inputs."""
    spatial = {"trilinear": 3, "bilinear-aa": 2, "nearest-1d": 1}[mode]
    sides = data.draw(st.lists(st.integers(2 if by_scale else 1, 7), min_size=spatial, max_size=spatial))
    x = torch.randn((2, 3, *sides), generator=torch.Generator().manual_seed(seed))
    if by_scale:
        factors = data.draw(st.lists(st.sampled_from([0.5, 0.7, 1.5, 2.0, 2.5]), min_size=spatial, max_size=spatial))
        size = None
    else:
        factors, size = None, data.draw(st.lists(st.integers(1, 9), min_size=spatial, max_size=spatial))
    kwargs = {"size": size, "scale_factor": factors}
    if mode == "nearest-1d":
        kwargs["mode"] = "nearest"
    else:
        kwargs.update(mode="trilinear" if spatial == 3 else "bilinear", align_corners=align_corners)
        kwargs["antialias"] = mode == "bilinear-aa"
    _close_on_qnn(lambda t: F.interpolate(t, **kwargs), x)  # type: ignore[arg-type]  # kwargs of mixed types


@settings(max_examples=8, deadline=None)
@given(shape=shapes(min_rank=1, max_rank=4, max_side=6), data=st.data(), seed=seeds())
def test_unfold_on_qnn(shape: list[int], data: st.DataObject, seed: int) -> None:
    """Tensor.unfold along any dim, with any window size and step (overlapping, adjacent or with gaps), runs wholly
    on the HTP simulator and returns eager's windows."""
    rank = len(shape)
    dim = data.draw(st.integers(-rank, rank - 1))
    size = data.draw(st.integers(1, shape[dim]))
    step = data.draw(st.integers(1, 4))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 100
    _close_on_qnn(lambda t: t.unfold(dim, size, step), x)
