"""The ``quantize`` option: which QDQ scheme a graph is quantized with, parsed and validated (private).

Importing this module does no work and imports neither torch nor onnxruntime: ``BackendOptions`` uses it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from qnnx_backend.errors import InvalidOptionsError

ACTIVATION_TYPES = ("uint8", "uint16")
"""Activation types HTP takes in QDQ graphs (uint16 is QNN's recommended accuracy/speed default)."""
WEIGHT_TYPES = ("uint8", "int8", "uint16", "int4")
"""Weight types; HTP's MatMul takes the (activation, weight) pairs (u8, u8), (u8, u16) and (u16, u8), and
per-channel int4 weights under uint16 activations (``a16w4``)."""
CALIBRATIONS = ("minmax", "entropy", "percentile")
"""onnxruntime's calibration methods (``CalibrationMethod.MinMax``, ``Entropy``, ``Percentile``)."""
PRESETS: Mapping[str, tuple[str, str]] = {
    "a16w8": ("uint16", "uint8"),
    "a8w8": ("uint8", "uint8"),
    "a16w4": ("uint16", "int4"),
    "llm-a16w4": ("uint16", "uint8"),
}
"""Named schemes: (activation type, weight type of the weights no ``module_weight_types`` entry names)."""
LLM_MODULE_WEIGHT_TYPES: Mapping[str, str] = {
    # The Linear layers of the decoder blocks (Llama, Qwen, Mistral, Phi-3, GPT-NeoX: "layers"; GPT-2: "h").
    "layers": "int4",
    "h": "int4",
    # The output head at 8 bits per output channel, as the published w4a16 recipes keep it wider: in int4 blocks
    # of 32 the trained decoder of the test suite kept every token but lost 0.9 dB on its decode logits. The
    # embedding table at 8 bits (one scale, the Gather's output converted to 16 bits for its readers): on that
    # decoder it changed the logits by 0.1 dB and no token, and at Qwen2.5-0.5B's width it is half the table's
    # bytes (136M entries; at 16 bits the table was most of a 2-layer graph's context).
    "embed_tokens": "uint8",
    "embed_in": "uint8",
    "wte": "uint8",
    "word_embeddings": "uint8",
    "lm_head": "int8",
    "embed_out": "int8",
}
"""The ``llm-a16w4`` recipe's weight types per module name (see :data:`RECIPES`)."""
RECIPES: Mapping[str, Mapping[str, Any]] = {
    # No SQNR floor: on the decoder trained in the test suite the recipe's decode logits sit near 20 dB (int4
    # noise) and with per-channel weights its prefill graph's worst output (the cache rows of the padding, which no
    # token reads) fell below 0 dB, while all 128 generated tokens stayed eager's argmax. Judge it by the tokens.
    # Blocks of 32 inputs per scale (the LLM toolchains' practice): on that decoder the decode logits went from
    # 17.5 dB (one scale per output channel) to 20.0 dB, prefill -0.1 -> 19.0 dB, next-token loss 0.0053 -> 0.0052,
    # tokens all eager's either way; blocks of 16 gave 20.4 dB for twice the scale bytes, blocks of 64 18.6 dB.
    "llm-a16w4": {
        "module_weight_types": LLM_MODULE_WEIGHT_TYPES,
        "min_sqnr": None,
        "block_size": 32,
    },
}
"""Presets with more settings than the two types: the defaults they give the other keys."""
MODULE_WEIGHT_OPS = ("MatMul", "Gemm", "Gather", "Conv", "ConvTranspose")
"""The ONNX ops whose constant weights ``module_weight_types`` sets (norm scales and biases keep the scheme's)."""
BLOCK_SIZES = (16, 32, 64, 128)
"""Block sizes of block-wise int4 weights (``block_size``): powers of two HTP took inside a QDQ graph with uint16
activations on onnxruntime-qnn 2.7.0 (a [256, 128] MatMul: 22.4 / 21.4 / 20.8 / 20.2 dB, the CPU EP's result), and
that onnxruntime's block quantizer writes (at least 16)."""
DEFAULT_MIN_SQNR = 20.0
"""dB. Below it a quantized graph is not used: a net failure of quantization, not a fine accuracy target (the small
models of the test suite reach 30-50 dB)."""

_KEYS = (
    "scheme",
    "activation_type",
    "weight_type",
    "per_channel",
    "calibration",
    "keep_float_ops",
    "keep_float_modules",
    "min_sqnr",
    "module_weight_types",
    "block_size",
)
_EXAMPLE = (
    "Example: quantize='a16w8', quantize='llm-a16w4' for a decoder, or quantize={'scheme': 'a8w8', 'calibration': "
    "'percentile', 'min_sqnr': 25}"
)


@attrs.frozen(kw_only=True)
class QuantizeSpec:
    """How a graph is quantized: the parsed ``quantize`` option."""

    scheme: str
    """The preset the settings start from (``"a16w8"`` or ``"a8w8"``)."""
    activation_type: str
    weight_type: str
    per_channel: bool = True
    """One weight scale per output channel (Conv, ConvTranspose and Gemm weights; MatMul weights when signed). Default:
    on a convolutional net trained in the test suite it kept 4-5 dB more than one scale per tensor, and no model
    measured lost by it (the README's *Quantized models* has the figures). False: one scale per weight tensor."""
    calibration: str = "minmax"
    keep_float_ops: tuple[str, ...] = ()
    """ONNX op types left in float (e.g. ``"LayerNormalization"``)."""
    keep_float_modules: tuple[str, ...] = ()
    """PyTorch module paths (e.g. ``"encoder.layer.0.attention"``) whose ONNX nodes are left in float."""
    min_sqnr: float | None = DEFAULT_MIN_SQNR
    """dB; a quantized graph below it against float eager PyTorch falls back to float QNN (raises under strict).
    None: no floor (the figures are still reported)."""
    module_weight_types: tuple[tuple[str, str], ...] = ()
    """(module name, weight type) pairs, sorted: the weights of the MatMul, Gemm, Gather and Conv nodes of a module
    whose dotted path holds the name (``"lm_head"``, ``"layers"``, ``"model.layers.0.mlp"``) take that type; the
    longest matching name wins."""
    block_size: int | None = None
    """Inputs per scale of the int4 MatMul/Gemm weights (one of :data:`BLOCK_SIZES`): each output channel's weights
    get one scale per block of that many inputs. None: one scale per output channel (``per_channel``) or per tensor.
    A weight whose input count the block does not divide keeps the ``per_channel`` form (the report says why)."""

    def weight_type_of(self, module: str) -> str:
        """The weight type of a weight-carrying node from PyTorch module ``module`` (dotted path, may be empty)."""
        return module_weight_type(module, self.module_weight_types) or self.weight_type

    @property
    def label(self) -> str:
        """A short name, e.g. ``a16w8`` or ``a16w8 (uint16/int8, per-tensor, percentile)``."""
        base = PRESETS[self.scheme]
        extras = []
        if (self.activation_type, self.weight_type) != base:
            extras.append(f"{self.activation_type}/{self.weight_type}")
        if not self.per_channel:
            extras.append("per-tensor")
        if self.calibration != "minmax":
            extras.append(self.calibration)
        if self.module_weight_types and dict(self.module_weight_types) != dict(
            RECIPES.get(self.scheme, {}).get("module_weight_types", {})
        ):
            extras.append(f"{len(self.module_weight_types)} module weight type(s)")
        int4 = self.weight_type == "int4" or any(t == "int4" for _, t in self.module_weight_types)
        if int4 and self.block_size != RECIPES.get(self.scheme, {}).get("block_size"):
            extras.append(f"int4 blocks of {self.block_size}" if self.block_size else "int4 per-channel")
        if self.keep_float_ops or self.keep_float_modules:
            extras.append(f"{len(self.keep_float_ops) + len(self.keep_float_modules)} kept in float")
        return self.scheme + (f" ({', '.join(extras)})" if extras else "")

    def cache_material(self) -> dict[str, str]:
        """The settings that change the quantized model (min_sqnr does not: it only decides whether it is used)."""
        return {
            "quantize.activation_type": self.activation_type,
            "quantize.weight_type": self.weight_type,
            "quantize.per_channel": str(self.per_channel),
            "quantize.calibration": self.calibration,
            "quantize.keep_float_ops": ",".join(self.keep_float_ops),
            "quantize.keep_float_modules": ",".join(self.keep_float_modules),
            "quantize.module_weight_types": ",".join(f"{m}={t}" for m, t in self.module_weight_types),
            "quantize.block_size": str(self.block_size),
        }


def module_weight_type(module: str, table: tuple[tuple[str, str], ...]) -> str | None:
    """The type of the longest name of ``table`` whose dotted segments appear, in a row, in ``module``'s path."""
    segments = module.split(".") if module else []
    best: tuple[int, str] | None = None
    for name, weight_type in table:
        parts = name.split(".")
        n = len(parts)
        if any(segments[k : k + n] == parts for k in range(len(segments) - n + 1)) and (best is None or n > best[0]):
            best = (n, weight_type)
    return best[1] if best else None


def _invalid(detail: str) -> InvalidOptionsError:
    prefix = "" if detail.startswith("quantize=") else "quantize: "
    return InvalidOptionsError(f"{prefix}{detail}. {_EXAMPLE}.")


def _choice(key: str, value: object, accepted: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.strip().lower() not in accepted:
        raise _invalid(f"{key}={value!r} is not valid; accepted: {', '.join(map(repr, accepted))}")
    return value.strip().lower()


def _names(key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise _invalid(f"{key}={value!r} is not valid; accepted: a list of names")
    bad = [v for v in value if not isinstance(v, str) or not v.strip()]
    if bad:
        raise _invalid(f"{key} holds {bad!r}; accepted: non-empty strings")
    return tuple(sorted({v.strip() for v in value}))


def _module_weight_types(value: object) -> tuple[tuple[str, str], ...]:
    accepted = f"a dict of PyTorch module names to weight types ({', '.join(map(repr, WEIGHT_TYPES))})"
    if not isinstance(value, Mapping):
        raise _invalid(f"module_weight_types={value!r} is not valid; accepted: {accepted}, e.g. {{'lm_head': 'int8'}}")
    pairs = []
    for name, weight_type in value.items():
        if not isinstance(name, str) or not name.strip() or any(not part for part in name.strip().split(".")):
            raise _invalid(f"module_weight_types has the key {name!r}; accepted: a module name such as 'lm_head'")
        pairs.append((name.strip(), _choice(f"module_weight_types[{name!r}]", weight_type, WEIGHT_TYPES)))
    return tuple(sorted(pairs))


def _min_sqnr(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _invalid(f"min_sqnr={value!r} is not valid; accepted: a finite number of dB (e.g. 25), or None")
    return float(value)


def _block_size(value: object, int4: bool) -> int | None:
    if value is None:
        return None
    accepted = f"accepted: {', '.join(map(str, BLOCK_SIZES))} (inputs per scale), or None for one scale per channel"
    if isinstance(value, bool) or not isinstance(value, int) or value not in BLOCK_SIZES:
        raise _invalid(
            f"block_size={value!r} is not valid; {accepted}; pick one that divides your Linear layers' input sizes "
            "(32 is the LLM toolchains' choice; other sizes were not measured on HTP)"
        )
    if not int4:
        raise _invalid(
            f"block_size={value!r} applies to int4 weights and this scheme has none; use scheme 'a16w4' or "
            "'llm-a16w4', set weight_type='int4', or drop block_size"
        )
    return value


def parse_quantize(value: object) -> QuantizeSpec | None:
    """Parse the ``quantize`` option; every failure is an InvalidOptionsError naming the value and the fix."""
    if value is None or isinstance(value, QuantizeSpec):
        return value
    if isinstance(value, str):
        scheme = _choice("quantize", value, tuple(PRESETS))
        if scheme in RECIPES:
            return parse_quantize({"scheme": scheme})
        act, weight = PRESETS[scheme]
        return QuantizeSpec(scheme=scheme, activation_type=act, weight_type=weight)
    if not isinstance(value, Mapping):
        accepted = ", ".join(map(repr, PRESETS))
        raise _invalid(f"{value!r} is not valid; accepted: None, {accepted} or a dict of settings")
    unknown = [str(k) for k in value if k not in _KEYS]
    if unknown:
        hints = [difflib.get_close_matches(k, _KEYS, n=1) for k in unknown]
        close = "".join(f" (did you mean {h[0]!r}?)" for h in hints if h)
        raise _invalid(f"unknown key(s) {', '.join(map(repr, sorted(unknown)))}{close}; valid keys: {', '.join(_KEYS)}")
    scheme = _choice("scheme", value.get("scheme", "a16w8"), tuple(PRESETS))
    act, weight = PRESETS[scheme]
    recipe = RECIPES.get(scheme, {})
    weight_type = _choice("weight_type", value.get("weight_type", weight), WEIGHT_TYPES)
    # A recipe's module table is the base the given one adds to (or overrides name by name).
    given = value.get("module_weight_types", {})
    base = recipe.get("module_weight_types", {})
    module_types = _module_weight_types({**base, **given} if isinstance(given, Mapping) else given)
    int4 = weight_type == "int4" or any(t == "int4" for _, t in module_types)
    per_channel = value.get("per_channel", True)
    if not isinstance(per_channel, bool):
        raise _invalid(f"per_channel={per_channel!r} is not valid; accepted: True or False")
    # A recipe's block size applies only where it has int4 weights; a block size asked for needs them.
    if "block_size" in value:
        block_size = _block_size(value["block_size"], int4)
    else:
        block_size = recipe.get("block_size") if int4 else None
    fields: dict[str, Any] = {
        "scheme": scheme,
        "activation_type": _choice("activation_type", value.get("activation_type", act), ACTIVATION_TYPES),
        "weight_type": weight_type,
        "per_channel": per_channel,
        "calibration": _choice("calibration", value.get("calibration", "minmax"), CALIBRATIONS),
        "keep_float_ops": _names("keep_float_ops", value.get("keep_float_ops", ())),
        "keep_float_modules": _names("keep_float_modules", value.get("keep_float_modules", ())),
        "min_sqnr": _min_sqnr(value.get("min_sqnr", recipe.get("min_sqnr", DEFAULT_MIN_SQNR))),
        "module_weight_types": module_types,
        "block_size": block_size,
    }
    return QuantizeSpec(**fields)


class QuantizeFailed(Exception):
    """onnxruntime's quantization of a graph failed (internal to the backend)."""


def load_values(tensor: Any, base_dir: Path | None) -> Any:
    """Read an external ``tensor``'s values from ``base_dir`` into it (it then holds them, as an inline tensor);
    an inline tensor is left as it is. Returns the tensor."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if uses_external_data(tensor):
        if base_dir is None:
            raise QuantizeFailed(f"the tensor {tensor.name!r} is external data and no folder to read it from was given")
        load_external_data_for_tensor(tensor, str(base_dir))
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]
    return tensor


def tensor_value(tensor: Any, base_dir: Path | None = None) -> Any:
    """``tensor``'s array; an external tensor's values are read from ``base_dir`` into a copy, so the model keeps
    referring to the file (``numpy_helper.to_array`` would load them into the model's own tensor)."""
    from onnx import TensorProto, numpy_helper
    from onnx.external_data_helper import uses_external_data

    if not uses_external_data(tensor):
        return numpy_helper.to_array(tensor)
    loaded = TensorProto()
    loaded.CopyFrom(tensor)
    return numpy_helper.to_array(load_values(loaded, base_dir))
