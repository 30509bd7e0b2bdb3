"""The three models the backend contract is built around: MLP, CNN with BatchNorm, Transformer layer."""

from __future__ import annotations

import torch
import torch.nn as nn


class CNN(nn.Module):
    """Conv-BN-ReLU-pool-Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


def mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4)).eval(), torch.randn(2, 8)


def cnn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = CNN().eval()
    with torch.no_grad():  # non-trivial running stats so BN folding is exercised
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(1, 3, 10, 10)


def encoder_layer() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    return layer.eval(), torch.randn(2, 6, 32)


CONTRACT_MODELS = {"mlp": mlp, "cnn": cnn, "encoder_layer": encoder_layer}
