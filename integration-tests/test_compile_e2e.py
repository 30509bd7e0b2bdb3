"""torch.compile(backend="qnn") end to end on the real QNN HTP backend (the host simulator on x86_64)."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from integration_helpers import assert_close_fp16
from integration_models import MLP, SmallCNN, randomize_batchnorm, transformer_layer
from torch import nn

import qnnx_backend
from qnnx_backend.errors import InvalidOptionsError, QnnDeviceError, QnnFallbackWarning, UnsupportedGraphError

NPU_STRICT = {"device": "npu", "strict": True}


def _only_report() -> qnnx_backend.CompileReport:
    reports = qnnx_backend.compile_reports()
    assert len(reports) == 1, [r.summary() for r in reports]
    return reports[0]


@pytest.mark.parametrize(
    ("name", "make", "shape"),
    [
        ("mlp", lambda: MLP((16, 32, 32, 8), act=nn.GELU), (4, 16)),
        ("cnn_batchnorm", lambda: randomize_batchnorm(SmallCNN()), (2, 3, 16, 16)),
        ("transformer_encoder_layer", transformer_layer, (2, 8, 32)),
    ],
)
def test_model_runs_wholly_on_qnn_htp_and_matches_eager(name, make, shape):
    """MLP, CNN+BatchNorm and a Transformer encoder layer compile for the NPU (strict) and match eager at fp16 level."""
    model = make().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="qnn", options=NPU_STRICT)(x)
    report = _only_report()
    assert report.device == "npu" and report.on_qnn
    assert report.is_simulator is True and report.soc_model == 60
    assert_close_fp16(got, expected)


def test_second_call_reuses_the_compiled_graph_and_stays_correct():
    """Calling again with new values of the same shape runs the same QNN graph and follows the new inputs."""
    model = MLP().eval()
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 16)
            assert_close_fp16(compiled(x), model(x))
    assert len(qnnx_backend.compile_reports()) == 1


def test_gpu_strict_fails_naming_the_device_and_cause():
    """On a machine without an Adreno GPU, device='gpu' with strict=True raises a QnnDeviceError that says why."""
    model = MLP().eval()
    with torch.no_grad(), pytest.raises(Exception) as info:
        torch.compile(model, backend="qnn", options={"device": "gpu", "strict": True})(torch.randn(2, 16))
    err = info.value
    while err is not None and not isinstance(err, QnnDeviceError):
        err = err.__cause__ or err.__context__
    assert isinstance(err, QnnDeviceError), repr(info.value)
    assert err.device == "gpu"
    assert "gpu" in str(err).lower() and "initiali" in err.cause.lower()


def test_gpu_without_strict_falls_back_to_eager_with_the_reason():
    """device='gpu' without strict runs the original graph when the GPU cannot initialize, and says so."""
    model = MLP().eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options={"device": "gpu"})(x)
        torch.testing.assert_close(got, model(x))
    report = _only_report()
    assert report.device == "eager"
    assert [a.device for a in report.attempts] == ["gpu"]
    assert "initiali" in report.attempts[0].reason.lower()


class _Asinh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.asinh(x) * 2.0


def test_auto_walks_the_chain_npu_gpu_eager():
    """With device='auto', a graph HTP rejects goes to the GPU (unusable here) and then to eager PyTorch."""
    x = torch.randn(4, 8)
    with torch.no_grad():
        got = torch.compile(_Asinh(), backend="qnn")(x)
    torch.testing.assert_close(got, torch.asinh(x) * 2.0)
    report = _only_report()
    assert report.device == "eager"
    assert [a.device for a in report.attempts] == ["npu", "gpu"]
    assert "Asinh" in report.attempts[0].reason
    assert not report.attempts[1].ok  # the GPU cannot take it here (opcheck or a backend that cannot initialize)


def test_auto_runs_on_npu_when_it_can():
    """device='auto' (the default) puts a supported graph on QNN HTP."""
    model = MLP().eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn")(x)
        assert_close_fp16(got, model(x))
    assert _only_report().device == "npu"


def test_strict_npu_rejects_unsupported_ops_listing_all_of_them():
    """strict=True on the NPU fails before building a session and names every unsupported node."""

    class TwoBad(nn.Module):
        def forward(self, x):
            return torch.asinh(x) + torch.atanh(x.clamp(-0.5, 0.5))

    with torch.no_grad(), pytest.raises(QnnDeviceError) as info:
        torch.compile(TwoBad(), backend="qnn", options=NPU_STRICT)(torch.randn(4, 8))
    assert "Asinh" in str(info.value) and "Atanh" in str(info.value)


def test_device_cpu_runs_the_original_graph():
    """device='cpu' runs the original PyTorch graph: bit-identical to eager, no ONNX and no QNN involved."""
    model = SmallCNN().eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options={"device": "cpu"})(x)
        assert torch.equal(got, model(x))
    report = _only_report()
    assert report.device == "eager" and report.attempts == ()


# -- calls the backend must never get wrong ---------------------------------------------------------------------


def test_grad_enabled_keeps_autograd_working():
    """With grad enabled and trainable parameters, the output still requires grad and backward works (eager run)."""
    model = MLP().eval()
    x = torch.randn(2, 16)
    with pytest.warns(QnnFallbackWarning, match="grad"):
        out = torch.compile(model, backend="qnn")(x)
    assert out.requires_grad
    out.sum().backward()
    assert model.net[0].weight.grad is not None


def test_grad_enabled_under_strict_raises():
    """strict=True refuses a graph whose frozen run would drop requires_grad, and says how to fix it."""
    with pytest.raises(UnsupportedGraphError, match="no_grad"):
        torch.compile(MLP().eval(), backend="qnn", options=NPU_STRICT)(torch.randn(2, 16))


def test_training_mode_batchnorm_updates_running_stats_like_eager():
    """BatchNorm in train mode runs in PyTorch: same output and same running statistics as eager."""
    torch.manual_seed(1)
    a, b = SmallCNN().train(), SmallCNN().train()
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad(), pytest.warns(QnnFallbackWarning):
        got = torch.compile(a, backend="qnn")(x)
    with torch.no_grad():
        expected = b(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(a.features[1].running_mean, b.features[1].running_mean)


def test_training_mode_dropout_is_not_frozen_away():
    """Dropout in train mode runs in PyTorch (random zeros), never silently as identity."""
    model = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5)).train()
    x = torch.randn(8, 64)
    with torch.no_grad(), pytest.warns(QnnFallbackWarning):
        out = torch.compile(model, backend="qnn")(x)
    assert (out == 0).float().mean() > 0.2


def test_training_mode_under_strict_raises():
    """strict=True refuses a training-mode graph instead of freezing it."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    with torch.no_grad(), pytest.raises(UnsupportedGraphError):
        torch.compile(model, backend="qnn", options=NPU_STRICT)(torch.randn(2, 8))


