"""qnnx demo: a small ResNet-style CNN through torch.compile(backend="qnn") on the QNN HTP backend.

Run with `python -m nox -s demo` (or `python tools/demo.py` in an environment with qnnx installed). It compiles
the model with device="npu" and strict=True (so it runs on QNN HTP or fails loudly), checks the result against eager
PyTorch, and prints where the graph ran, the compile time and the steady-state latency.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class TinyResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Block(16), nn.MaxPool2d(2), Block(16))
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def main() -> int:
    import qnnx_backend

    torch.manual_seed(0)
    model = TinyResNet().eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend="qnn", options={"device": "npu", "strict": True})
        start = time.perf_counter()
        got = compiled(x)
        first_call = time.perf_counter() - start
        times = []
        for _ in range(20):
            t = time.perf_counter()
            compiled(x)
            times.append(time.perf_counter() - t)
        eager_times = []
        for _ in range(20):
            t = time.perf_counter()
            model(x)
            eager_times.append(time.perf_counter() - t)

    report = qnnx_backend.compile_reports()[-1]
    err = (got - expected).abs().max().item() / expected.abs().max().item()
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0).item()
    print("qnnx demo: TinyResNet (1x3x32x32) with torch.compile(backend='qnn', device='npu', strict=True)")
    print(f"  ran on          : {report.summary()}")
    print("  compile stages  : " + ", ".join(f"{k} {v:.3f} s" for k, v in report.timings.items()))
    print(f"  first call      : {first_call:.2f} s (Dynamo trace + export + QNN compile + run)")
    print(
        f"  latency         : {statistics.median(times) * 1e3:.2f} ms median of 20 "
        f"(eager PyTorch: {statistics.median(eager_times) * 1e3:.2f} ms)"
    )
    if report.is_simulator:
        print("                    (HTP here is the x86_64 simulator: its latency says nothing about a Snapdragon)")
    print(f"  vs eager        : max|err|/max|ref| = {err:.2e}, cosine = {cosine:.6f} (fp16-level expected)")
    ok = report.on_qnn and err <= 5e-2 and cosine >= 0.999
    print("  result          : " + ("OK" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
