"""Models that break their graph after building an attention mask: the mask of float32's minimum crosses from one
graph to the next, the sequence is padded to a window, and Dynamo meets one layer's frame with two lengths.

Before, the graph that returned the mask ran in PyTorch (its output is beyond float16's range), the padding of the
token ids and mask ran on the CPU EP (QNN refuses an integer Pad), HTP misread the mask in the next graph's
comparisons (``mask < 0`` was False for float32's minimum), and a layer graph Dynamo traced with specialized
symbolic sizes ran in PyTorch.
"""

from __future__ import annotations

import warnings

import torch
from integration_helpers import assert_close_fp16

import qnnx_backend
from qnnx_backend.errors import QnnFallbackWarning

OPTIONS = {"soc_model": 60}


def _ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 90, (1, n), generator=torch.Generator().manual_seed(seed))


def test_longformer_runs_wholly_on_qnn_with_eagers_states_padded_or_not() -> None:
    import transformers

    cfg = transformers.LongformerConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        attention_window=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LongformerModel(cfg).eval()
    forward = lambda ids, mask: model(input_ids=ids, attention_mask=mask).last_hidden_state  # noqa: E731
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    compiled = torch.compile(forward, backend="qnn", options=OPTIONS)
    ids = _ids(12)
    padded = torch.ones(1, 12, dtype=torch.long)
    padded[0, 9:] = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", QnnFallbackWarning)
        for mask in (torch.ones(1, 12, dtype=torch.long), padded):  # the second call's mask holds float32's min
            got, ref = compiled(ids, mask), forward(ids, mask)
            assert_close_fp16(got[:, :9], ref[:, :9], rel=2e-2, cos=0.999)
    reports = list(qnnx_backend.compile_reports())
    assert reports and all(r.device == "npu" and not r.cpu_nodes for r in reports), [r.summary() for r in reports]
    assert any(r.host_outputs for r in reports)  # the mask handed to the next graph, computed in PyTorch


def test_longt5_layers_met_with_two_lengths_run_on_qnn() -> None:
    """LongT5's layer frame, met with the encoder's and the decoder's lengths, is traced with symbolic sizes that
    Dynamo then specializes: each graph compiles as its static variant, none runs in PyTorch for a symbolic shape,
    and explain() places every graph where the compile does."""
    import transformers

    cfg = transformers.LongT5Config(
        vocab_size=99,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        local_radius=4,
        global_block_size=4,
        relative_attention_num_buckets=8,
    )
    torch.manual_seed(0)
    model = transformers.LongT5Model(cfg).eval()
    forward = lambda a, b: model(input_ids=a, decoder_input_ids=b).last_hidden_state  # noqa: E731
    ids, decoder_ids = _ids(8), _ids(5, seed=2)
    torch._dynamo.reset()
    qnnx_backend.clear_compile_reports()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = forward(ids, decoder_ids)
        got = torch.compile(forward, backend="qnn", options=OPTIONS)(ids, decoder_ids)
        explained = qnnx_backend.explain(forward, ids, decoder_ids, **OPTIONS)
    assert_close_fp16(got, ref, rel=2e-2, cos=0.999)
    reports = list(qnnx_backend.compile_reports())
    assert not any("symbolic shape" in (r.reason or "") for r in reports), [r.summary() for r in reports]
    assert sum(r.on_qnn for r in reports) >= len(reports) - 1  # the one left returns only the mask
    assert [g.final_device for g in explained.graphs] == [r.device for r in reports]
