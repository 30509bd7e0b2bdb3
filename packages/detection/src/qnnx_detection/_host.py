"""Best-effort detection of the Snapdragon SoC this process runs on (never on x86, where HTP is simulated)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from pathlib import Path

from qnnx_clikit import chip_number
from qnnx_detection._native import is_x86

# Linux exposes the part name in soc0/machine on Qualcomm kernels ("SM8550") and the device-tree compatible list
# ("qcom,sm8550\0qcom,..."); Windows on Snapdragon names the chip in the processor brand string
# ("Snapdragon(R) X Elite - X1E78100 - Qualcomm(R) Oryon(TM) CPU").
_LINUX_SOURCES = (
    Path("/sys/devices/soc0/machine"),
    Path("/proc/device-tree/compatible"),
    Path("/sys/firmware/devicetree/base/compatible"),
)
_WINDOWS_BRAND = re.compile(r"\b(X1E|X2E|X2 Elite|X Elite)", re.IGNORECASE)


def linux_candidates(sources: Sequence[Path] = _LINUX_SOURCES) -> list[str]:
    """Chip-name candidates from Linux sysfs/device-tree files (missing or unreadable files are skipped)."""
    names: list[str] = []
    for path in sources:
        with contextlib.suppress(OSError):
            raw = path.read_bytes().decode("ascii", errors="replace")
            for item in re.split(r"[\x00\n,]", raw):
                item = item.strip()
                if item and item.lower() != "qcom":
                    names.append(item)
                    if re.match(r"(?i)^x[12]e\d", item):  # device trees name X Elite parts "qcom,x1e80100"
                        names.append(item[:3])
    return names


def _windows_candidates() -> list[str]:
    try:
        import winreg
    except ImportError:
        return []
    with contextlib.suppress(OSError):
        # typeshed declares winreg's contents only for win32, so off Windows mypy sees an empty module.
        key = winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0")  # type: ignore[attr-defined,unused-ignore]
        with key:
            brand, _ = winreg.QueryValueEx(key, "ProcessorNameString")  # type: ignore[attr-defined,unused-ignore]
        return brand_candidates(str(brand))
    return []


def brand_candidates(brand: str) -> list[str]:
    """Chip-name candidates from a Windows processor brand string ("Snapdragon(R) X Elite - X1E78100 - ...")."""
    match = _WINDOWS_BRAND.search(brand)
    return [match.group(1)] if match else []


def soc_from_candidates(candidates: Sequence[str]) -> int | None:
    """Return the QNN number of the first candidate that names a known chip, or None."""
    for name in candidates:
        number = chip_number(name)
        if number is not None:
            return number
    return None


def detect_host_soc(system: str, machine: str) -> int | None:
    """Return the QNN ``soc_model`` of the host's Snapdragon, or None (x86, unknown chip, or unreadable)."""
    if is_x86(machine):
        return None
    return soc_from_candidates(_windows_candidates() if system == "Windows" else linux_candidates())
