"""Hugging Face generation on the NPU: one call sets up a causal LM for ``generate()`` with a static KV cache.

``transformers`` stays an optional dependency: this module imports nothing from it at import time. The public module
of the generation helpers: :func:`compile_for_generation` is here; the memory view (``_hf_memory``), the prompt
buckets (``_hf_prompts``) and saving and loading (``_hf_saved``) live beside it.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from qnnx_backend._export import first_line
from qnnx_backend._hf_memory import GenerationMemoryReport, generation_memory, weight_sharing
from qnnx_backend._hf_prompts import BucketedGenerate, prompt_buckets_option
from qnnx_backend._hf_rope import RotaryTables
from qnnx_backend._hf_saved import GENERATION_FORMAT as GENERATION_FORMAT
from qnnx_backend._hf_saved import GenerationSaveReport, LoadedGenerator, load_for_generation, save_for_generation
from qnnx_backend._hf_saved import attention_mask_4d as attention_mask_4d
from qnnx_backend._hf_saved import prompt_bucket as prompt_bucket
from qnnx_backend._options import BackendOptions
from qnnx_backend._report import CompileReport, collecting
from qnnx_backend.errors import InvalidOptionsError, QnnFallbackWarning

__all__ = [
    "GenerationMemoryReport",
    "GenerationSaveReport",
    "LoadedGenerator",
    "compile_for_generation",
    "generation_memory",
    "load_for_generation",
    "save_for_generation",
]

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
    - With ``options={"quantize": ...}``, ``with qnnx_backend.calibrate(model): model.generate(...)`` over a few
      prompts calibrates every prefill bucket and the decode step on generation's own tensors; later ``generate()``
      runs them quantized (``"llm-a16w4"`` is the decoder recipe; see the README's *Quantized generation*).

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
    ladder = prompt_buckets_option(prompt_buckets)
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
    if isinstance(model.generate, BucketedGenerate):
        model.generate = model.generate.__wrapped__
    compiled = torch.compile(eager_forward, backend="qnn", fullgraph=True, dynamic=False, options=dict(options or {}))
    graphs: list[CompileReport] = []  # the model's graphs, as they compile (generation_memory reads them)

    windows = _SlidingWindows(model)
    rotary = RotaryTables(model)
    untraceable = _Untraceable(BackendOptions.from_mapping(options).strict)

    @functools.wraps(eager_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        shapes = untraceable.shapes(args, kwargs)
        if shapes in untraceable.failed:
            return eager_forward(*args, **kwargs)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        windows.unslide(cache)
        rotary.cover(cache, kwargs.get("cache_position"), max_cache_len)
        try:
            with collecting(graphs):
                return compiled(*args, **kwargs)
        except Exception as exc:
            untraceable.check(exc, shapes)
        return eager_forward(*args, **kwargs)

    model.forward = forward
    model._qnnx_graphs = graphs
    model._qnnx_eager_forward = eager_forward  # what the model ran before, for comparisons and to undo
    model._qnnx_weight_sharing = weight_sharing(BackendOptions.from_mapping(options))
    if ladder is not None and max_cache_len is not None and not getattr(model.config, "is_encoder_decoder", False):
        model.generate = BucketedGenerate(model, model.generate, eager_forward, ladder, max_cache_len)
    return model


class _Untraceable:
    """The calls whose forward Dynamo could not trace, by the shapes of their tensor arguments: such calls run in
    PyTorch.

    Model code Dynamo cannot capture as one graph (``fullgraph=True``), such as positions made by ``torch.arange``
    from the cache's length read as a number (``PendingUnbackedSymbolNotFound`` in a decode step), fails while
    tracing, before any graph runs, so nothing was computed or written: eager PyTorch computes the call, and every
    later call of the same shapes, with one ``QnnFallbackWarning``; calls of other shapes (a prefill) still compile.
    Under ``strict`` the error is raised. A failure of the backend itself, or of the model's code on its inputs, is
    raised as it is."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.failed: dict[tuple[Any, ...], str] = {}

    @staticmethod
    def shapes(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        tensors = [*enumerate(args), *sorted(kwargs.items())]
        return tuple((k, tuple(v.shape)) for k, v in tensors if isinstance(v, torch.Tensor))

    def check(self, exc: Exception, shapes: tuple[Any, ...]) -> None:
        """Record ``exc`` as Dynamo's failure to trace calls of ``shapes``, or raise it."""
        from torch._dynamo import exc as dynamo_exc

        traced = isinstance(exc, (dynamo_exc.Unsupported, dynamo_exc.InternalTorchDynamoError, dynamo_exc.UserError))
        if self.strict or not traced:
            raise exc
        why = f"{type(exc).__name__}: {first_line(exc)}"
        if not self.failed:
            warnings.warn(
                f"qnn backend: compile_for_generation: Dynamo cannot trace this model's forward as one graph ({why}); "
                "such calls (and later calls of the same shapes) run in PyTorch. Fix: a model that reads positions "
                "or lengths as tensors, without converting them to Python numbers; strict=True raises instead.",
                QnnFallbackWarning,
                stacklevel=4,
            )
        self.failed[shapes] = why


class _SlidingWindows:
    """Sliding-window layers of a static cache that can never slide, made full static layers.

    transformers' static sliding-window layer counts its tokens in a Python int, and the compiled forward
    (``dynamic=False``) guards on it: every decode step compiles a new graph (Gemma-2/3, Mistral-style configs), and
    past Dynamo's recompile limit the steps run in PyTorch. When a layer's window is longer than the cache
    (``max_cache_len``), the window never drops a token, so a full static layer of the same length holds the same
    keys and values and gives the same attention (the sliding mask keeps every cached position): it is swapped in
    before the layer holds anything, and one decode graph serves every step. A window that can slide keeps its
    layer (and its recompiles), said once in a warning."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._windows: list[int | None] | None = None
        self._warned = False

    def _per_layer(self) -> list[int | None]:
        if self._windows is None:
            try:
                from transformers.cache_utils import get_layer_types_and_kwargs

                config = self._model.config.get_text_config(decoder=True)
                _, kwargs = get_layer_types_and_kwargs(config)
                self._windows = [k.get("sliding_window") for k in kwargs]
            except Exception:  # another transformers: nothing to swap
                self._windows = []
        return self._windows

    def unslide(self, cache: Any) -> None:
        """Swap the never-sliding layers of ``cache`` before they hold anything (called on every forward: a model
        without sliding windows returns at once)."""
        windows = self._per_layer()
        if not any(isinstance(w, int) for w in windows):
            return
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list):
            return
        try:
            from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
        except ImportError:
            return
        swapped = []
        for i, layer in enumerate(layers):
            if type(layer) is not StaticSlidingWindowLayer or layer.is_initialized or i >= len(windows):
                continue
            window = windows[i]
            if isinstance(window, int) and window > layer.max_cache_len:
                layers[i] = StaticLayer(max_cache_len=layer.max_cache_len)
                swapped.append((window, layer.max_cache_len))
            elif not self._warned:
                self._warned = True
                logger.warning(
                    "compile_for_generation: layer %d's sliding window (%s tokens) fits in the cache (%d tokens), so "
                    "transformers' cache guards its token count and each decode step compiles a new graph; a "
                    "max_cache_len below the window keeps one decode graph",
                    i,
                    window,
                    layer.max_cache_len,
                )
        if swapped:
            logger.info(
                "compile_for_generation: %d sliding-window cache layer(s) (window %d tokens) are longer than the "
                "cache (%d tokens) and can never slide: they hold full static layers, one decode graph for every step",
                len(swapped),
                min(w for w, _ in swapped),
                swapped[0][1],
            )
