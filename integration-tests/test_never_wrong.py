"""Inputs and ops that used to give silently wrong values, or kill the process, now give PyTorch's answer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16

import qnnx_backend

NPU = {"device": "auto", "soc_model": 60}


def _run(fn: object, *args: torch.Tensor, **options: object) -> tuple[object, list[qnnx_backend.CompileReport]]:
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(fn, backend="qnn", options={**NPU, **options})(*args)
    return out, list(qnnx_backend.compile_reports())


def test_zero_element_inputs_do_not_reach_qnn() -> None:
    """(x * y).sum(-1) on empty vectors returns eager's 0 instead of SIGFPE inside QNN (checked in a child)."""
    code = textwrap.dedent(
        """
        import warnings, torch, qnnx_backend
        warnings.simplefilter("ignore")
        f = torch.compile(lambda x, y: (x * y).sum(-1), backend="qnn", options={"soc_model": 60})
        out = f(torch.randn(0), torch.randn(0))
        (rep,) = qnnx_backend.compile_reports()
        print(float(out), rep.device, "zero elements" in rep.reason)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"process died with {proc.returncode}: {proc.stderr[-800:]}"
    assert proc.stdout.split()[-3:] == ["0.0", "eager", "True"]


def test_a_projection_regrouped_at_rank5_does_not_kill_the_process() -> None:
    """A Linear's [..., N] output viewed as rank 5 [..., N, k] (QNN HTP builds it and dies at the first run) gives
    eager's values, with the refused Reshape named in the report (checked in a child)."""
    code = textwrap.dedent(
        """
        import warnings, torch, qnnx_backend
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        proj = torch.nn.Linear(2, 2).eval()
        fn = lambda x: proj(x).reshape(2, 2, 2, 2, 2).transpose(3, 4).reshape(4, 8) * 2
        x = torch.randn(4, 4, 2)
        with torch.no_grad():
            out = torch.compile(fn, backend="qnn", options={"soc_model": 60})(x)
            ref = fn(x)
        (rep,) = qnnx_backend.compile_reports()
        print(float((out - ref).abs().max()) < 1e-2, "SIGSEGV" in (rep.reason or ""))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"process died with {proc.returncode}: {proc.stderr[-800:]}"
    assert proc.stdout.split()[-2:] == ["True", "True"]


def test_empty_intermediate_graph_runs_in_pytorch_with_reason() -> None:
    """A graph whose slice is empty runs in PyTorch, and the report says why."""
    x = torch.randn(2, 4)
    out, reports = _run(lambda t: t[:, 5:].relu().sum(-1) + t.sum(-1), x)
    torch.testing.assert_close(out, x[:, 5:].relu().sum(-1) + x.sum(-1))
    assert [r.device for r in reports] == ["eager"]
    assert "no elements" in (reports[0].reason or "")  # qnnx-opcheck refuses the ONNX node that holds it


def test_complex_values_without_a_real_rewrite_stay_in_pytorch() -> None:
    """An op on a complex value with no real-pair rewrite (exp) is not exported (ONNX has no complex type): the
    graph runs eagerly and is right, and the reason names the op."""
    x = torch.randn(3, 2)
    out, reports = _run(lambda t: torch.view_as_real(torch.exp(torch.view_as_complex(t))), x)
    torch.testing.assert_close(out, torch.view_as_real(torch.exp(torch.view_as_complex(x))))
    assert reports[0].device == "eager" and "complex" in (reports[0].reason or "")
    assert "exp" in (reports[0].reason or "")


def test_complex_products_run_on_qnn_as_real_pairs() -> None:
    """A complex product between real inputs and outputs is carried as real pairs and runs on QNN with eager's
    values."""
    x = torch.randn(3, 2)
    out, reports = _run(lambda t: torch.view_as_real(torch.view_as_complex(t) * (1 + 2j)), x)
    torch.testing.assert_close(out, torch.view_as_real(torch.view_as_complex(x) * (1 + 2j)), rtol=2e-3, atol=2e-3)
    assert reports[0].device == "npu" and not reports[0].cpu_nodes, reports[0].summary()


def test_unfaithful_torch_onnx_lowering_is_caught() -> None:
    """avg_pool2d with divisor_override (torch.onnx drops it; the direct translator keeps it) exported by torch.onnx
    is verified on the CPU EP and never compiled."""
    x = torch.randn(1, 3, 9, 9)
    fn = lambda t: F.avg_pool2d(t, 3, 1, 1, True, False, 2)  # noqa: E731
    out, reports = _run(fn, x, exporter="torch.onnx")
    torch.testing.assert_close(out, fn(x))
    assert reports[0].device == "eager"
    assert "did not pass the check against PyTorch" in (reports[0].reason or "")


@pytest.mark.parametrize(
    "fn",
    [torch.ceil, torch.trunc, lambda t: torch.sort(t.flatten()).indices],
    ids=["ceil", "trunc", "argsort"],
)
def test_fp16_discontinuous_ops_are_exact(fn: object) -> None:
    """ceil/trunc/sort on values that fp16 would round across an integer give eager's exact answer."""
    x = torch.linspace(-9, 9, 401) + 1e-3  # many values sit just above an integer: fp16 rounds them onto it
    out, _ = _run(fn, x)
    torch.testing.assert_close(out, fn(x), rtol=0, atol=0)


def test_frac_is_off_by_fp16_rounding_of_its_input_not_by_a_step() -> None:
    """frac = x - trunc(x): trunc runs on the CPU EP (exact), the subtraction on QNN, which rounds x to fp16 as it
    does for every op: the error stays within fp16 rounding of x (2**-11 of |x|), never a whole step."""
    x = torch.linspace(-9, 9, 401) + 1e-3
    out, _ = _run(torch.frac, x)
    assert isinstance(out, torch.Tensor)
    assert (out - torch.frac(x)).abs().max() <= x.abs().max() * 2**-10


def test_logsigmoid_is_right_on_qnn() -> None:
    """logsigmoid runs on QNN (as -softplus(-x)) within fp16 tolerance, where Log(Sigmoid) was 0.15 off."""
    x = torch.linspace(-9, 9, 64)
    out, reports = _run(F.logsigmoid, x)
    assert reports[0].on_qnn, reports[0].summary()
    assert_close_fp16(out, F.logsigmoid(x))


@given(magnitude=st.sampled_from([1.0, 300.0, 3000.0]), eps=st.sampled_from([1e-6, 0.5]))
def test_rms_norm_of_large_rows_is_right_on_qnn(magnitude: float, eps: float) -> None:
    """rms_norm of rows whose squares overflow fp16 (|x| > 256) runs on QNN as RMSNormalization, right."""
    x = torch.randn(2, 3, 16) * magnitude
    w = torch.randn(16)
    fn = lambda t, weight: F.rms_norm(t, (16,), weight, eps=eps)  # noqa: E731
    out, reports = _run(fn, x, w)
    assert all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert_close_fp16(out, fn(x, w))


@given(
    magnitude=st.sampled_from([1e-4, 1.0, 300.0]),
    form=st.sampled_from(["normalize", "norm", "hand_written", "std", "rms"]),
)
def test_l2_norms_of_large_and_tiny_rows_are_right_on_qnn(magnitude: float, form: str) -> None:
    """F.normalize, Tensor.norm, sqrt(sum(x * x)), std and an RMS of rows whose squares sum past float16's range
    (|x| ~ 300, where HTP's own norm saturates near 362) or underflow it (|x| ~ 1e-4) run on QNN and are right."""
    x = torch.randn(2, 8, 32) * magnitude
    fn = {
        "normalize": lambda t: F.normalize(t, dim=-1),
        "norm": lambda t: t.norm(dim=-1, keepdim=True),
        "hand_written": lambda t: (t * t).sum(-1, keepdim=True).sqrt(),
        "std": lambda t: t.std(-1),
        "rms": lambda t: t.pow(2).mean(-1, keepdim=True).sqrt(),
    }[form]
    out, reports = _run(fn, x)
    assert all(r.on_qnn for r in reports), [r.summary() for r in reports]
    ref = fn(x).double()
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2  # relative: norms of 1e-4 rows are tiny


_WIDE_FUNCTIONS = {
    "softplus": F.softplus,
    "logsigmoid": F.logsigmoid,
    "mish": F.mish,
    "log_softmax": lambda t: F.log_softmax(t, -1),
    "logsumexp": lambda t: torch.logsumexp(t, -1),
    "sigmoid_by_hand": lambda t: 1 / (1 + torch.exp(-t)),
    "softmax_by_hand": lambda t: torch.exp(t - t.amax(-1, keepdim=True)).div(
        torch.exp(t - t.amax(-1, keepdim=True)).sum(-1, keepdim=True)
    ),
}


@pytest.mark.parametrize("name", sorted(_WIDE_FUNCTIONS))
def test_exponentials_of_wide_rows_are_right_on_qnn(name: str) -> None:
    """Functions built on exp (softplus, logsigmoid, mish, log_softmax, logsumexp, a hand-written sigmoid and
    softmax) of values spread over [-1000, 1000], where HTP's Exp, LogSoftmax and Mish return garbage, run on QNN
    and are right."""
    fn = _WIDE_FUNCTIONS[name]
    x = torch.linspace(-1000, 1000, 2 * 8 * 16).reshape(2, 8, 16)[:, torch.randperm(8)]
    out, reports = _run(fn, x)
    assert all(r.on_qnn for r in reports), [r.summary() for r in reports]
    ref = fn(x).double()
    assert float((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1.0)) < 1e-2


def test_swin_window_partition_runs_wholly_on_qnn() -> None:
    """A 6-D window partition/reverse (Swin) compiles under strict NPU placement and matches eager."""

    class Windows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, h, w, c = x.shape
            win = x.view(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 2, 2, c)
            win = self.proj(win)
            back = win.view(b, h // 2, w // 2, 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
            return back + x

    model = Windows().eval()
    x = torch.randn(2, 4, 6, 8)
    with torch.no_grad():
        out = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True, "soc_model": 60})(x)
        ref = model(x)
    assert_close_fp16(out, ref)
    (report,) = qnnx_backend.compile_reports()
    assert report.on_qnn and "fold_high_rank_transpose" in report.passes_applied


def test_sdpa_with_fully_masked_rows_is_right_on_qnn() -> None:
    """SDPA with a boolean mask (a fully masked query row included) runs on QNN and gives eager's zeros there."""
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 0, :] = False  # query 0 may attend to nothing: PyTorch returns 0 for it
    mask[..., 2, 3] = False
    fn = lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m)  # noqa: E731
    out, reports = _run(fn, q, k, v, mask)
    ref = fn(q, k, v, mask)
    assert all(r.on_qnn for r in reports), [r.summary() for r in reports]
    assert torch.equal(ref[..., 0, :], torch.zeros_like(ref[..., 0, :]))
    assert_close_fp16(out, ref)


