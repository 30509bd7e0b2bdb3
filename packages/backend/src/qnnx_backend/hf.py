"""Hugging Face generation on the NPU: one call sets up a causal LM for ``generate()`` with a static KV cache.

``transformers`` stays an optional dependency: this module imports nothing from it at import time.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from qnnx_backend._buckets import AUTO_MIN, NEUTRAL_RTOL, ladder_bucket
from qnnx_backend._compare import compare_outputs
from qnnx_backend._options import BackendOptions
from qnnx_backend._report import CompileReport, collecting, size_text
from qnnx_backend.errors import InvalidOptionsError, SavedGraphError, SavedInputError

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
    compiled = torch.compile(eager_forward, backend="qnn", fullgraph=True, dynamic=False, options=dict(options or {}))
    graphs: list[CompileReport] = []  # the model's graphs, as they compile (generation_memory reads them)

    windows = _SlidingWindows(model)

    @functools.wraps(eager_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        windows.unslide(kwargs.get("past_key_values", kwargs.get("cache")))
        with collecting(graphs):
            return compiled(*args, **kwargs)

    model.forward = forward
    model._qnnx_graphs = graphs
    model._qnnx_eager_forward = eager_forward  # what the model ran before, for comparisons and to undo
    model._qnnx_weight_sharing = _weight_sharing(BackendOptions.from_mapping(options))
    if ladder is not None and max_cache_len is not None and not getattr(model.config, "is_encoder_decoder", False):
        model.generate = _BucketedGenerate(model, model.generate, eager_forward, ladder, max_cache_len)
    return model


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
        layers = getattr(cache, "layers", None)
        if not isinstance(layers, list):
            return
        try:
            from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
        except ImportError:
            return
        windows = self._per_layer()
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


def _weight_sharing(opts: BackendOptions) -> Any:
    """Whether the prefill and decode graphs could share one weight copy in one context here, from qnnx-detection's
    probe (run in child processes once per machine and version: loading a shared context can kill a process).
    Each graph compiles a context with its own weights either way today (a weight-shared group would need every
    graph exported up front, and its load cannot be tried here); the INFO line and :func:`generation_memory` say
    which and why."""
    import qnnx_detection

    if opts.device not in ("auto", "npu") or not qnnx_detection.probe(initialize=False).backend("npu").available:
        return None
    # The SoC the graphs compile for (as the build resolves it): one probe, and one cached verdict, per SoC, whether
    # the caller named it or not.
    soc = opts.soc_model if opts.soc_model is not None else qnnx_detection.resolve_soc_model(None)
    report = qnnx_detection.probe_weight_sharing(soc_model=soc)
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


@attrs.frozen(kw_only=True)
class GenerationMemoryReport:
    """What a model compiled by :func:`compile_for_generation` holds on the device: its weights, its contexts on
    disk, and how many copies of the weights those contexts hold (one per graph: each prefill bucket and the
    decode step compile a context with their own weights)."""

    graphs: tuple[CompileReport, ...]
    """The report of each graph compiled so far (prefill buckets and decode, in the order they compiled)."""
    weight_bytes: int | None
    """One copy of the model's weights as the device holds them (float32 counted as float16 on the NPU, quantized
    weights at their width); None before a graph compiled on QNN."""
    context_bytes: int | None
    """The compiled contexts' bytes on disk, summed over the graphs; None when some graph on QNN wrote none
    (``cache=False`` on an unsplit graph)."""
    weight_copies: int
    """How many copies of the weights the model's contexts hold: the graphs on QNN that hold weights."""
    weight_sharing: str
    """Whether one weight-shared context could serve the graphs on this target, from qnnx-detection's probe."""

    def summary(self) -> str:
        """One line, e.g. ``3 graphs on QNN: 12.0 MiB of weights, 3 weight copies, contexts 36.1 MiB on disk;
        weight sharing: not supported on this target (...)``."""
        on_qnn = sum(1 for g in self.graphs if g.on_qnn)
        weights = "weights unknown" if self.weight_bytes is None else f"{size_text(self.weight_bytes)} of weights"
        disk = "" if self.context_bytes is None else f", contexts {size_text(self.context_bytes)} on disk"
        copies = f"{self.weight_copies} weight cop{'y' if self.weight_copies == 1 else 'ies'}"
        return f"{on_qnn} of {len(self.graphs)} graphs on QNN: {weights}, {copies}{disk}; weight sharing: " + (
            self.weight_sharing
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the report."""
        return {
            "graphs": [g.to_dict() for g in self.graphs],
            "weight_bytes": self.weight_bytes,
            "context_bytes": self.context_bytes,
            "weight_copies": self.weight_copies,
            "weight_sharing": self.weight_sharing,
        }


def generation_memory(model: Any) -> GenerationMemoryReport:
    """The memory view of a model compiled by :func:`compile_for_generation`, over the graphs compiled so far.

    Raises:
        InvalidOptionsError: ``model`` was not compiled by :func:`compile_for_generation`.
    """
    graphs = getattr(model, "_qnnx_graphs", None)
    if graphs is None:
        raise InvalidOptionsError(
            f"generation_memory expects a model returned by compile_for_generation, got {type(model).__name__} "
            "that was not compiled by it; call qnnx_backend.hf.compile_for_generation(model, ...) first."
        )
    reports = tuple(graphs)
    holding = [g for g in reports if g.on_qnn and g.weight_copies]
    sizes = [g.weight_bytes for g in holding if g.weight_bytes is not None]
    disk = [g.context_bytes for g in holding]
    return GenerationMemoryReport(
        graphs=reports,
        weight_bytes=max(sizes) if sizes else None,
        context_bytes=None if not disk or any(d is None for d in disk) else sum(d for d in disk if d is not None),
        weight_copies=sum(g.weight_copies for g in holding),
        weight_sharing=_sharing_verdict(getattr(model, "_qnnx_weight_sharing", None)),
    )


def _sharing_verdict(report: Any) -> str:
    if report is None:
        return "not probed (the graphs do not compile for the NPU)"
    if report.supported:
        return "supported on this target; each graph still compiles a context with its own weights"
    return f"not supported on this target ({report.reason})"


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


# -- save a decoder for generation, load it without the model ---------------------------------------------------

GENERATION_FORMAT = 1
_FIX_SAVE = "save the model again with qnnx_backend.hf.save_for_generation"
_STATE = ("keys", "values", "cumulative_length")  # each static cache layer's tensors, in the graphs' argument order


@attrs.frozen(eq=False)
class GenerationSaveReport:
    """What :func:`save_for_generation` wrote.

    Attributes:
        path: the file.
        file_bytes: its size.
        prompt_buckets: the prompt lengths of its prefill graphs (a shorter prompt is padded on the left).
        max_cache_len: the static cache's size in tokens (padded prompt + new tokens - 1).
        reports: the compile report of each graph: the prefill graphs by length, then the decode step.
    """

    path: Path
    file_bytes: int
    prompt_buckets: tuple[int, ...]
    max_cache_len: int
    reports: tuple[Any, ...]


class _Step:
    """One forward of the model over Hugging Face's static cache, whose tensors are the step's arguments (so that
    the cache's in-place writes land in tensors the caller owns) and with a 4-D additive attention mask (the mask
    the loader builds: the same for every model, and no mask code of the model's in the graph)."""

    def __init__(self, model: Any, cache: Any) -> None:
        self._forward = getattr(model, "_qnnx_eager_forward", None) or model.forward
        self._cache = cache
        parameters = inspect.signature(self._forward).parameters
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}

    def __call__(self, input_ids: Any, attention_mask: Any, position_ids: Any, *state: Any) -> Any:
        for k, layer in enumerate(self._cache.layers):
            layer.keys, layer.values, layer.cumulative_length = state[3 * k : 3 * k + 3]
        out = self._forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_kwarg: self._cache},
            **self._keep,
        )
        return out.logits[:, -1]


