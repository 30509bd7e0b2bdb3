"""Comparison helpers of the end-to-end tests: QNN HTP (fp16) results against eager PyTorch."""

from __future__ import annotations

import warnings
from typing import Any

import torch

import qnnx_backend


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|: the fp16-level tolerance is relative to the output's scale."""
    ref64 = ref.detach().double()
    return ((got.detach().double() - ref64).abs().max() / ref64.abs().max()).item()


def cosine(got: torch.Tensor, ref: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(
        got.detach().double().flatten(), ref.detach().double().flatten(), dim=0
    ).item()


def assert_close_fp16(got: torch.Tensor, ref: torch.Tensor, rel: float = 2e-2, cos: float = 0.999) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert ref.abs().max() > 1e-2, "reference output is degenerate: the comparison would mean nothing"
    assert rel_error(got, ref) <= rel, f"max|err|/max|ref| = {rel_error(got, ref):.3g} > {rel}"
    assert cosine(got, ref) >= cos, f"cosine {cosine(got, ref):.6f} < {cos}"


def on_qnn_strict(fn: object, *args: torch.Tensor, options: dict[str, object]) -> Any:
    """``fn`` compiled with ``options`` (a strict NPU compile) and called once under no_grad; every graph must be
    wholly on QNN (device npu, no CPU-EP node)."""
    import qnnx_backend

    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad():
        out = torch.compile(fn, backend="qnn", options=options)(*args)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    return out


def generate_wholly_on_qnn(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    max_cache_len: int,
    options: dict[str, object],
    eager_cache: str | None = None,
    **kwargs: object,
) -> tuple[Any, Any]:
    """Greedy generation in eager PyTorch (with ``cache_implementation=eager_cache`` when given), then after
    compile_for_generation; asserts that the prefill bucket and the decode step both ran wholly on QNN, and returns
    (compiled, eager) outputs."""
    from qnnx_backend.hf import compile_for_generation

    cache = {"cache_implementation": eager_cache} if eager_cache else {}
    with torch.no_grad():
        ref = model.generate(prompt, **cache, **kwargs)  # type: ignore[operator]
    qnnx_backend.clear_compile_reports()
    compile_for_generation(model, max_cache_len=max_cache_len, options=options)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(prompt, **kwargs)  # type: ignore[operator]
    reports = list(qnnx_backend.compile_reports())
    assert len(reports) == 2 and all(r.device == "npu" and not r.cpu_nodes for r in reports), [
        r.summary() for r in reports
    ]
    return out, ref


def train(model: torch.nn.Module, steps: int, loss_at: Any, lr: float = 3e-3, adamw: bool = False) -> torch.nn.Module:
    """Train ``model`` ``steps`` steps of Adam (AdamW with ``adamw``) on ``loss_at(model, step)``, on one thread (tiny
    matrices: one thread is faster than several on a shared machine); returns it in eval mode."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        optimizer = (torch.optim.AdamW if adamw else torch.optim.Adam)(model.parameters(), lr=lr)
        for step in range(steps):
            loss = loss_at(model, step)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()
