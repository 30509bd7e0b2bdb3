"""Model families beyond the corpus, each in a tiny random configuration: every graph wholly on QNN (no CPU-EP node,
strict placement: a fallback raises) with eager's outputs, the first-call check off so that nothing hides a wrong
result."""

from __future__ import annotations

import warnings

import pytest
import torch
from integration_helpers import assert_close_fp16
from integration_models import randomize_batchnorm

import qnnx_backend

NPU_RAW = {"device": "npu", "strict": True, "soc_model": 60, "verify": False}


def _roberta() -> tuple[torch.nn.Module, torch.Tensor]:
    """RoBERTa counts its position ids from the mask (``cumsum(ids != pad) * mask + pad``) and gathers its token
    type ids by them with ``torch.gather``."""
    import transformers

    cfg = transformers.RobertaConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    ids = torch.randint(2, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    ids[1, -3:] = cfg.pad_token_id  # a padded row
    return transformers.RobertaModel(cfg), ids


def _siglip_vision() -> tuple[torch.nn.Module, torch.Tensor]:
    """SigLIP's vision tower (PaliGemma's, SmolVLM's) embeds patches with ``Conv2d(padding="valid")``, which ATen
    receives as one padding value for both spatial dims."""
    import transformers

    cfg = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    return transformers.SiglipVisionModel(cfg), torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _mobilevit_v2() -> tuple[torch.nn.Module, torch.Tensor]:
    """MobileViT-v2 cuts feature maps into patches with ``F.unfold`` and puts them back with ``F.fold`` (kernel =
    stride), between GroupNorm-ed linear attention blocks; He init and non-trivial BatchNorm statistics keep the
    random activations at unit scale."""
    import transformers

    cfg = transformers.MobileViTV2Config(image_size=64, width_multiplier=0.25, patch_size=2)
    model = transformers.MobileViTV2Model(cfg)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight)
    return randomize_batchnorm(model), torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def _swin() -> tuple[torch.nn.Module, torch.Tensor]:
    """Swin (v1) attends within windows: a partition and a reverse through rank-6 tensors around each attention,
    the second block of a stage on windows shifted by a roll, with a mask between the shifted regions."""
    import transformers

    cfg = transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=2
    )
    return transformers.SwinModel(cfg), torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _swin_window7() -> tuple[torch.nn.Module, torch.Tensor]:
    """Swin at a real image size and window (224, patch 4, window 7: 64 windows of 49 tokens, then 16), narrow and
    shallow so that the simulator takes seconds."""
    import transformers

    cfg = transformers.SwinConfig(
        image_size=224, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=7
    )
    return transformers.SwinModel(cfg), torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))


def _ids(n: int) -> torch.Tensor:
    return torch.randint(3, 250, (1, n), generator=torch.Generator().manual_seed(1))


def _xlnet() -> tuple[torch.nn.Module, torch.Tensor]:
    """XLNet's two-stream relative attention is written with einsum, which lowers to rank-5 permutes of unit dims
    around its batched products (a form QNN HTP fails to finalize unless the permutes become reshapes)."""
    import transformers

    cfg = transformers.XLNetConfig(vocab_size=256, d_model=64, n_layer=2, n_head=4, d_inner=128)
    return transformers.XLNetModel(cfg), _ids(16)


def _funnel() -> tuple[torch.nn.Module, torch.Tensor]:
    """Funnel Transformer pools its sequence between blocks and shifts its relative position scores with einsum
    and slices (the same rank-5 permutes)."""
    import transformers

    cfg = transformers.FunnelConfig(
        vocab_size=256, d_model=64, n_head=4, d_head=16, d_inner=128, block_sizes=[1, 1], num_decoder_layers=1
    )
    return transformers.FunnelModel(cfg), _ids(16)


def _mamba() -> tuple[torch.nn.Module, torch.Tensor]:
    """Mamba's selective scan is, under torch.compile, torch's ``associative_scan``, which Dynamo writes with
    ``torch.vmap`` regions (vmap nesting calls in the graph). The direct translator's trace fails inside them and
    torch.onnx takes the graph; a vmap level that failed trace left pushed made torch.onnx fail too, and the eager
    fallback raise ``batched == nullptr INTERNAL ASSERT FAILED`` (FalconMamba and Jamba alike)."""
    import transformers

    cfg = transformers.MambaConfig(
        vocab_size=256, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=8
    )
    return transformers.MambaModel(cfg), _ids(8)