def attention_mask_4d(valid: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask ``[1, 1, len(rows), cache]`` of queries at cache positions ``rows``: a query sees the valid
    keys at or before its position, and always itself (a padding row then never sees only masked keys, which
    would make NaNs that its cached keys and values carry into later steps)."""
    keys = torch.arange(valid.shape[-1])
    allowed = valid[:, None, :] & (keys[None, None, :] <= rows[None, :, None])
    allowed |= keys[None, None, :] == rows[None, :, None]
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def prompt_bucket(length: int, max_new_tokens: int, buckets: Sequence[int], max_cache_len: int) -> int:
    """The prefill length a prompt of ``length`` tokens runs at (the smallest saved bucket that holds it), checked
    against the cache: the padded prompt and ``max_new_tokens - 1`` fed-back tokens must fit ``max_cache_len``.

    Raises:
        SavedInputError: the prompt is empty or longer than every bucket, or the tokens would not fit the cache.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise SavedInputError(f"max_new_tokens={max_new_tokens!r} is not valid; accepted: a positive int")
    if length < 1:
        raise SavedInputError("the prompt is empty; accepted: 1 or more tokens")
    fitting = [b for b in buckets if b >= length]
    if not fitting:
        raise SavedInputError(
            f"the prompt has {length} tokens; this file serves prompts of up to {max(buckets)} tokens (prefill "
            f"graphs of {', '.join(map(str, sorted(buckets)))} tokens): shorten the prompt, or {_FIX_SAVE} and "
            f"prompt_buckets that include {length}"
        )
    bucket = min(fitting)
    if bucket + max_new_tokens - 1 > max_cache_len:
        raise SavedInputError(
            f"max_new_tokens={max_new_tokens} does not fit the cache: the prompt of {length} tokens runs padded to "
            f"{bucket}, and {bucket} + {max_new_tokens} - 1 positions exceed max_cache_len={max_cache_len}; ask for "
            f"at most {max_cache_len - bucket + 1} new tokens, or {_FIX_SAVE} and a larger max_cache_len"
        )
    return bucket


def _saved_buckets(value: object, max_cache_len: int) -> tuple[int, ...]:
    if value == "auto":
        ladder = [b for b in (AUTO_MIN << k for k in range(32)) if b <= max_cache_len]
        if not ladder:
            raise InvalidOptionsError(
                f"prompt_buckets='auto' makes buckets from {AUTO_MIN} tokens, more than max_cache_len={max_cache_len}; "
                "pass a list of prompt lengths up to max_cache_len, or a larger max_cache_len"
            )
        return tuple(ladder)
    buckets = _prompt_buckets(value) if value is not None else None
    if not isinstance(buckets, tuple) or buckets[-1] > max_cache_len:
        raise InvalidOptionsError(
            f"prompt_buckets={value!r} is not valid for saving; accepted: 'auto' (powers of two from {AUTO_MIN} up to "
            f"max_cache_len={max_cache_len}) or a non-empty list of prompt lengths from 1 to {max_cache_len}"
        )
    return buckets


def _layout(model: Any, max_cache_len: int) -> tuple[Any, dict[str, Any]]:
    """Hugging Face's static cache for ``model`` (allocated) and its layout as the file records it."""
    from transformers.cache_utils import StaticCache, StaticLayer

    text = model.config.get_text_config(decoder=True)
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    kinds = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not StaticLayer})
    if kinds:
        raise InvalidOptionsError(
            f"the model's static cache has {', '.join(kinds)} layers (sliding-window or hybrid attention); "
            "save_for_generation saves full-attention decoders only: use compile_for_generation for this model"
        )
    heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    dtype = next(model.parameters()).dtype
    dummy = torch.zeros((1, heads, 1, head_dim), dtype=dtype)
    for layer in cache.layers:
        if isinstance(layer, StaticLayer):  # every layer is, checked above
            layer.lazy_initialization(dummy, dummy)
    generation = model.generation_config
    eos = getattr(generation, "eos_token_id", None)
    eos = getattr(text, "eos_token_id", None) if eos is None else eos
    pad = getattr(generation, "pad_token_id", None)
    pad = getattr(text, "pad_token_id", None) if pad is None else pad
    layout = {
        "vocab_size": int(text.vocab_size),
        "eos_token_ids": [] if eos is None else [int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])],
        "pad_token_id": int(pad) if isinstance(pad, int) else 0,
        "cache": {
            "layers": len(cache.layers),
            "kv_heads": heads,
            "head_dim": head_dim,
            "dtype": str(dtype).removeprefix("torch."),
            "max_cache_len": max_cache_len,
            "batch_size": 1,
        },
    }
    return cache, layout