def test_in_place_mutation_of_an_input_is_applied():
    """A float input updated from its own value (x += 1: fp16 rounding would accumulate on HTP) runs in PyTorch,
    so the caller sees the mutation exactly as in eager."""

    def f(x):
        x.add_(1)
        return x * 2

    x = torch.zeros(3)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(f, backend="qnn")(x)
    assert torch.equal(x, torch.ones(3)) and torch.equal(out, torch.full((3,), 2.0))
    assert [r.device for r in qnnx_backend.compile_reports()] == ["eager"]


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count += 1
        return x * self.count


def test_buffer_mutation_is_not_frozen_stale():
    """A module that updates a buffer each call keeps counting, as in eager (a frozen copy would go stale)."""
    model = _Counter()
    compiled = torch.compile(model, backend="qnn")
    x = torch.ones(2)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", QnnFallbackWarning)
        compiled(x)
        out = compiled(x)
    assert model.count.item() == 2.0 and torch.equal(out, torch.full((2,), 2.0))


def _update_in_place(layer: nn.Linear) -> None:
    layer.weight.mul_(-2.0)


def _replace(layer: nn.Linear) -> None:
    layer.weight = nn.Parameter(torch.randn_like(layer.weight), requires_grad=False)


@pytest.mark.parametrize("change", [_update_in_place, _replace], ids=["in_place", "replaced"])
def test_weights_changed_after_compile_are_picked_up(change):
    """A weight updated in place after compile (like an optimizer step) or replaced by another tensor recompiles
    instead of using stale weights."""
    model = MLP().eval()
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    x = torch.randn(2, 16)
    with torch.no_grad():
        compiled(x)
        change(model.net[0])
        assert_close_fp16(compiled(x), model(x))
    assert len(qnnx_backend.compile_reports()) == 2