def test_a_result_beyond_float16_runs_in_pytorch_with_the_reason() -> None:
    """erfcx of negative inputs (about 3e9 at -4.6) is beyond float16's 65504, where HTP saturates: the graph runs
    in PyTorch and says why, instead of returning 131008 (the split graph's Exp saturated on HTP)."""
    x = torch.linspace(-4.6, 6.5, 20)
    out, reports = _run(torch.special.erfcx, x)
    torch.testing.assert_close(out, torch.special.erfcx(x))
    assert [r.device for r in reports] == ["eager"]
    assert "65504" in (reports[0].reason or "")
    with torch.no_grad():  # explain() says the same before any compile
        (graph,) = qnnx_backend.explain(torch.special.erfcx, x, **NPU).graphs
    assert graph.final_device == "eager" and "65504" in (graph.reason or "")


def test_a_result_beyond_float16_raises_under_strict() -> None:
    """With strict on the NPU the same refusal is an error naming the limit."""
    torch._dynamo.reset()
    compiled = torch.compile(torch.exp, backend="qnn", options={"device": "npu", "strict": True, "soc_model": 60})
    with torch.no_grad(), pytest.raises(qnnx_backend.errors.QnnDeviceError, match="65504"):
        compiled(torch.linspace(0.0, 12.0, 8))  # exp(12) = 162755