def _bit() -> tuple[torch.nn.Module, torch.Tensor]:
    """BiT (Big Transfer) standardizes every convolution's weight on each call with ``F.batch_norm(w, None, None,
    training=True)``: training mode without running statistics, which the export refused as a training op (the whole
    model ran in PyTorch); it folds into constant weights."""
    import transformers

    cfg = transformers.BitConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_groups=4)
    return transformers.BitModel(cfg), torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _convbert() -> tuple[torch.nn.Module, torch.Tensor]:
    """ConvBERT's span-based dynamic convolution gathers each token's neighbourhood with ``F.unfold`` over
    ``[batch, hidden, length, 1]`` (a 9-row kernel, padding 4): overlapping windows, which went to torch.onnx, whose
    rank-6 Gather and Reshape QNN refused (4 nodes on the CPU EP)."""
    import transformers

    cfg = transformers.ConvBertConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_kernel_size=9,
    )
    return transformers.ConvBertModel(cfg), _ids(12)


def _hiera() -> tuple[torch.nn.Module, torch.Tensor]:
    """Hiera (SAM 2's image encoder) unrolls its tokens into mask units through rank-6 views whose permute moves all
    six axes apart, splits its rank-6 query/key/value, takes maxima over rank-6 views and normalizes rank-3 scores
    on a rank-5 view: every pinned op type took the graph below half on QNN and it ran in PyTorch."""
    import transformers

    cfg = transformers.HieraConfig(
        embed_dim=16, image_size=[64, 64], num_heads=[1, 2, 4, 8], depths=[1, 1, 1, 1], patch_stride=[4, 4]
    )
    return transformers.HieraModel(cfg), torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def _canine() -> tuple[torch.nn.Module, torch.Tensor]:
    """CANINE reads Unicode code points, hashes each into its embedding tables as ``(id + 1) * prime % buckets``
    (integer remainders of values far past 2048), and downsamples characters with a strided Conv1d."""
    import transformers

    cfg = transformers.CanineConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        downsampling_rate=2,
        num_hash_functions=2,
        num_hash_buckets=64,
        local_transformer_stride=4,
    )
    ids = torch.randint(32, 70000, (1, 16), generator=torch.Generator().manual_seed(1))
    return transformers.CanineModel(cfg), ids


def _sew() -> tuple[torch.nn.Module, torch.Tensor]:
    """SEW (as wav2vec 2.0, HuBERT and UniSpeech) encodes raw audio through a stack of Conv1d + GELU layers with no
    normalization between them after the first, so each GELU's error carries into the next layer: with HTP's own
    Gelu this stack came out 1.1% of the output's scale off (eager PyTorch in float16: 0.15%)."""
    import transformers

    cfg = transformers.SEWConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(64,) * 7,
        conv_kernel=(10, 3, 3, 3, 3, 3, 3),
        conv_stride=(5, 2, 2, 2, 2, 2, 2),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    return transformers.SEWModel(cfg), torch.randn(1, 4000, generator=torch.Generator().manual_seed(1))


FAMILIES = {
    "bit": _bit,
    "canine": _canine,
    "convbert": _convbert,
    "hiera": _hiera,
    "funnel": _funnel,
    "mamba": _mamba,
    "mobilevit_v2": _mobilevit_v2,
    "roberta": _roberta,
    "sew": _sew,
    "siglip_vision": _siglip_vision,
    "swin": _swin,
    "swin_window7": _swin_window7,
    "xlnet": _xlnet,
}
# max |qnn - eager| / max |eager| allowed per family where float16's own error differs from the default's: fp16 error
# grows through depth. MobileViT-v2's 30 convs with random BatchNorm statistics and SiLU (eager PyTorch in float16:
# 8.9e-3; on QNN 6.2e-3 with Sigmoid written out, 3.7e-2 with HTP's Sigmoid); SEW's convolution stack (float16:
# 1.5e-3; on QNN 1.8e-3 with GELU written out, 1.1e-2 with HTP's Gelu).
REL = {"mobilevit_v2": 1.5e-2, "sew": 5e-3}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_runs_wholly_on_qnn_with_eagers_outputs(family: str) -> None:
    """The family's forward is one graph on the NPU with no node on the CPU EP and eager's last hidden state."""
    torch.manual_seed(0)
    model, x = FAMILIES[family]()
    model.eval()
    with torch.no_grad():
        ref = model(x).last_hidden_state
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(lambda t: model(t).last_hidden_state, backend="qnn", options=NPU_RAW)(x)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    assert_close_fp16(out, ref, rel=REL.get(family, 2e-2), cos=0.999)


