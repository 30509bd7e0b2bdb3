"""Tiny random-init corpus models (no downloads) and their inputs.

Weights are re-initialized with a fixed seed and modest scales so that fp16 (what QNN HTP runs
with soc_model=60) neither underflows nor saturates: the outputs must not be degenerate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

VOCAB = 128


def _seed() -> None:
    torch.manual_seed(0)


def _hf_ids(batch: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, VOCAB, (batch, seq), generator=g)


class _LastHidden(nn.Module):
    """Wraps an HF model so the compiled function returns a tensor (the last hidden state)."""

    def __init__(self, model: nn.Module, key: str = "last_hidden_state") -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return getattr(self.model(*args, **kwargs), self.key)


def bert(batch: int) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import BertConfig, BertModel

    _seed()
    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return _LastHidden(BertModel(cfg, add_pooling_layer=False)).eval(), (_hf_ids(batch, 16),)


def bert_masked(batch: int) -> tuple[nn.Module, tuple[Any, ...]]:
    """BERT with an explicit attention mask (int64, last 4 tokens of row 0 padded)."""
    model, (ids,) = bert(batch)
    mask = torch.ones_like(ids)
    mask[0, -4:] = 0
    return model, (ids, mask)


def distilbert() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import DistilBertConfig, DistilBertModel

    _seed()
    cfg = DistilBertConfig(
        vocab_size=VOCAB,
        dim=64,
        n_layers=2,
        n_heads=4,
        hidden_dim=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return _LastHidden(DistilBertModel(cfg)).eval(), (_hf_ids(2, 16),)


def gpt2() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import GPT2Config, GPT2Model

    _seed()
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        attn_implementation="eager",
        use_cache=False,
    )
    return _LastHidden(GPT2Model(cfg)).eval(), (_hf_ids(1, 16),)


def qwen2() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import Qwen2Config, Qwen2Model

    _seed()
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="eager",
        use_cache=False,
    )
    return _LastHidden(Qwen2Model(cfg)).eval(), (_hf_ids(1, 16),)


def t5_encoder() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import T5Config, T5EncoderModel

    _seed()
    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        use_cache=False,
        attn_implementation="eager",
    )
    return _LastHidden(T5EncoderModel(cfg)).eval(), (_hf_ids(1, 16),)


def vit() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import ViTConfig, ViTModel

    _seed()
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        attn_implementation="eager",
    )
    return _LastHidden(ViTModel(cfg, add_pooling_layer=False)).eval(), (torch.randn(2, 3, 32, 32),)


def swin() -> tuple[nn.Module, tuple[Any, ...]]:
    """Swin's window partition and reverse go through rank-6 views (HTP takes rank <= 5)."""
    from transformers import SwinConfig, SwinModel

    _seed()
    cfg = SwinConfig(
        image_size=32,
        patch_size=4,
        num_channels=3,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        attn_implementation="eager",
    )
    return _LastHidden(SwinModel(cfg, add_pooling_layer=False)).eval(), (torch.randn(1, 3, 32, 32),)


def convnext() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import ConvNextConfig, ConvNextModel

    _seed()
    cfg = ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32)
    return _LastHidden(ConvNextModel(cfg), key="pooler_output").eval(), (torch.randn(1, 3, 32, 32),)


def mobilenet_v2() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import MobileNetV2Config, MobileNetV2Model

    _seed()
    cfg = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.35)
    model = MobileNetV2Model(cfg)
    # HF's init (std 0.02) shrinks activations ~50x per layer: the pooled output is ~1e-25, which is
    # 0 in fp16 and would make the comparison trivial. He init keeps activations at unit scale.
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
    return _LastHidden(model, key="pooler_output").eval(), (torch.randn(1, 3, 32, 32),)


def resnet() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import ResNetConfig, ResNetModel

    _seed()
    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    return _LastHidden(ResNetModel(cfg), key="pooler_output").eval(), (torch.randn(1, 3, 32, 32),)


class RecurrentHead(nn.Module):
    """Embedding-free recurrent classifier head: LSTM or GRU over a sequence, then Linear."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        rnn = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = rnn(input_size=16, hidden_size=32, num_layers=1, batch_first=True)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out)


def lstm() -> tuple[nn.Module, tuple[Any, ...]]:
    _seed()
    return RecurrentHead("lstm").eval(), (torch.randn(2, 8, 16),)


def gru() -> tuple[nn.Module, tuple[Any, ...]]:
    _seed()
    return RecurrentHead("gru").eval(), (torch.randn(2, 8, 16),)


def transformer_encoder_layer() -> tuple[nn.Module, tuple[Any, ...]]:
    _seed()
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    return layer.eval(), (torch.randn(2, 16, 64),)


CORPUS: dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]] = {
    "bert_b1": lambda: bert(1),
    "bert_b2": lambda: bert(2),
    "bert_b2_masked": lambda: bert_masked(2),
    "distilbert": distilbert,
    "gpt2": gpt2,
    "qwen2": qwen2,
    "t5_encoder": t5_encoder,
    "vit": vit,
    "swin": swin,
    "convnext": convnext,
    "mobilenet_v2": mobilenet_v2,
    "resnet": resnet,
    "lstm": lstm,
    "gru": gru,
    "transformer_encoder_layer": transformer_encoder_layer,
}
