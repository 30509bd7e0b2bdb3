"""The benchmark models: small enough for the QNN HTP simulator, real enough to exercise each kind of graph.

Every model is built from a fixed seed with no download, so that every child process of one run (and every run)
compiles the same weights on the same inputs. Sizes are chosen so that one simulator call stays well under a second
at batch 16: the simulator is 50-260x slower than ONNX Runtime's CPU EP on this machine.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

SEED = 0


class MLP(nn.Module):
    """Three Linear layers with ReLU: d -> 4d -> 4d -> d."""

    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Four conv/BatchNorm/ReLU stages on a 3x64x64 image, global average pool, a Linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = (3, 16, 32, 64, 128)
        for cin, cout in itertools.pairwise(channels):
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class BasicBlock(nn.Module):
    """The ResNet basic block (two 3x3 convs with BatchNorm, identity or 1x1 projection shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A ResNet-10-style network (one basic block per stage, widths 16-128) on 3x32x32 images.

    torchvision is not available here, so the architecture is written out; it has the same kinds of nodes as
    ResNet-18 (strided convs, projection shortcuts, residual adds, max pool, global pool) at a tenth of the weights.
    """

    def __init__(self, classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        widths = (16, 32, 64, 128)
        blocks = []
        cin = 16
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, stride=1 if i == 0 else 2))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def _randomize_batchnorm(model: nn.Module) -> nn.Module:
    # Non-trivial running statistics: with the defaults (mean 0, var 1) a wrongly frozen BatchNorm would not show
    # in the accuracy column.
    gen = torch.Generator().manual_seed(SEED + 1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.4 - 0.2)
    return model


def _mlp() -> nn.Module:
    return MLP()


def _mlp_large() -> nn.Module:
    return MLP(1024)


def _cnn() -> nn.Module:
    return _randomize_batchnorm(SmallCNN())


def _resnet() -> nn.Module:
    return _randomize_batchnorm(SmallResNet())


def _transformer() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, dropout=0.0, batch_first=True)


def _bert() -> nn.Module:
    # A tiny random BERT from a config (no download). transformers is imported here only: the other models do not
    # pay for it.
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=128,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertModel(config, add_pooling_layer=False)


def _image(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 3, 64, 64, generator=gen),)


def _wide_features(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 1024, generator=gen),)


def _small_image(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 3, 32, 32, generator=gen),)


def _features(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 256, generator=gen),)


def _sequence(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 32, 128, generator=gen),)


def _token_ids(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 1000, (batch, 32), generator=gen, dtype=torch.int64),)


# name -> (builder, inputs(batch, generator), one-line description for the report)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int, torch.Generator], tuple[Any, ...]], str]] = {
    "mlp": (_mlp, _features, "MLP 256-1024-1024-256, ReLU; input [B, 256]"),
    "cnn": (_cnn, _image, "4x (Conv3x3 s2 + BatchNorm + ReLU), 16-128 channels, GAP, Linear; input [B, 3, 64, 64]"),
    "transformer": (
        _transformer,
        _sequence,
        "nn.TransformerEncoderLayer d_model 128, 4 heads, FFN 512; input [B, 32, 128]",
    ),
    "bert": (
        _bert,
        _token_ids,
        "transformers BertModel, random tiny config: 2 layers, hidden 64, 2 heads, FFN 256, vocab 1000; input ids [B, 32]",
    ),
    "mlp_large": (
        _mlp_large,
        _wide_features,
        "MLP 1024-4096-4096-1024, ReLU (100 MB of weights: shows how compile memory scales with weights); input [B, 1024]",
    ),
    "resnet": (_resnet, _small_image, "ResNet-10-style, 1 basic block per stage, widths 16-128; input [B, 3, 32, 32]"),
}


def build(name: str, batch: int) -> tuple[nn.Module, tuple[Any, ...]]:
    """The model in eval mode and its inputs at ``batch``, both from fixed seeds."""
    builder, inputs, _ = MODELS[name]
    torch.manual_seed(SEED)
    model = builder().eval()
    return model, inputs(batch, torch.Generator().manual_seed(SEED + 2))


def call(model: nn.Module, *inputs: Any) -> Any:
    """The model's forward as a function: what ``aot_compile`` saves (the documented recipe for a module: the module
    is an argument, its weights are frozen into the saved file).

    A transformers ``ModelOutput`` comes back as its tuple: torch 2.13 cannot load a saved function that builds one
    (its bytecode refers to the ``collections`` module of the saving process).
    """
    out = model(*inputs)
    return out.to_tuple() if hasattr(out, "to_tuple") else out


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (what a frozen export carries as initializers)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total
