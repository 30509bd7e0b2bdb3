"""The generation helper's prompt buckets: which lengths are accepted, and left padding is trusted only when the
real tokens' results do not change (checked in eager PyTorch)."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend import _hf_prompts as prompts
from qnnx_backend.errors import InvalidOptionsError


@given(st.lists(st.integers(1, 4096), min_size=1, max_size=6))
def test_a_list_of_positive_lengths_is_accepted_sorted_and_unique(lengths: list[int]) -> None:
    """A list of positive prompt lengths is accepted, sorted and without repeats."""
    assert prompts.prompt_buckets_option(lengths) == tuple(sorted(set(lengths)))


@given(
    st.one_of(
        st.just([]),
        st.lists(st.integers(-100, 0), min_size=1, max_size=3),
        st.lists(st.booleans(), min_size=1, max_size=3),
        st.text(min_size=1).filter(lambda s: s != "auto"),
        st.floats(),
    )
)
def test_anything_else_is_refused_with_what_is_accepted(value: object) -> None:
    """Any other prompt_buckets value is refused with an error naming what is accepted."""
    with pytest.raises(InvalidOptionsError, match="accepted: 'auto'"):
        prompts.prompt_buckets_option(value)


def _causal(mixes_padding: bool) -> object:
    """A toy causal LM forward: each position's logits depend on the tokens before it, weighted by the mask;
    ``mixes_padding`` also adds every token regardless of the mask (a model that attends to the padding)."""
    table = torch.linspace(-1, 1, 50 * 8).reshape(50, 8)

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool, position_ids=None):
        x = table[input_ids] * attention_mask[..., None]
        out = x.cumsum(1)
        if position_ids is not None:
            out = out + position_ids[..., None] * 1e-3
        if mixes_padding:
            out = out + table[input_ids].sum(1, keepdim=True)
        return types.SimpleNamespace(logits=out)

    return forward


@given(
    ids=st.lists(st.integers(3, 49), min_size=1, max_size=12),
    pad=st.integers(1, 8),
    pad_token=st.integers(0, 49),
)
def test_left_padding_is_neutral_for_a_masked_causal_model(ids: list[int], pad: int, pad_token: int) -> None:
    """Property: with the padding masked and positions counted from the first real token, the real tokens' logits
    do not change, whatever the pad token."""
    t = torch.tensor([ids])
    mask = torch.ones_like(t)
    length = t.shape[1] + pad
    padded, padded_mask = prompts.left_pad(t, pad_token, length), prompts.left_pad(mask, 0, length)
    assert prompts.padding_problem(_causal(False), t, mask, padded, padded_mask) is None


def test_a_model_that_sees_the_padding_is_detected() -> None:
    """A model that attends to the padding is caught, so its prompts keep their own lengths."""
    t = torch.tensor([[5, 6, 7]])
    mask = torch.ones_like(t)
    padded, padded_mask = prompts.left_pad(t, 9, 8), prompts.left_pad(mask, 0, 8)
    assert prompts.padding_problem(_causal(True), t, mask, padded, padded_mask) is not None


def test_positions_count_from_the_first_real_token() -> None:
    """Positions count from each row's first real token, as generate() makes them from the mask."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert prompts.mask_positions(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