@given(scale=st.sampled_from([0.5, 1e3, 7e4, 1e6]), sign=st.sampled_from([1.0, -1.0]))
def test_scaled_outputs_run_on_qnn_only_within_float16(scale: float, sign: float) -> None:
    """A linear map whose outputs reach scale: on QNN while they fit float16, in PyTorch beyond; never wrong."""
    weight = torch.full((4, 3), sign * scale / 4.0)
    x = torch.ones(2, 4)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x @ weight

    out, reports = _run(f, x)
    assert [r.device for r in reports] == (["npu"] if scale <= 65504 else ["eager"])
    assert_close_fp16(out, f(x))


def _moe_decoder(family: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    common = {
        "vocab_size": 128,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "use_cache": False,
        "num_experts_per_tok": 2,
    }
    if family == "mixtral":
        model = transformers.MixtralForCausalLM(
            transformers.MixtralConfig(**common, intermediate_size=64, num_local_experts=4)
        )
    elif family == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(
            **common, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4
        )
        model = transformers.Qwen2MoeForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3MoeConfig(
            **common, intermediate_size=64, moe_intermediate_size=32, num_experts=4, head_dim=8
        )
        model = transformers.Qwen3MoeForCausalLM(cfg)
    model.eval().set_experts_implementation("batched_mm")
    return model


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_decoder_runs_on_qnn_with_eagers_logits(family: str) -> None:
    """Tiny MoE decoders with Hugging Face's static-shape experts (``batched_mm``) pick each token's expert weights
    with ``w[ids]``, which torch.onnx writes as a GatherND by 32 runtime indices: QNN HTP repeats the first 8 slices
    there (Mixtral's logits: cosine 0.0006). qnnx writes it as a Gather, so the graph runs wholly on QNN with eager's
    logits (cosine 0.9999996-0.9999998 measured), the router's TopK included (its input, the router's softmax, is
    computed on QNN, so it is fp16 wherever TopK runs) and torch.onnx's IsNaN guard of the attention softmax; the
    first-call check off so that nothing hides a wrong result."""
    model = _moe_decoder(family)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(lambda t: model(input_ids=t).logits, backend="qnn", options={**NPU, "verify": False})(ids)
    reports = list(qnnx_backend.compile_reports())
    assert_close_fp16(out, ref, rel=2e-2, cos=0.999)
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]


