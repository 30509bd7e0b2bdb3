"""Sliding-window attention (Longformer, LED): the windows are ``as_strided`` views of a transposed tensor, a form
that once stopped the process (SIGABRT inside ONNX Runtime while the QNN session was created). Each model runs in a
child process, so a regression fails this test instead of ending the test run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_CHILD = r"""
import json, sys, warnings
import torch, transformers
import qnnx_backend

torch.manual_seed(0)
family = sys.argv[1]
ids = torch.randint(2, 100, (1, 8), generator=torch.Generator().manual_seed(1))
if family == "longformer":
    cfg = transformers.LongformerConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        attention_window=4, max_position_embeddings=64, pad_token_id=1,
    )
    model = transformers.LongformerForMaskedLM(cfg).eval()
    kwargs = {"input_ids": ids}
else:
    cfg = transformers.LEDConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, attention_window=4,
        max_encoder_position_embeddings=64, max_decoder_position_embeddings=64, pad_token_id=1,
    )
    model = transformers.LEDForConditionalGeneration(cfg).eval()
    kwargs = {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
with torch.no_grad():
    ref = model(**kwargs).logits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(model, backend="qnn", options={"soc_model": 60, "verify": False})(**kwargs).logits
reports = list(qnnx_backend.compile_reports())
print(json.dumps({
    "rel": float((out - ref).abs().max() / ref.abs().max()),
    "devices": [r.device for r in reports],
    "qnn_nodes": sum(r.placement.get("QNNExecutionProvider", 0) for r in reports),
}))
"""


@pytest.mark.parametrize("family", ["longformer", "led"])
def test_sliding_window_attention_runs_on_qnn_without_stopping_the_process(family: str) -> None:
    """The process survives, every graph runs on the NPU (the windows' gathers among them) and the logits are
    eager's within fp16 tolerance."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, family], capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, f"exit status {proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices"] and set(result["devices"]) == {"npu"}, result
    assert result["qnn_nodes"] > 300, result
    assert result["rel"] < 2e-2, result
