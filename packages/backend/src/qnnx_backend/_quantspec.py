"""The ``quantize`` option: which QDQ scheme a graph is quantized with, parsed and validated (private).

Importing this module does no work and imports neither torch nor onnxruntime: ``BackendOptions`` uses it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
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
}
"""Named schemes: (activation type, weight type)."""
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
)
_EXAMPLE = "Example: quantize='a16w8', or quantize={'scheme': 'a8w8', 'calibration': 'percentile', 'min_sqnr': 25}"


@attrs.frozen(kw_only=True)
class QuantizeSpec:
    """How a graph is quantized: the parsed ``quantize`` option."""

    scheme: str
    """The preset the settings start from (``"a16w8"`` or ``"a8w8"``)."""
    activation_type: str
    weight_type: str
    per_channel: bool = False
    calibration: str = "minmax"
    keep_float_ops: tuple[str, ...] = ()
    """ONNX op types left in float (e.g. ``"LayerNormalization"``)."""
    keep_float_modules: tuple[str, ...] = ()
    """PyTorch module paths (e.g. ``"encoder.layer.0.attention"``) whose ONNX nodes are left in float."""
    min_sqnr: float | None = DEFAULT_MIN_SQNR
    """dB; a quantized graph below it against float eager PyTorch falls back to float QNN (raises under strict).
    None: no floor (the figures are still reported)."""

    @property
    def label(self) -> str:
        """A short name, e.g. ``a16w8`` or ``a16w8 (uint16/int8, per-channel, percentile)``."""
        base = PRESETS[self.scheme]
        extras = []
        if (self.activation_type, self.weight_type) != base:
            extras.append(f"{self.activation_type}/{self.weight_type}")
        if self.per_channel:
            extras.append("per-channel")
        if self.calibration != "minmax":
            extras.append(self.calibration)
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
        }


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


def _min_sqnr(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _invalid(f"min_sqnr={value!r} is not valid; accepted: a finite number of dB (e.g. 25), or None")
    return float(value)


def parse_quantize(value: object) -> QuantizeSpec | None:
    """Parse the ``quantize`` option; every failure is an InvalidOptionsError naming the value and the fix."""
    if value is None or isinstance(value, QuantizeSpec):
        return value
    if isinstance(value, str):
        scheme = _choice("quantize", value, tuple(PRESETS))
        act, weight = PRESETS[scheme]
        return QuantizeSpec(scheme=scheme, activation_type=act, weight_type=weight, per_channel=weight == "int4")
    if not isinstance(value, Mapping):
        raise _invalid(f"{value!r} is not valid; accepted: None, 'a16w8', 'a8w8', 'a16w4' or a dict of settings")
    unknown = [str(k) for k in value if k not in _KEYS]
    if unknown:
        hints = [difflib.get_close_matches(k, _KEYS, n=1) for k in unknown]
        close = "".join(f" (did you mean {h[0]!r}?)" for h in hints if h)
        raise _invalid(f"unknown key(s) {', '.join(map(repr, sorted(unknown)))}{close}; valid keys: {', '.join(_KEYS)}")
    scheme = _choice("scheme", value.get("scheme", "a16w8"), tuple(PRESETS))
    act, weight = PRESETS[scheme]
    weight_type = _choice("weight_type", value.get("weight_type", weight), WEIGHT_TYPES)
    # Sixteen levels per tensor lose most weights to rounding: int4 weights are per output channel unless told.
    per_channel = value.get("per_channel", weight_type == "int4")
    if not isinstance(per_channel, bool):
        raise _invalid(f"per_channel={per_channel!r} is not valid; accepted: True or False")
    fields: dict[str, Any] = {
        "scheme": scheme,
        "activation_type": _choice("activation_type", value.get("activation_type", act), ACTIVATION_TYPES),
        "weight_type": weight_type,
        "per_channel": per_channel,
        "calibration": _choice("calibration", value.get("calibration", "minmax"), CALIBRATIONS),
        "keep_float_ops": _names("keep_float_ops", value.get("keep_float_ops", ())),
        "keep_float_modules": _names("keep_float_modules", value.get("keep_float_modules", ())),
        "min_sqnr": _min_sqnr(value.get("min_sqnr", DEFAULT_MIN_SQNR)),
    }
    return QuantizeSpec(**fields)
