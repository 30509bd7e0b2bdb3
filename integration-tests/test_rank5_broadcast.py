"""Rank-5 broadcasting that QNN HTP gets wrong or crashes on: a Where (``masked_fill``, ``torch.where``) whose rank-5
mask broadcasts came back up to 1.8 times the output's scale off, and a Pow by a rank-5 exponent that broadcasts
stopped the user's process (SIGSEGV). qnnx-export's ``rank5_broadcast_expanded`` computes the first right on QNN;
qnnx-opcheck refuses what the rewrite leaves, so the second never reaches QNN in that form."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from integration_helpers import assert_close_fp16

import qnnx_backend

NPU_STRICT = {"device": "npu", "strict": True, "soc_model": 60}
SHAPE = (2, 3, 4, 2, 3)


@pytest.mark.parametrize("mask_shape", [(1, 3, 1, 2, 3), (1, 1, 4, 2, 3), (1, 3, 1, 1, 1)])
@pytest.mark.parametrize("form", ["masked_fill", "where"])
def test_rank5_masks_run_right_on_qnn(mask_shape: tuple[int, ...], form: str) -> None:
    """A rank-5 tensor filled through a broadcasting rank-5 mask: on QNN under strict with eager's values, for the
    mask it was compiled with and another one."""

    def fill(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x.masked_fill(mask, 0.5) if form == "masked_fill" else torch.where(mask, x, x * 2)

    g = torch.Generator().manual_seed(0)
    x, mask = torch.randn(SHAPE, generator=g), torch.rand(mask_shape, generator=g) < 0.5
    compiled = torch.compile(fill, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        for m in (mask, ~mask):
            assert_close_fp16(compiled(x, m), fill(x, m))
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and "rank5_broadcast_expanded" in report.passes_applied, report.summary()


def test_rank5_pow_by_a_broadcasting_exponent_does_not_stop_the_process() -> None:
    """``x ** e`` with ``e`` a rank-5 broadcast: the call returns eager's values (on the NPU, the mask's Cast to float
    narrowed to a CPU island), and the process lives (run in a child process, where a crash takes only the child)."""
    script = textwrap.dedent(
        """
        import tempfile, torch
        torch.manual_seed(0)
        x, m = torch.randn(2, 3, 4, 2, 3), torch.rand(1, 3, 1, 2, 3) < 0.5
        fn = lambda x, m: x.abs() ** (m.float() + 1)
        options = {"device": "npu", "soc_model": 60, "cache": True, "cache_dir": tempfile.mkdtemp()}
        with torch.no_grad():
            out = torch.compile(fn, backend="qnn", options=options)(x, m)
        assert torch.allclose(out, fn(x, m), rtol=2e-3, atol=1e-3)
        print("alive")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "alive" in proc.stdout, proc.stderr[-2000:]
