"""Device names accepted across the package."""

from __future__ import annotations

from collections.abc import Sequence

from qnnx_detection.errors import InvalidDeviceError

# "htp" is QNN's own name for the NPU backend; accept it so users can type either.
_ALIASES = {"htp": "npu", "npu": "npu", "gpu": "gpu", "cpu": "cpu", "auto": "auto"}


def normalize_device(value: object, *, allowed: Sequence[str], source: str = "device") -> str:
    """Return the canonical device name for ``value`` or raise :class:`InvalidDeviceError` naming the accepted ones."""
    canonical = _ALIASES.get(value.strip().lower()) if isinstance(value, str) else None
    if canonical is None or canonical not in allowed:
        accepted = ", ".join(repr(a) for a in allowed)
        hint = " ('htp' is accepted as a synonym of 'npu')" if "npu" in allowed else ""
        raise InvalidDeviceError(f"{source}={value!r} is not a valid device; use one of {accepted}{hint}")
    return canonical