def test_prophetnet_runs_wholly_on_qnn_with_eagers_outputs() -> None:
    """ProphetNet's n-gram attention multiplies by ``einsum``, which PyTorch lowers through rank-6 views and two
    permutes in a row: QNN refuses rank 6, ONNX Runtime fuses the pair before placement so it cannot be pinned to the
    CPU EP, and the whole graph ran in PyTorch. Composed and folded at rank <= 5, the encoder-decoder forward is one
    graph on the NPU with eager's decoder states."""
    import transformers

    cfg = transformers.ProphetNetConfig(
        vocab_size=256,
        hidden_size=32,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_encoder_layers=1,
        num_decoder_layers=1,
        num_encoder_attention_heads=2,
        num_decoder_attention_heads=2,
        ngram=2,
        num_buckets=8,
        relative_max_distance=16,
    )
    torch.manual_seed(0)
    model = transformers.ProphetNetModel(cfg).eval()
    ids, decoder_ids = _ids(8), _ids(5)
    with torch.no_grad():
        ref = model(input_ids=ids, decoder_input_ids=decoder_ids).last_hidden_state
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    forward = lambda a, b: model(input_ids=a, decoder_input_ids=b).last_hidden_state  # noqa: E731
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(forward, backend="qnn", options=NPU_RAW)(ids, decoder_ids)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    assert_close_fp16(out, ref, rel=2e-2, cos=0.999)


def test_pegasus_x_runs_wholly_on_qnn_with_eagers_outputs() -> None:
    """Pegasus-X's global-local attention views its square local score block, a rank-3 product, at rank 5 and joins
    it with the global block on the last axis: the refused view pinned every Reshape and the whole graph ran in
    PyTorch. Joined as rows first, the encoder-decoder forward is one graph on the NPU with eager's decoder states."""
    import transformers

    cfg = transformers.PegasusXConfig(
        vocab_size=256,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_global_tokens=4,
        block_size=16,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.PegasusXModel(cfg).eval()
    ids, decoder_ids = _ids(12), _ids(5)
    forward = lambda a, b: model(input_ids=a, decoder_input_ids=b).last_hidden_state  # noqa: E731
    with torch.no_grad():
        ref = forward(ids, decoder_ids)
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(forward, backend="qnn", options=NPU_RAW)(ids, decoder_ids)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    assert "concat_before_product_view" in reports[0].passes_applied
    assert_close_fp16(out, ref, rel=2e-2, cos=0.999)


class _PickedKeys(torch.nn.Module):
    """Attention over keys picked by index, DeepSeek-V3.2's sparse-attention way: a bool mask set by ``scatter`` at
    the picked positions (which the direct translator writes as a Where on bool), then a masked softmax."""

    def forward(self, scores: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros(scores.shape, dtype=torch.bool).scatter(-1, picked, True)
        return scores.masked_fill(~keep, -1e4).softmax(-1)


def test_a_bool_scatter_runs_wholly_on_qnn() -> None:
    """A Where on bool is declined by the QNN EP and has no CPU EP kernel: the graph could not be built and ran in
    PyTorch (DeepSeek-V3.2, GLM-MoE-DSA). Written as And/Or/Not it runs on QNN, strict, with eager's values."""
    torch.manual_seed(0)
    scores = torch.randn(2, 6, 8)
    picked = torch.stack([torch.randperm(8)[:3] for _ in range(12)]).reshape(2, 6, 3)
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad():
        out = torch.compile(_PickedKeys(), backend="qnn", options=NPU_RAW)(scores, picked)
        ref = _PickedKeys()(scores, picked)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and not report.cpu_nodes, report.summary()
    assert "bool_where_as_logic" in report.passes_applied
    assert_close_fp16(out, ref)