def _state(cache: Mapping[str, Any]) -> list[torch.Tensor]:
    """Fresh cache tensors of a layout: per layer its keys, values and count of written positions."""
    shape = (cache["batch_size"], cache["kv_heads"], cache["max_cache_len"], cache["head_dim"])
    dtype = getattr(torch, cache["dtype"])
    state: list[torch.Tensor] = []
    for _ in range(cache["layers"]):
        state += [torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype), torch.zeros((), dtype=torch.long)]
    return state


def save_for_generation(
    model: Any,
    path: str | os.PathLike[str],
    *,
    max_cache_len: int,
    prompt_buckets: str | Sequence[int] = "auto",
    options: Mapping[str, Any] | None = None,
) -> GenerationSaveReport:
    """Compile a Hugging Face decoder's prefill (one graph per prompt bucket) and decode step over a static cache of
    ``max_cache_len`` tokens, and write them to one file that :func:`load_for_generation` runs greedily in any
    process, without the model, Dynamo, ONNX export or ``transformers``' model code.

    Args:
        model: a ``transformers`` causal LM with full attention (no sliding-window layers), in eval mode.
        path: the file to write (replaced atomically if it exists).
        max_cache_len: the static cache's size in tokens: the padded prompt and the new tokens must fit it.
        prompt_buckets: the prompt lengths a prefill graph is compiled for: ``"auto"`` (16, 32, 64... up to
            ``max_cache_len``) or a list of lengths; a prompt is padded on the left to the smallest that holds it.
        options: the ``qnn`` backend's options, as for ``torch.compile(..., options=...)``.

    Raises:
        InvalidOptionsError: ``model`` is not a causal LM this saves, or ``max_cache_len``/``prompt_buckets`` is not
            valid (each named with what is accepted).
        SavedGraphError: a graph does not run wholly on QNN (as :func:`qnnx_backend.save`).
    """
    from qnnx_backend import _payload, _saved

    if getattr(model, "generation_config", None) is None or getattr(model.config, "is_encoder_decoder", False):
        raise InvalidOptionsError(
            f"save_for_generation expects a transformers decoder-only causal LM (with generation_config), got "
            f"{type(model).__name__}; load it with AutoModelForCausalLM"
        )
    if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 2:
        raise InvalidOptionsError(
            f"max_cache_len={max_cache_len!r} is not valid; accepted: an int of at least 2 (prompt + new tokens)"
        )
    buckets = _saved_buckets(prompt_buckets, max_cache_len)
    opts = BackendOptions.from_mapping(options)
    model.eval()
    cache, layout = _layout(model, max_cache_len)
    step = _Step(model, cache)
    dtype = getattr(torch, layout["cache"]["dtype"])
    name = f"{type(model).__module__}.{type(model).__qualname__}"
    blobs: list[bytes] = []
    reports: list[Any] = []

    def graph(length: int) -> dict[str, Any]:
        state = _state(layout["cache"])
        ids = torch.arange(length).remainder(layout["vocab_size"])[None]
        valid = torch.zeros((1, max_cache_len), dtype=torch.bool)
        valid[0, :length] = True
        args = (ids, attention_mask_4d(valid, torch.arange(length), dtype), torch.arange(length)[None], *state)
        header, _out, graph_reports = _saved.save_header(step, args, {}, opts, blobs)
        header["call"]["model"] = name
        reports.extend(graph_reports)
        return header

    prefill = [{"length": b, "graph": graph(b)} for b in buckets]
    decode = graph(1)
    header = {
        "generation": {
            "format": GENERATION_FORMAT,
            "model": name,
            **layout,
            "prompt_buckets": list(buckets),
            "state": list(_STATE),
            "graphs": {"prefill": prefill, "decode": decode},
        }
    }
    data = _payload.pack_payload(header, blobs)
    target = _saved.write_atomically(path, data)
    logger.info("save_for_generation: saved %s to %s (%d bytes, prefill %s + decode)", name, target, len(data), buckets)
    return GenerationSaveReport(target, len(data), buckets, max_cache_len, tuple(reports))


