"""The one place that reads qnnx's environment variables."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal, cast

from qnnx_detection._devices import normalize_device
from qnnx_detection._report import Overrides
from qnnx_detection._soc import parse_soc_model
from qnnx_detection.errors import InvalidDeviceError, InvalidSocModelError

ENV_DISABLE = "QNNX_DISABLE"
ENV_DEVICE = "QNNX_DEVICE"
ENV_SOC_MODEL = "QNNX_SOC_MODEL"
ENV_PROBE_CACHE = "QNNX_PROBE_CACHE"
ENV_PROBE_CACHE_DIR = "QNNX_PROBE_CACHE_DIR"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_DEVICE_VALUES = ("npu", "gpu", "cpu", "auto")


def parse_overrides(environ: Mapping[str, str]) -> Overrides:
    """Read ``QNNX_DISABLE``, ``QNNX_DEVICE`` and ``QNNX_SOC_MODEL`` from ``environ``. Never raises.

    Invalid values are recorded in ``Overrides.problems``. An unrecognised ``QNNX_DISABLE`` value counts as
    "disabled": whoever set the variable wanted QNN off, and running on QNN anyway would be the surprising outcome.
    """
    problems: list[str] = []
    raw_disable = environ.get(ENV_DISABLE)
    raw_device = environ.get(ENV_DEVICE)
    raw_soc = environ.get(ENV_SOC_MODEL)
    return Overrides(
        disabled=_disabled(raw_disable, problems),
        device=_device(raw_device, problems),
        soc_model=_soc_model(raw_soc, problems),
        raw_disable=raw_disable,
        raw_device=raw_device,
        raw_soc_model=raw_soc,
        problems=tuple(problems),
    )


def _disabled(raw: str | None, problems: list[str]) -> bool:
    """``QNNX_DISABLE``: unset or false keeps QNN on; true, or anything else (with a problem noted), turns it off."""
    if raw is None:
        return False
    flag = raw.strip().lower()
    if flag not in _TRUE and flag not in _FALSE:
        problems.append(
            f"{ENV_DISABLE}={raw!r} is not a boolean; use 1/true/yes/on or 0/false/no/off (treated as disabled)"
        )
    return flag not in _FALSE


def _device(raw: str | None, problems: list[str]) -> Literal["npu", "gpu", "cpu"] | None:
    """``QNNX_DEVICE``: the forced device, or None when unset, ``auto`` or invalid (a problem noted)."""
    if raw is None or not raw.strip():
        return None
    try:
        device = normalize_device(raw, allowed=_DEVICE_VALUES, source=ENV_DEVICE)
    except InvalidDeviceError as exc:
        problems.append(f"{exc} (ignored: automatic device choice)")
        return None
    return None if device == "auto" else cast(Literal["npu", "gpu", "cpu"], device)  # one of _DEVICE_VALUES


def _soc_model(raw: str | None, problems: list[str]) -> int | None:
    """``QNNX_SOC_MODEL``: the SoC number, or None when unset or invalid (a problem noted)."""
    if raw is None or not raw.strip():
        return None
    try:
        return parse_soc_model(raw, source=ENV_SOC_MODEL)
    except InvalidSocModelError as exc:
        problems.append(f"{exc} (ignored)")
        return None


def probe_cache_root(environ: Mapping[str, str]) -> Path | None:
    """The folder of the probe cache, or None when ``QNNX_PROBE_CACHE`` turns it off. Never raises.

    ``QNNX_PROBE_CACHE_DIR`` when set, else ``probe`` in the per-user cache folder of qnnx. Any value of
    ``QNNX_PROBE_CACHE`` other than a false one (``0``/``false``/``no``/``off``) or empty keeps it on.
    """
    flag = environ.get(ENV_PROBE_CACHE)
    if flag is not None and flag.strip().lower() in _FALSE - {""}:
        return None
    folder = environ.get(ENV_PROBE_CACHE_DIR)
    if folder is not None and folder.strip():
        return Path(folder).expanduser()
    try:
        import platformdirs  # deferred: only a full probe reads or writes the cache
    except ImportError:
        return None
    return Path(platformdirs.user_cache_dir("qnnx", appauthor=False)) / "probe"
