"""Prompts of different lengths sharing a few prefill graphs: ``generate()`` with the prompt padded on the left to
a bucket length once eager PyTorch proves the padding neutral, and the padding dropped again."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import torch

from qnnx_backend._buckets import AUTO_MIN, NEUTRAL_RTOL, ladder_bucket
from qnnx_backend._compare import compare_outputs, left_padding
from qnnx_backend.errors import InvalidOptionsError

__all__ = ["BucketedGenerate", "left_pad", "mask_positions", "padding_problem", "prompt_buckets_option"]

logger = logging.getLogger("qnnx_backend.hf")  # the generation helpers log under their public module, as before


def prompt_buckets_option(value: object) -> str | tuple[int, ...] | None:
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        return tuple(sorted(set(value)))
    raise InvalidOptionsError(
        f"prompt_buckets={value!r} is not valid; accepted: 'auto' (powers of two from {AUTO_MIN}), a non-empty list "
        "of positive prompt lengths, or None (compile every prompt length)."
    )


class BucketedGenerate:
    """``model.generate`` with the prompt padded on the left to a bucket length, and the padding dropped again."""

    def __init__(self, model: Any, generate: Any, eager_forward: Any, ladder: str | tuple[int, ...], cache: int):
        self._model, self._generate, self._eager = model, generate, eager_forward
        self._ladder, self._cache = ladder, cache
        self._proven: dict[int, str | None] = {}  # bucket -> None when neutral, else what differed
        self.__wrapped__ = generate

    def __call__(self, inputs: Any = None, *args: Any, **kwargs: Any) -> Any:
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        bucket = self._bucket(ids, kwargs) if not args else None
        if bucket is None or not isinstance(ids, torch.Tensor):
            return self._generate(inputs, *args, **kwargs)
        kwargs.pop("input_ids", None)
        length = ids.shape[1]
        mask = kwargs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(ids)
        padded_ids, padded_mask = left_pad(ids, self._pad_token(), bucket), left_pad(mask, 0, bucket)
        if not self._neutral(bucket, ids, mask, padded_ids, padded_mask):
            return self._generate(inputs, *args, **kwargs)
        kwargs["attention_mask"] = padded_mask
        drop = bucket - length
        # The first QNN call of a graph is checked against eager PyTorch: not at the padding's positions, which no
        # real token reads (the mask keeps them out) and where fp16 cannot follow eager's -inf sums.
        with left_padding(drop, (bucket, self._cache)):
            out = self._generate(padded_ids, **kwargs)
        if isinstance(out, torch.Tensor):
            return out[:, drop:]
        if getattr(out, "sequences", None) is not None:
            out.sequences = out.sequences[:, drop:]
        return out

    def _bucket(self, ids: Any, kwargs: Mapping[str, Any]) -> int | None:
        """The padded prompt length, or None to run the prompt as it is."""
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or "inputs_embeds" in kwargs:
            return None
        config = self._model.generation_config
        new = kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None))
        if not isinstance(new, int) or "max_length" in kwargs or kwargs.get("min_length", config.min_length or 0):
            return None  # lengths that count the prompt's tokens would count the padding too
        # At least one padding token, even for a prompt of a bucket's exact length: generate() drops an attention
        # mask without zeros, which would make a second prefill graph for that bucket.
        length = ids.shape[1]
        bucket = ladder_bucket(length + 1, self._ladder)
        if bucket is None or bucket > self._cache - new:
            return None  # past the last bucket, or the padded prompt and the new tokens would not fit the cache
        return bucket

    def _pad_token(self) -> int:
        for source in (self._model.generation_config, self._model.config):
            token = getattr(source, "pad_token_id", None)
            if isinstance(token, int):
                return token
        return 0  # masked: any id does

    def _neutral(self, bucket: int, ids: Any, mask: Any, padded_ids: Any, padded_mask: Any) -> bool:
        """Whether left padding to ``bucket`` leaves the real tokens' logits unchanged (eager, once per bucket)."""
        if bucket not in self._proven:
            self._proven[bucket] = padding_problem(self._eager, ids, mask, padded_ids, padded_mask)
            if self._proven[bucket] is not None:
                logger.info(
                    "compile_for_generation: padding prompts to %d tokens changes the logits in eager PyTorch (%s); "
                    "prompts of that size keep their own lengths",
                    bucket,
                    self._proven[bucket],
                )
        return self._proven[bucket] is None


def left_pad(t: torch.Tensor, value: int, length: int) -> torch.Tensor:
    pad = torch.full((t.shape[0], length - t.shape[1]), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=1)


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token, as ``generate()`` makes them from the mask."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def padding_problem(forward: Any, ids: Any, mask: Any, padded_ids: Any, padded_mask: Any) -> str | None:
    """None when the logits of the real tokens agree with and without the left padding, else what differs."""
    takes_positions = "position_ids" in inspect.signature(forward).parameters
    extra = lambda m: {"position_ids": mask_positions(m)} if takes_positions else {}  # noqa: E731
    with torch.no_grad():
        true = forward(input_ids=ids, attention_mask=mask, use_cache=False, **extra(mask)).logits
        padded = forward(input_ids=padded_ids, attention_mask=padded_mask, use_cache=False, **extra(padded_mask))
    real = mask.bool()
    return compare_outputs(padded.logits[:, -ids.shape[1] :][real], true[real], NEUTRAL_RTOL)