def load_for_generation(path: str | os.PathLike[str]) -> LoadedGenerator:
    """Load a file of :func:`save_for_generation`: QNN sessions from its compiled contexts, the static cache
    allocated here; no model object, no Dynamo, no ``transformers`` model code.

    Raises:
        SavedGraphError: the file is not a generation file (a file of ``qnnx_backend.save`` is named as such), is
            damaged, truncated or of a newer format.
        QnnDeviceError: a graph cannot run here (as :func:`qnnx_backend.load`).
    """
    from qnnx_backend import _payload

    where = os.fspath(path)
    header, blobs = _payload.unpack_payload(Path(path).read_bytes())
    generation = header.get("generation")
    if not isinstance(generation, dict):
        raise SavedGraphError(
            f"{where} is not a generation file of qnnx_backend.hf.save_for_generation"
            + (" (it is a file of qnnx_backend.save: load it with qnnx_backend.load)" if "call" in header else "")
            + f"; {_FIX_SAVE}"
        )
    if generation.get("format") != GENERATION_FORMAT:
        raise SavedGraphError(
            f"{where} has generation format {generation.get('format')!r}; this qnnx-backend reads "
            f"{GENERATION_FORMAT}: upgrade qnnx-backend, or {_FIX_SAVE}"
        )
    try:
        return LoadedGenerator(generation, header["blobs"], blobs, where)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        if isinstance(exc, SavedGraphError):
            raise
        raise SavedGraphError(f"{where}'s generation section is malformed ({exc!r}); {_FIX_SAVE}") from exc


