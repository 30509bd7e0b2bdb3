"""Corpus: tiny random-init HF and torch models, traced by Dynamo, exported, run on the QNN HTP simulator."""

from __future__ import annotations

import logging

import pytest
import torch
from export_qnn_helpers import Capture, compile_and_run, cosine, qnn_session, rel_err

from corpus.models import CORPUS

pytest.importorskip("transformers")

log = logging.getLogger(__name__)

# Slow on this 2-core machine (export + simulator > ~8 s each); CI deselects them with -m "not slow".
SLOW = {"bert_b1", "bert_b2_masked", "gpt2", "mobilenet_v2"}
FUSED_RMSNORM = {"qwen2", "t5_encoder"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(CORPUS)])
def test_corpus_model_on_qnn_htp(name: str) -> None:
    """The model compiles to one graph, runs fully on QNN HTP, and matches eager at fp16 tolerance."""
    model, inputs = CORPUS[name]()
    with torch.no_grad():
        ref = model(*inputs)
    backend = Capture(qnn_session)
    out = compile_and_run(model, inputs, backend)
    assert len(backend.exported) == 1, f"{name}: Dynamo produced {len(backend.exported)} graphs"
    assert ref.abs().max() > 0.1, f"{name}: degenerate reference output (fp16 underflow would hide errors)"
    err, cos = rel_err(out, ref), cosine(out, ref)
    exported = backend.exported[0]
    log.info(
        "%s: rel=%.2e cos=%.6f export=%.2fs passes=%s",
        name,
        err,
        cos,
        sum(exported.timings.values()),
        exported.passes_applied,
    )
    assert err <= 5e-2, f"{name}: max|err|/max|ref| = {err:.3e}"
    if name in FUSED_RMSNORM:  # the overflow-safe RMSNormalization, not the decomposed form squaring x in fp16
        assert "fuse_rmsnorm" in exported.passes_applied, exported.passes_applied
    assert cos >= 0.999, f"{name}: cosine = {cos:.6f}"
