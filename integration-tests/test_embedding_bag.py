"""``nn.EmbeddingBag`` models (PyTorch's text classification tutorial, a recommender's pooled sparse features) run
wholly on QNN: the direct translator computes the bags with static shapes from the runtime offsets, so new offsets
need no recompile. Before, torch.onnx's Loop over the bags kept the graph in PyTorch."""

from __future__ import annotations

import pytest
import torch
from integration_helpers import assert_close_fp16, cosine

import qnnx_backend

NPU_STRICT = {"device": "npu", "strict": True, "soc_model": 60}


class TextClassifier(torch.nn.Module):
    """The tutorial's model: the mean of each text's token embeddings, then a Linear."""

    def __init__(self, vocab: int, dim: int, classes: int, mode: str) -> None:
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(vocab, dim, mode=mode)
        self.fc = torch.nn.Linear(dim, classes)

    def forward(self, text: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(text, offsets))


class PooledFeatures(torch.nn.Module):
    """A recommender's tower: two sparse features pooled per sample (fixed-size 2-D bags, weighted sums), joined
    with dense features."""

    def __init__(self) -> None:
        super().__init__()
        self.genres = torch.nn.EmbeddingBag(30, 8, mode="sum")
        self.tags = torch.nn.EmbeddingBag(40, 8, mode="max", padding_idx=0)
        self.top = torch.nn.Sequential(torch.nn.Linear(8 + 8 + 4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, genres: torch.Tensor, weights: torch.Tensor, tags: torch.Tensor, dense: torch.Tensor):
        flat = genres.reshape(-1)
        offsets = torch.arange(0, flat.numel(), genres.shape[1])
        pooled = self.genres(flat, offsets, per_sample_weights=weights.reshape(-1))
        return self.top(torch.cat([pooled, self.tags(tags), dense], dim=1))


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_text_classifier_runs_wholly_on_qnn_for_any_offsets(mode: str) -> None:
    """Every node on QNN under strict, eager's logits, and one graph for texts split differently (an empty text
    included): the offsets are read at run time."""
    model = TextClassifier(200, 32, 4, mode).eval()
    text = torch.randint(0, 200, (24,), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="qnn", options=NPU_STRICT)
    with torch.no_grad():
        for offsets in ([0, 5, 5, 17], [0, 1, 2, 3], [0, 20, 22, 23]):
            o = torch.tensor(offsets)
            got, expected = compiled(text, o), model(text, o)
            assert_close_fp16(got, expected)
            assert cosine(got, expected) >= 0.999
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and set(report.placement) == {"QNNExecutionProvider"}, report.summary()


def test_pooled_sparse_features_run_wholly_on_qnn() -> None:
    """Fixed-size weighted-sum bags and max bags with a padding index beside dense features: on QNN under strict
    with eager's scores."""
    torch.manual_seed(0)
    model = PooledFeatures().eval()
    g = torch.Generator().manual_seed(2)
    genres, weights = torch.randint(0, 30, (6, 3), generator=g), torch.rand(6, 3, generator=g)
    tags = torch.randint(0, 40, (6, 5), generator=g)
    tags[2] = 0  # a sample whose tags are all padding: its bag is empty
    dense = torch.randn(6, 4, generator=g)
    with torch.no_grad():
        got = torch.compile(model, backend="qnn", options=NPU_STRICT)(genres, weights, tags, dense)
        expected = model(genres, weights, tags, dense)
    assert_close_fp16(got, expected)
    (report,) = qnnx_backend.compile_reports()
    assert report.device == "npu" and set(report.placement) == {"QNNExecutionProvider"}, report.summary()
