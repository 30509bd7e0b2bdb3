"""The translator's pools on the HTP simulator against eager: avg_pool2d/3d (with divisor_override)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from export_qnn_helpers import close_on_qnn_fast
from hypothesis import given, settings
from hypothesis import strategies as st

from qnnx_testkit.strategies import seeds


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