class LoadedGenerator:
    """A decoder loaded by :func:`load_for_generation`: greedy generation over a static cache it owns.

    Attributes:
        model_name: the class of the model that was saved, for messages.
        prompt_buckets: the prompt lengths of its prefill graphs.
        max_cache_len: the cache's size in tokens.
    """

    def __init__(self, generation: Mapping[str, Any], table: Any, blobs: Sequence[memoryview], where: str) -> None:
        from qnnx_backend import _saved

        if list(generation["state"]) != list(_STATE):
            raise SavedGraphError(f"{where} lists cache tensors {generation['state']!r}; {_FIX_SAVE}")
        self.model_name = str(generation["model"])
        self._cache = dict(generation["cache"])
        self.max_cache_len = int(self._cache["max_cache_len"])
        self._dtype = getattr(torch, str(self._cache["dtype"]))
        self._vocab = int(generation["vocab_size"])
        self._eos = frozenset(int(e) for e in generation["eos_token_ids"])
        self._pad = int(generation["pad_token_id"])
        graphs = generation["graphs"]
        self._prefill = {
            int(g["length"]): _saved.loaded_model({**g["graph"], "blobs": table}, blobs, where)
            for g in graphs["prefill"]
        }
        self.prompt_buckets = tuple(sorted(self._prefill))
        self._decode = _saved.loaded_model({**graphs["decode"], "blobs": table}, blobs, where)
        self._state = _state(self._cache)

    @property
    def reports(self) -> tuple[Any, ...]:
        """The report of each loaded graph (``cache="aot"`` when it came straight from its saved context)."""
        return tuple(r for m in (*self._prefill.values(), self._decode) for r in m.reports)

    def generate(
        self, input_ids: torch.Tensor, *, max_new_tokens: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Greedy generation: the prompt and up to ``max_new_tokens`` new tokens (fewer when an end-of-sequence
        token comes, which is kept), as ``[1, length]`` int64, like ``model.generate(..., do_sample=False)``.

        Raises:
            SavedInputError: the prompt is not an int64 ``[1, n]`` tensor of token ids below the vocabulary size, the
                mask is not of its shape, or the prompt and new tokens do not fit the saved buckets and cache.
        """
        ids = self._checked_ids(input_ids)
        mask = self._checked_mask(attention_mask, ids)
        length = ids.shape[1]
        bucket = prompt_bucket(length, max_new_tokens, self.prompt_buckets, self.max_cache_len)
        pad = bucket - length
        padded = torch.cat([torch.full((1, pad), self._pad, dtype=torch.long), ids], dim=1)
        valid = torch.zeros((1, self.max_cache_len), dtype=torch.bool)
        valid[0, pad:bucket] = mask[0].bool()
        positions = _positions(valid[:, :bucket])
        for tensor in self._state:
            tensor.zero_()
        rows = torch.arange(bucket)
        logits = self._prefill[bucket](padded, attention_mask_4d(valid, rows, self._dtype), positions, *self._state)
        seen = int(valid.sum())
        tokens: list[int] = []
        for step in range(max_new_tokens):
            token = int(logits[0].argmax())
            tokens.append(token)
            if token in self._eos or step == max_new_tokens - 1:
                break
            at = bucket + step
            valid[0, at] = True
            logits = self._decode(
                torch.tensor([[token]]),
                attention_mask_4d(valid, torch.tensor([at]), self._dtype),
                torch.tensor([[seen + step]]),
                *self._state,
            )
        return torch.cat([ids, torch.tensor([tokens], dtype=torch.long)], dim=1)

    def _checked_ids(self, input_ids: object) -> torch.Tensor:
        accepted = f"accepted: an int64 tensor [1, n] of token ids from 0 to {self._vocab - 1}"
        if not isinstance(input_ids, torch.Tensor):
            raise SavedInputError(f"input_ids is a {type(input_ids).__name__}; {accepted}: pass torch.tensor([ids])")
        shape = list(input_ids.shape)
        if input_ids.dtype != torch.long:
            raise SavedInputError(
                f"input_ids is {str(input_ids.dtype).removeprefix('torch.')}{shape}; {accepted}: convert it with "
                ".long()"
            )
        if input_ids.dim() != 2 or shape[0] != 1:
            raise SavedInputError(
                f"input_ids has shape {shape}; {accepted} (one prompt: the file holds a batch-1 cache): call "
                "generate once per prompt"
            )
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self._vocab):
            raise SavedInputError(
                f"input_ids holds ids from {int(input_ids.min())} to {int(input_ids.max())}; {accepted}: tokenize "
                f"with the saved model's tokenizer ({self.model_name})"
            )
        return input_ids

    def _checked_mask(self, attention_mask: object, ids: torch.Tensor) -> torch.Tensor:
        if attention_mask is None:
            return torch.ones_like(ids)
        if (
            not isinstance(attention_mask, torch.Tensor)
            or attention_mask.shape != ids.shape
            or attention_mask.is_floating_point()
            or bool(((attention_mask != 0) & (attention_mask != 1)).any())
            or not bool(attention_mask.any())
        ):
            got = (
                f"{str(attention_mask.dtype).removeprefix('torch.')}{list(attention_mask.shape)}"
                if isinstance(attention_mask, torch.Tensor)
                else type(attention_mask).__name__
            )
            raise SavedInputError(
                f"attention_mask is {got}; accepted: None, or an integer or bool tensor of input_ids' shape "
                f"{list(ids.shape)} of 0 (padding) and 1 (token), with at least one 1: pass the tokenizer's mask"
            )
        return attention_mask