def test_modules_of_one_structure_compiled_apart_compile_once_each():
    """Two layers of the same structure compiled apart share Dynamo's graph, which passes each layer's weights:
    alternating calls reuse each layer's program (one compile per layer), and each gives its own layer's result.
    A layer whose weights are then updated in place is compiled again, once."""
    first, second = MLP().eval(), MLP().eval()
    compiled = [torch.compile(m, backend="qnn", options=NPU_STRICT) for m in (first, second)]
    x = torch.randn(2, 16)
    with torch.no_grad():
        for _ in range(3):
            for module, fn in zip((first, second), compiled, strict=True):
                assert_close_fp16(fn(x), module(x))
        assert len(qnnx_backend.compile_reports()) == 2
        _update_in_place(first.net[0])
        for _ in range(2):
            for module, fn in zip((first, second), compiled, strict=True):
                assert_close_fp16(fn(x), module(x))
    assert len(qnnx_backend.compile_reports()) == 3


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.lin = nn.Linear(16, 4)

    def forward(self, ids, x):
        return self.lin(self.emb(ids) + x)


def test_inputs_that_need_a_conversion_match_eager():
    """Inputs fed to ORT after a conversion (int64 ids as int32, a non-contiguous view) give eager's result, and so
    do the same values passed as they are."""
    model = _Embed().eval()
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    ids = torch.randint(0, 50, (3, 5))
    x = torch.randn(5, 3, 16).transpose(0, 1)
    assert not x.is_contiguous()
    with torch.no_grad():
        assert_close_fp16(compiled(ids, x), model(ids, x))
        assert_close_fp16(compiled(ids, x.contiguous()), model(ids, x))


def test_new_input_shape_compiles_a_new_static_graph():
    """With buckets=None each new input shape gets its own static QNN graph, and every shape's result is right."""
    model = MLP().eval()
    compiled = torch.compile(model, backend="qnn", options={**NPU_STRICT, "buckets": None})
    with torch.no_grad():
        for batch in (2, 5, 7, 5):
            x = torch.randn(batch, 16)
            assert_close_fp16(compiled(x), model(x))
    shapes = sorted({r.input_shapes for r in qnnx_backend.compile_reports()})
    assert len(shapes) == 3 and all(r.device == "npu" for r in qnnx_backend.compile_reports())


# -- output structure and dtypes ---------------------------------------------------------------------------------


class _Structured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        y = self.lin(x)
        return {"logits": y, "pair": (y.relu(), None), "list": [y * 2], "n": x.shape[0], "idx": y.argmax(-1)}


def test_output_structure_and_dtypes_are_kept():
    """Dicts, tuples, lists, None, Python ints and integer tensors come back as eager returns them."""
    model = _Structured().eval()
    x = torch.randn(3, 8) * 4
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options=NPU_STRICT)(x)
        ref = model(x)
    assert set(got) == set(ref) and got["n"] == 3 and got["pair"][1] is None
    assert isinstance(got["pair"], tuple) and isinstance(got["list"], list)
    assert got["idx"].dtype == torch.int64 and got["idx"].shape == ref["idx"].shape
    assert_close_fp16(got["logits"], ref["logits"])
    assert_close_fp16(got["list"][0], ref["list"][0])
    assert got["logits"].device.type == "cpu"


