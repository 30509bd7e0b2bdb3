"""In-place writes to inputs and buffers are lifted: the graph runs on QNN and the caller's tensors end as eager
leaves them. A write that cannot be lifted falls back; a write is never dropped."""

from __future__ import annotations

import warnings

import torch
from conftest import assert_close_fp16
from hypothesis import given
from hypothesis import strategies as st

import qnnx_backend

NPU_STRICT = {"device": "npu", "strict": True, "soc_model": 60}


class _KVCache(torch.nn.Module):
    """A static KV cache the way transformers' StaticCache updates it: a counter add_ and an index_copy_."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.zeros(1, 2, 8, 4))
        self.register_buffer("length", torch.zeros((), dtype=torch.int64))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, new: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.length.add_(new.shape[2])
        self.keys.index_copy_(2, position, self.proj(new))
        return torch.softmax(self.keys.sum(-1), dim=-1)


def test_kv_cache_updates_run_on_qnn_and_match_eager_step_by_step() -> None:
    """Eight decode steps: one QNN graph, and after every step the cache, the counter and the output match eager."""
    torch.manual_seed(0)
    model, reference = _KVCache().eval(), _KVCache().eval()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        for step in range(8):
            new, position = torch.randn(1, 2, 1, 4), torch.tensor([step])
            assert_close_fp16(compiled(new, position), reference(new, position))
            assert_close_fp16(model.keys, reference.keys)
            assert int(model.length) == int(reference.length) == step + 1
    (report,) = qnnx_backend.compile_reports()
    assert report.on_qnn


def test_a_written_user_input_is_updated_in_the_callers_tensor() -> None:
    """x.copy_(y * 2) and an int counter's add_ inside the graph: the caller's tensors are updated after the QNN
    run, and the output is right."""

    def fn(x: torch.Tensor, y: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        x.copy_(y * 2)
        steps.add_(1)
        return x + 1

    x, y, steps = torch.zeros(4, 8), torch.randn(4, 8), torch.zeros((), dtype=torch.int64)
    with torch.no_grad():
        out = torch.compile(fn, backend="qnn", options=NPU_STRICT)(x, y, steps)
    assert_close_fp16(x, y * 2)
    assert_close_fp16(out, y * 2 + 1)
    assert int(steps) == 1


def test_float_state_updated_from_itself_stays_in_pytorch() -> None:
    """A float counter (count += 1) would carry fp16 rounding from call to call on HTP (and stop at 2048): that
    graph runs in PyTorch, exactly."""

    def fn(count: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        count.add_(1.0)
        return x * count

    count, x = torch.zeros(()), torch.ones(3)
    compiled = torch.compile(fn, backend="qnn", options={"soc_model": 60})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            compiled(count, x)
    assert float(count) == 3.0
    assert all(r.device == "eager" for r in qnnx_backend.compile_reports())


def test_a_write_that_cannot_be_lifted_falls_back_and_is_not_lost() -> None:
    """A slice assignment (not translated yet) runs in PyTorch with a warning; the write still happens."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        t[0] = 3.0
        return t * 2

    x = torch.randn(4, 8)
    expected = x.clone()
    expected[0] = 3.0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(fn, backend="qnn", options={"soc_model": 60})(x)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(out, expected * 2)


_OPS = st.sampled_from(["count", "index_copy", "copy", "accumulate"])


@given(ops=st.lists(st.tuples(_OPS, st.booleans()), min_size=1, max_size=4), steps=st.integers(1, 3))
def test_random_in_place_sequences_leave_the_same_tensors_as_eager(ops: list[tuple[str, bool]], steps: int) -> None:
    """Property: random in-place updates of buffers and of an input, over a few calls, leave every written tensor
    and every output as eager PyTorch does. Overwrites and integer counters run on QNN; a float tensor updated from
    its own value keeps the graph in PyTorch."""

    class Writer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", torch.ones(3, 4))
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))

        def forward(self, x: torch.Tensor, src: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
            for op, on_buffer in ops:
                target = self.state if on_buffer else x
                if op == "count":
                    self.count.add_(1)
                elif op == "index_copy":
                    target.index_copy_(0, row, src[:1] * 2.0 - 1.0)
                elif op == "copy":
                    target.copy_(src * 0.5 + 1.0)
                else:
                    target.mul_(0.9)
            return self.state.sum(0) + x.sum(0) + self.count

    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    model, reference = Writer().eval(), Writer().eval()
    compiled = torch.compile(model, backend="qnn", options={"soc_model": 60})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(steps):
            x = torch.linspace(-1, 1, 12).reshape(3, 4) + step
            x_ref = x.clone()
            src = torch.linspace(2, 3, 12).reshape(3, 4) * (step + 1)
            row = torch.tensor([step % 3])
            assert_close_fp16(compiled(x, src, row), reference(x_ref, src, row), rel=5e-2)
            assert_close_fp16(x, x_ref, rel=5e-2)
            assert_close_fp16(model.state, reference.state, rel=5e-2)
            assert int(model.count) == int(reference.count)
    reports = qnnx_backend.compile_reports()
    accumulates = any(op == "accumulate" for op, _ in ops)
    assert reports and all(r.on_qnn is not accumulates for r in reports), [r.summary() for r in reports]
