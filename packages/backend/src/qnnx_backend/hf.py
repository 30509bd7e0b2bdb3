"""Hugging Face generation on the NPU: one call sets up a causal LM for ``generate()`` with a static KV cache.

``transformers`` stays an optional dependency: this module imports nothing from it at import time.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from qnnx_backend._buckets import AUTO_MIN, NEUTRAL_RTOL, ladder_bucket
from qnnx_backend._compare import compare_outputs
from qnnx_backend._options import BackendOptions
from qnnx_backend.errors import InvalidOptionsError

__all__ = ["compile_for_generation"]

logger = logging.getLogger(__name__)


def compile_for_generation(
    model: Any,
    *,
    max_cache_len: int | None = None,
    options: Mapping[str, Any] | None = None,
    prompt_buckets: str | Sequence[int] | None = "auto",
) -> Any:
    """Compile a Hugging Face causal LM so that ``model.generate(...)`` runs prefill and decode on QNN.

    What it takes care of:

    - ``generate()`` compiles by itself only on cuda/xpu/neuron/tpu devices, and its ``CompileConfig`` defaults to
      ``mode="reduce-overhead"``, which ``torch.compile`` refuses together with ``options``: the model's
      ``forward`` is compiled here instead (``fullgraph=True, dynamic=False``, the Hugging Face recipe), and
      ``generate()``'s own compilation is turned off.
    - The static KV cache (``cache_implementation="static"``) becomes the generation default, so the cache's
      in-place updates are lifted onto the NPU (two graphs: prefill and decode; decode never recompiles).
    - ``max_cache_len``, when given, bounds the cache (``generation_config.max_length`` otherwise decides).
    - Prompts of different lengths share a few prefill graphs (``prompt_buckets``): ``generate()`` pads a prompt on
      the left to the next bucket with the pad token and masks the padding (zeros in the attention mask; positions
      are counted from the first real token; a prompt of a bucket's exact length goes to the next one, since at
      least one token is padding), then drops the padding from the returned sequences. A QNN compile
      per prompt length would stall every new prompt for seconds to minutes on a device. The padding is trusted
      only once proven neutral: for each new bucket the model runs once in eager PyTorch on the prompt as given and
      padded, and the logits of the real tokens must agree; a model that attends to the padding keeps exact lengths
      (one log line). Padding needs ``max_cache_len``, so that the padded prompt and the new tokens fit the cache
      without resizing it; without it prompts keep their lengths.

    Args:
        model: A ``transformers`` causal LM (a ``GenerationMixin`` with ``generation_config``), in eval mode.
        max_cache_len: Size of the static cache in tokens (prompt + new tokens); None keeps transformers' default.
        options: ``torch.compile(..., options=...)`` for the ``qnn`` backend (device, strict, cache, soc_model...).
        prompt_buckets: Prompt lengths the prefill graph is compiled for: ``"auto"`` (powers of two from 16, up to
            what fits in ``max_cache_len``), a list of lengths, or None to compile each prompt length as it comes.

    Returns:
        The same model, ready for ``model.generate(input_ids, max_new_tokens=..., do_sample=False)`` under
        ``torch.no_grad()``.

    Raises:
        InvalidOptionsError: ``model`` is not a generation model, ``max_cache_len`` is not a positive int, or
            ``prompt_buckets`` is not one of the accepted forms.
    """
    config = getattr(model, "generation_config", None)
    if config is None or not callable(getattr(model, "generate", None)):
        raise InvalidOptionsError(
            f"compile_for_generation expects a transformers causal LM (with generate() and generation_config), "
            f"got {type(model).__name__}; load it with AutoModelForCausalLM."
        )
    if max_cache_len is not None and (
        isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1
    ):
        raise InvalidOptionsError(
            f"max_cache_len={max_cache_len!r} is not valid; accepted: a positive int (prompt + new tokens), or None."
        )
    ladder = _prompt_buckets(prompt_buckets)
    if getattr(model, "training", False):
        logger.info("compile_for_generation: the model was in training mode; switching to eval()")
        model.eval()
    config.cache_implementation = "static"
    if max_cache_len is not None:
        if hasattr(config, "max_cache_len"):  # transformers >= 5.12: later calls up to it reuse the same cache
            config.max_cache_len = max_cache_len
        else:
            config.cache_config = {**(getattr(config, "cache_config", None) or {}), "max_cache_len": max_cache_len}
    # generate() must not compile the forward a second time (its CompileConfig is made for CUDA graphs).
    if hasattr(config, "disable_compile"):
        config.disable_compile = True
    # Compiling a model a second time starts again from what it ran before the first (no nested compile, no
    # second layer of padding).
    eager_forward = getattr(model, "_qnnx_eager_forward", None) or model.forward
    if isinstance(model.generate, _BucketedGenerate):
        model.generate = model.generate.__wrapped__
    model.forward = torch.compile(
        eager_forward, backend="qnn", fullgraph=True, dynamic=False, options=dict(options or {})
    )
    model._qnnx_eager_forward = eager_forward  # what the model ran before, for comparisons and to undo
    model._qnnx_weight_sharing = _weight_sharing(BackendOptions.from_mapping(options))
    if ladder is not None and max_cache_len is not None and not getattr(model.config, "is_encoder_decoder", False):
        model.generate = _BucketedGenerate(model, model.generate, eager_forward, ladder, max_cache_len)
    return model


def _weight_sharing(opts: BackendOptions) -> Any:
    """Whether the prefill and decode graphs could share one weight copy in one context here, from qnnx-detection's
    probe (run in child processes once per machine and version: loading a shared context can kill a process).
    Each graph compiles a context with its own weights either way today; the INFO line says which and why."""
    import qnnx_detection

    if opts.device not in ("auto", "npu") or not qnnx_detection.probe(initialize=False).backend("npu").available:
        return None
    report = qnnx_detection.probe_weight_sharing(soc_model=opts.soc_model)
    if report.supported:
        logger.info(
            "compile_for_generation: this NPU can load weight-shared contexts; qnnx still compiles each graph "
            "(prefill buckets, decode) with its own weights"
        )
    else:
        logger.info(
            "compile_for_generation: each graph (prefill buckets, decode) holds its own weights: %s", report.reason
        )
    return report


def _prompt_buckets(value: object) -> str | tuple[int, ...] | None:
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


class _BucketedGenerate:
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
        padded_ids, padded_mask = _left_pad(ids, self._pad_token(), bucket), _left_pad(mask, 0, bucket)
        if not self._neutral(bucket, ids, mask, padded_ids, padded_mask):
            return self._generate(inputs, *args, **kwargs)
        kwargs["attention_mask"] = padded_mask
        out = self._generate(padded_ids, **kwargs)
        drop = bucket - length
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
            self._proven[bucket] = _padding_problem(self._eager, ids, mask, padded_ids, padded_mask)
            if self._proven[bucket] is not None:
                logger.info(
                    "compile_for_generation: padding prompts to %d tokens changes the logits in eager PyTorch (%s); "
                    "prompts of that size keep their own lengths",
                    bucket,
                    self._proven[bucket],
                )
        return self._proven[bucket] is None


def _left_pad(t: torch.Tensor, value: int, length: int) -> torch.Tensor:
    pad = torch.full((t.shape[0], length - t.shape[1]), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=1)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token, as ``generate()`` makes them from the mask."""
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _padding_problem(forward: Any, ids: Any, mask: Any, padded_ids: Any, padded_mask: Any) -> str | None:
    """None when the logits of the real tokens agree with and without the left padding, else what differs."""
    takes_positions = "position_ids" in inspect.signature(forward).parameters
    extra = lambda m: {"position_ids": _positions(m)} if takes_positions else {}  # noqa: E731
    with torch.no_grad():
        true = forward(input_ids=ids, attention_mask=mask, use_cache=False, **extra(mask)).logits
        padded = forward(input_ids=padded_ids, attention_mask=padded_mask, use_cache=False, **extra(padded_mask))
    real = mask.bool()
    return compare_outputs(padded.logits[:, -ids.shape[1] :][real], true[real], NEUTRAL_RTOL)
