"""In-place writes to inputs and buffers are lifted: the graph runs on QNN and the caller's tensors end as eager
leaves them. A write that cannot be lifted falls back; a write is never dropped."""

from __future__ import annotations

import warnings

import torch
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16

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
    report = _decode_steps(_KVCache, 8)
    assert report.on_qnn


def _decode_steps(cache: type[_KVCache], steps: int) -> qnnx_backend.CompileReport:
    """Run ``steps`` decode steps compiled (strict, on QNN) and in eager; after each, the output, the cache and the
    counter must match. Returns the one compile report."""
    torch.manual_seed(0)
    model, reference = cache().eval(), cache().eval()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        for step in range(steps):
            new, position = torch.randn(1, 2, 1, 4), torch.tensor([step])
            assert_close_fp16(compiled(new, position), reference(new, position))
            assert_close_fp16(model.keys, reference.keys)
            assert int(model.length) == int(reference.length) == step + 1
    (report,) = qnnx_backend.compile_reports()
    return report


class _SlidingWindow(torch.nn.Module):
    """A full sliding window the way transformers' static sliding-window layer updates it: roll left by one, write
    the new row last, copy back."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keys", torch.randn(1, 2, 6, 4))
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, new: torch.Tensor) -> torch.Tensor:
        rolled = self.keys.roll(-1, dims=-2)
        rolled[:, :, torch.tensor([-1])] = self.proj(new)
        self.keys.copy_(rolled)
        return torch.softmax(self.keys.sum(-1), dim=-1)


def test_sliding_window_roll_runs_on_qnn_and_matches_eager_step_by_step() -> None:
    """Ten steps of a full sliding window (more than its length, so every row has been moved and replaced): one
    QNN graph, and after every step the output and the window match eager."""
    torch.manual_seed(0)
    model, reference = _SlidingWindow().eval(), _SlidingWindow().eval()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        for _ in range(10):
            new = torch.randn(1, 2, 1, 4)
            assert_close_fp16(compiled(new), reference(new))
            assert_close_fp16(model.keys, reference.keys)
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


def test_slice_and_index_assignments_are_lifted_onto_qnn() -> None:
    """Slice assignment, element assignment and index_put_ with runtime (also negative) positions run on QNN under
    strict, and leave the tensors as eager does."""

    def fn(t: torch.Tensor, u: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t[0] = 3.0
        t[:, 1:3] = v[:, :2]
        u[i] = v[: i.shape[0]]
        return t + u

    t, u, v = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    i = torch.tensor([1, -1])
    t_ref, u_ref = t.clone(), u.clone()
    expected = fn(t_ref, u_ref, i, v)
    with torch.no_grad():
        out = torch.compile(fn, backend="qnn", options=NPU_STRICT)(t, u, i, v)
    assert_close_fp16(t, t_ref)
    assert_close_fp16(u, u_ref)
    assert_close_fp16(out, expected)
    assert all(r.on_qnn for r in qnnx_backend.compile_reports())


class _FlippedCache(_KVCache):
    """The same cache, written from values the direct translator cannot translate (``flip`` has no handler)."""

    def forward(self, new: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.length.add_(new.shape[2])
        self.keys.index_copy_(2, position, self.proj(torch.flip(new, [-1])))
        return torch.softmax(self.keys.sum(-1), dim=-1)


def test_writes_of_a_graph_the_translator_declines_are_lifted_through_torch_onnx() -> None:
    """A cache written from an op without a direct translation still runs on QNN, exported by torch.onnx from
    the lifted trace: after every step the cache, the counter and the output match eager (never a dropped write)."""
    report = _decode_steps(_FlippedCache, 4)
    assert report.on_qnn and "verify_export" in report.timings, report.summary()  # torch.onnx made the model


def test_a_write_that_cannot_be_lifted_falls_back_and_is_not_lost() -> None:
    """An accumulating index_put_ (a sum HTP would take in fp16) runs in PyTorch with a warning; the write still
    happens."""

    def fn(t: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t.index_put_((i,), v, accumulate=True)
        return t * 2

    x, i, v = torch.randn(4, 8), torch.tensor([0, 0, 2]), torch.randn(3, 8)
    expected = x.clone().index_put_((i,), v, accumulate=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(fn, backend="qnn", options={"soc_model": 60})(x, i, v)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(out, expected * 2)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "eager" and "accumulate" in (report.reason or ""), report.summary()


_OPS = st.sampled_from(["count", "index_copy", "copy", "accumulate", "slice", "index_put"])


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
                elif op == "slice":
                    target[:, 1:3] = src[:, :2] - 0.5
                elif op == "index_put":
                    target[row - 3] = src[1:2] * 0.25  # a negative position, counted from the end
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
    # A float target accumulates when a mul_ is not overwritten by a later copy_ (index_copy_ keeps other rows).
    accumulates = False
    for target in (True, False):
        mine = [op for op, on_buffer in ops if on_buffer is target and op in ("accumulate", "copy")]
        accumulates |= bool(mine) and mine[-1] == "accumulate"
    assert reports and all(r.on_qnn is not accumulates for r in reports), [r.summary() for r in reports]
