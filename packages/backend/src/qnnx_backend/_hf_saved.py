"""A decoder saved for generation (its prefill buckets and decode step, one payload over one blob table) and loaded
without the model: :func:`save_for_generation`, :func:`load_for_generation` and the greedy loop it runs."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from qnnx_backend._buckets import AUTO_MIN
from qnnx_backend._hf_prompts import mask_positions, prompt_buckets_option
from qnnx_backend._options import BackendOptions
from qnnx_backend.errors import InvalidOptionsError, SavedGraphError, SavedInputError

__all__ = [
    "GENERATION_FORMAT",
    "GenerationSaveReport",
    "LoadedGenerator",
    "attention_mask_4d",
    "load_for_generation",
    "prompt_bucket",
    "save_for_generation",
]

logger = logging.getLogger("qnnx_backend.hf")  # the generation helpers log under their public module, as before


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
    buckets = prompt_buckets_option(value) if value is not None else None
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
        positions = mask_positions(valid[:, :bucket])
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
