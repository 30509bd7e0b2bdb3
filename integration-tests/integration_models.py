"""Tiny models used by the end-to-end tests (the simulator is slow: keep them small)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (16, 32, 8), act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), act()]
        self.net = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(channels * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def randomize_batchnorm(model: nn.Module) -> nn.Module:
    """Non-trivial BatchNorm statistics, so that freezing them wrongly would show."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduce: int = 4) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.down = nn.Conv2d(channels, channels // reduce, 1)
        self.up = nn.Conv2d(channels // reduce, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.up(nn.functional.silu(self.down(self.pool(x)))))


class EfficientNetStyle(nn.Module):
    """Conv-BatchNorm-SiLU stages downsampled by ``AvgPool2d(3, stride=2, padding=1, ceil_mode=True)`` (with and
    without count_include_pad), a depthwise block with squeeze-excite and a pooled linear head."""

    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()

        def conv_bn_silu(cin: int, cout: int, k: int, groups: int = 1) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups), nn.BatchNorm2d(cout), nn.SiLU()]

        self.features = nn.Sequential(
            *conv_bn_silu(3, channels, 3),
            nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True),
            *conv_bn_silu(channels, channels, 3, groups=channels),
            _SqueezeExcite(channels),
            nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
            *conv_bn_silu(channels, 2 * channels, 1),
        )
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def transformer_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)


class _Field(nn.Module):
    """A Hugging Face model whose compiled function returns one tensor of its output (``key``)."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x), self.key)


# kind -> (config class, model class, config fields, output field, input shape; int inputs are token ids)
_TINY_HF = {
    "resnet": (
        "ResNetConfig",
        "ResNetModel",
        {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1], "layer_type": "basic"},
        "pooler_output",
        (1, 3, 32, 32),
    ),
    "mobilenet_v2": (
        "MobileNetV2Config",
        "MobileNetV2Model",
        {"depth_multiplier": 0.35},
        "pooler_output",
        (1, 3, 32, 32),
    ),
    "convnext": (
        "ConvNextConfig",
        "ConvNextModel",
        {"num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1]},
        "pooler_output",
        (1, 3, 32, 32),
    ),
    "vit": (
        "ViTConfig",
        "ViTModel",
        {
            "image_size": 32,
            "patch_size": 8,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "attn_implementation": "eager",
        },
        "last_hidden_state",
        (1, 3, 32, 32),
    ),
    "bert": (
        "BertConfig",
        "BertModel",
        {
            "vocab_size": 128,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
        },
        "last_hidden_state",
        (1, 16),
    ),
}


def tiny_hf(kind: str) -> tuple[nn.Module, Callable[[int], torch.Tensor]]:
    """A tiny random-init Hugging Face model (no download) of ``kind``, and a maker of its inputs by seed (token ids
    for text models, normal images otherwise)."""
    import transformers

    config_cls, model_cls, fields, key, shape = _TINY_HF[kind]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**fields))
    if kind == "mobilenet_v2":  # HF's init shrinks activations ~50x per layer: He init keeps them at unit scale
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
    text = "vocab_size" in fields

    def make(seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        if text:
            return torch.randint(1, fields["vocab_size"], shape, generator=generator)
        return torch.randn(shape, generator=generator)

    return _Field(model, key).eval(), make


# The tiny decoder configuration the generation tests build (families add their own fields): hidden 32, 2 layers.
TINY_DECODER: dict[str, int] = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tiny_llama4_text(vocab_size: int = 256, **extra: object) -> nn.Module:
    """A tiny random-init Llama 4 text decoder (hidden 64, 2 layers, eager attention), in eval mode; ``extra`` goes
    to its config (``moe_layers=[]`` for dense MLP layers only)."""
    import transformers

    config = transformers.Llama4TextConfig(
        hidden_size=64,
        intermediate_size=128,
        intermediate_size_mlp=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=vocab_size,
        max_position_embeddings=128,
        attn_implementation="eager",
        **extra,
    )
    return transformers.Llama4ForCausalLM(config).eval()
