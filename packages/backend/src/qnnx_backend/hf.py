"""Hugging Face generation on the NPU: one call sets up a causal LM for ``generate()`` with a static KV cache.

``transformers`` stays an optional dependency: this module imports nothing from it at import time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from qnnx_backend.errors import InvalidOptionsError

__all__ = ["compile_for_generation"]

logger = logging.getLogger(__name__)


def compile_for_generation(
    model: Any,
    *,
    max_cache_len: int | None = None,
    options: Mapping[str, Any] | None = None,
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

    Args:
        model: A ``transformers`` causal LM (a ``GenerationMixin`` with ``generation_config``), in eval mode.
        max_cache_len: Size of the static cache in tokens (prompt + new tokens); None keeps transformers' default.
        options: ``torch.compile(..., options=...)`` for the ``qnn`` backend (device, strict, cache, soc_model...).

    Returns:
        The same model, ready for ``model.generate(input_ids, max_new_tokens=..., do_sample=False)`` under
        ``torch.no_grad()``.

    Raises:
        InvalidOptionsError: ``model`` is not a generation model, or ``max_cache_len`` is not a positive int.
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
    eager_forward = model.forward
    model.forward = torch.compile(
        eager_forward, backend="qnn", fullgraph=True, dynamic=False, options=dict(options or {})
    )
    model._qnnx_eager_forward = eager_forward  # what the model ran before, for comparisons and to undo
    return model
