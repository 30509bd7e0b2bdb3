"""Rotary position embeddings read from a table during generation (private).

A decoder's rotary embedding computes ``cos(position * inv_freq)`` and ``sin(...)`` from the runtime positions. On
the NPU that product is a float16 number: at position 1000 its step is 0.5 rad, so cos and sin come back off by up
to 0.14 (0.22 at position 3000; measured on the HTP simulator), the attention of a trained model drifts, and no
first-call check sees it (the first call is at short positions). :class:`RotaryTables` computes each rotary
module's cos and sin once, on the host in float32, for every position the static cache can hold, and the module then
reads them by position (a Gather of exact values, each rounded to float16 once). A module whose output for a
position depends on the other positions asked for (dynamic NTK scaling, LongRoPE) keeps computing them.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

logger = logging.getLogger("qnnx_backend.hf")  # the generation helpers log under their public module

_TABLE = "_qnnx_rotary_table"  # the buffers' name prefix (non-persistent: never in the state dict)


def _layer_type_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if len(args) > 1 or set(kwargs) - {"layer_type"}:
        return _UNKNOWN
    return args[0] if args else kwargs.get("layer_type")


_UNKNOWN = object()


class _Rotary:
    """One rotary module's original forward and its tables (cos, sin per layer type) for ``positions`` positions."""

    def __init__(self, module: torch.nn.Module, original: Any, takes_layer_type: bool) -> None:
        self.module = module
        self.original = original
        self.takes_layer_type = takes_layer_type
        self.positions = 0
        self.keys: dict[Any, str] = {}  # layer type -> buffer name stem

    def tabulate(self, positions: int, layer_types: list[Any]) -> bool:
        """Compute the tables for ``positions`` positions; False when the module's output for a position depends on
        how many are asked for (then it keeps computing them)."""
        probe = torch.zeros(1, 1, 1)
        full = torch.arange(positions).unsqueeze(0)
        half = full[:, : max(1, positions // 2)]
        keys: dict[Any, str] = {}
        with torch.no_grad():
            for i, layer_type in enumerate(layer_types if self.takes_layer_type else [None]):
                extra = {"layer_type": layer_type} if self.takes_layer_type and layer_type is not None else {}
                try:
                    cos, sin = self.original(probe, full, **extra)
                    cos_half, sin_half = self.original(probe, half, **extra)
                except Exception as exc:  # a module of another shape: leave it as it is
                    logger.debug("rotary tables: %s declined (%s)", type(self.module).__name__, exc)
                    return False
                n = half.shape[1]
                if not (torch.equal(cos[:, :n], cos_half) and torch.equal(sin[:, :n], sin_half)):
                    return False
                stem = f"{_TABLE}_{i}"
                self.module.register_buffer(f"{stem}_cos", cos[0].float().contiguous(), persistent=False)
                self.module.register_buffer(f"{stem}_sin", sin[0].float().contiguous(), persistent=False)
                keys[layer_type] = stem
        self.keys, self.positions = keys, positions
        return True

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor | None, *args: Any, **kwargs: Any) -> Any:
        stem = self.keys.get(_layer_type_of(args, kwargs)) if self.keys else None
        if stem is None or not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
            return self.original(x, position_ids, *args, **kwargs)
        cos = getattr(self.module, f"{stem}_cos")[position_ids]
        sin = getattr(self.module, f"{stem}_sin")[position_ids]
        return cos.to(x.dtype), sin.to(x.dtype)


class RotaryTables:
    """The rotary modules of a generation model, read from tables sized to its static cache."""

    def __init__(self, model: Any) -> None:
        self._rotaries: list[_Rotary] = []
        self._covered: Any = _UNKNOWN  # the cache whose positions the tables were last sized for
        config: Any = getattr(model, "config", None)
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        self._layer_types = sorted(set(getattr(text, "layer_types", None) or []), key=str) or [None]
        for module in model.modules():
            if not type(module).__name__.endswith("RotaryEmbedding") or "_qnnx_rotary" in vars(module):
                continue
            original = module.forward
            try:
                params = list(inspect.signature(original).parameters)
            except (TypeError, ValueError):
                continue
            if params[:2] != ["x", "position_ids"] or set(params[2:]) - {"layer_type"}:
                continue
            rotary = _Rotary(module, original, "layer_type" in params)
            module._qnnx_rotary = rotary  # marks it: a second compile_for_generation reuses it
            self._rotaries.append(rotary)
        for module in model.modules():
            rotary = vars(module).get("_qnnx_rotary")
            if rotary is not None and rotary not in self._rotaries:
                self._rotaries.append(rotary)

    def cover(self, cache: Any, cache_position: Any, at_least: int | None) -> None:
        """Make the tables cover every position this call and ``cache`` can reach (called before each forward; a
        model without rotary modules, or tables already large enough, return at once).

        The size is the largest of the cache's layers (a sliding layer knows only its window), ``at_least``
        (``max_cache_len``) and this call's last position + 1; a table outgrown later doubles (one recompile).
        """
        if not self._rotaries:
            return
        last = 0
        if isinstance(cache_position, torch.Tensor) and cache_position.numel():
            last = int(cache_position.max()) + 1
        have = min(r.positions for r in self._rotaries)
        if cache is self._covered and last <= have:
            return  # a decode step of a cache already covered: the per-call cost is this check
        lengths = [getattr(layer, "max_cache_len", 0) for layer in getattr(cache, "layers", None) or ()]
        positions = max([n for n in (*lengths, at_least or 0) if isinstance(n, int)], default=0)
        positions = max(positions, last if last <= have else max(last, 2 * have))
        self._covered = cache
        if positions <= 0:
            return
        for rotary in self._rotaries:
            if rotary.positions >= positions:
                continue
            if rotary.tabulate(positions, self._layer_types):
                rotary.module.forward = rotary.forward
                logger.info(
                    "compile_for_generation: %s reads cos/sin of positions 0-%d from a float32-computed table "
                    "(computed on the NPU they lose precision past about 100 positions)",
                    type(rotary.module).__name__,
                    positions - 1,
                )
            else:
                rotary.module.forward = rotary.original
                rotary.keys, rotary.positions = {}, positions  # not asked again for this size
                logger.warning(
                    "compile_for_generation: %s computes cos/sin from the positions it is given (its output for a "
                    "position depends on the others: dynamic scaling); on the NPU they lose precision past about "
                    "100 positions",
                    type(rotary.module).__name__,
                )