def test_integer_bools_and_remainders_give_eagers_values() -> None:
    """(ids - 3).bool() of negative integers (HTP's Cast gives False) and ids % 7 of dividends past 2048 (HTP
    computes an integer Mod in fp16) give eager's values: the bool as a comparison on QNN, the remainder on the
    CPU EP."""
    fn = lambda ids: ((ids - 3).bool(), ids % 7)  # noqa: E731
    ids = torch.tensor([[0, 1, 2, 3, 4, -5, 70000, -70000, 4097, -2047]])
    out, reports = _run(fn, ids)
    ref = fn(ids)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]), (out, ref)
    assert all(r.on_qnn for r in reports) and "int_cast_to_bool" in reports[0].passes_applied, [
        r.summary() for r in reports
    ]


@pytest.mark.parametrize(
    ("fn", "bound"), [(torch.erf, 10.0), (torch.special.erfc, 4.0), (torch.sinh, 11.0), (torch.cosh, 11.0)]
)
def test_functions_the_ep_declines_run_on_qnn_written_out(fn: object, bound: float) -> None:
    """erf, erfc, sinh and cosh (the QNN EP declines Erf, Sinh and Cosh) run wholly on QNN with eager's values over
    [-bound, bound], and near 0."""
    for x in (torch.linspace(-bound, bound, 401), torch.linspace(-1e-2, 1e-2, 401)):
        out, reports = _run(fn, x)
        assert all(r.on_qnn and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
        ref = fn(x)  # type: ignore[operator]
        assert float((out - ref).abs().max() / ref.abs().max()) < 1e-2
