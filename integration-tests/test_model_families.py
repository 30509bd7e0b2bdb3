"""Model families beyond the corpus, each in a tiny random configuration: every graph wholly on QNN (no CPU-EP node)
with eager's outputs, the first-call check off so that nothing hides a wrong result."""

from __future__ import annotations

import warnings

import pytest
import torch
from integration_helpers import assert_close_fp16

import qnnx_backend

NPU_RAW = {"device": "npu", "soc_model": 60, "verify": False}


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


FAMILIES = {"roberta": _roberta, "siglip_vision": _siglip_vision}


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
    assert_close_fp16(out, ref, rel=2e-2, cos=0.999)