def test_bad_options_fail_before_any_work_naming_valid_keys():
    """An unknown option key raises InvalidOptionsError listing the valid keys."""
    with pytest.raises(InvalidOptionsError, match="valid keys: device"):
        torch.compile(MLP(), backend="qnn", options={"devcie": "npu"})(torch.randn(2, 16))


@given(
    sizes=st.lists(st.integers(1, 24), min_size=2, max_size=4).map(tuple),
    batch=st.integers(1, 4),
)
def test_generated_mlps_agree_with_eager(sizes, batch):
    """Property: MLPs of generated widths compiled with backend='qnn' on the NPU agree with eager at fp16 level."""
    torch._dynamo.reset()
    torch.manual_seed(sum(sizes) + batch)
    model = MLP(sizes).eval()
    x = torch.randn(batch, sizes[0]) * 3
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="qnn", options=NPU_STRICT)(x)
    if expected.abs().max() > 1e-2:
        assert_close_fp16(got, expected)
    else:
        torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)


def test_fp16_runs_on_qnn_and_returns_the_callers_dtype():
    """fp16=True exports the graph in float16 and still returns float32 outputs that match eager at fp16 level."""
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options={**NPU_STRICT, "fp16": True})(x)
        assert_close_fp16(got, model(x))
    assert _only_report().device == "npu"


def test_soc_model_by_chip_name_is_used_and_reported():
    """soc_model='SM8650' compiles for SoC 57 and the report names the chip."""
    model = MLP().eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options={**NPU_STRICT, "soc_model": "SM8650"})(x)
        assert_close_fp16(got, model(x))
    report = _only_report()
    assert report.soc_model == 57 and report.soc_name == "SM8650"


@pytest.mark.parametrize("exporter", ["auto", "fast", "torch.onnx"])
def test_each_exporter_runs_on_qnn_and_matches_eager(exporter):
    """The direct translator and the torch.onnx escape hatch both give a graph that runs wholly on QNN, correctly."""
    model = randomize_batchnorm(SmallCNN()).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="qnn", options={**NPU_STRICT, "exporter": exporter})(x)
    assert _only_report().on_qnn
    assert_close_fp16(got, expected)


def test_fast_exporter_refuses_a_graph_it_cannot_translate_naming_why():
    """exporter='fast' with an op outside the translator: strict mode raises with the translator's reason."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x.relu(), [1]) * 2

    compiled = torch.compile(fn, backend="qnn", options={**NPU_STRICT, "exporter": "fast"})
    with pytest.raises((QnnDeviceError, UnsupportedGraphError), match="direct translator cannot take"), torch.no_grad():
        compiled(torch.randn(3, 5))


def test_integer_division_with_rounding_runs_wholly_on_qnn_with_eagers_values():
    """Integer ``//`` and ``torch.div(..., rounding_mode="trunc")`` by a power of two (HTP's own integer Div rounds a
    negative quotient down there) and by a tensor of divisors: the translator's form runs wholly on QNN under strict,
    qnnx-opcheck vouching for every node, and gives eager's integers with the first-call check off."""
    a = torch.tensor([[-70001, -17, -16, -15, -1, 0, 1, 15, 16, 17, 70001, -9]])
    b = torch.tensor([[3, -3, 4, -4, 16, -16, 2, -2, 7, -7, 64, 5]])

    def divide(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x // 16, torch.div(x, 4, rounding_mode="trunc"), x // y, (x * 3 + 1) // -2

    qnnx_backend.clear_compile_reports()
    options = {"device": "npu", "strict": True, "soc_model": 60, "verify": False}
    out = torch.compile(divide, backend="qnn", options=options)(a, b)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and not report.cpu_nodes and report.export.exporter == "fast", report.summary()
    for got, want in zip(out, divide(a, b), strict=True):
        assert torch.equal(got, want), (got, want)
