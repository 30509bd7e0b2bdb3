"""SoC model numbers as QNN knows them, chip names, HTP architectures.

The chip table itself (QNN ``soc_model`` numbers, names, HTP architectures, and where they were measured) lives in
qnnx-clikit, the one copy every qnnx command line reads too; this module gives it qnnx-detection's types and
errors.
"""

from __future__ import annotations

import attrs

from qnnx_clikit import CHIPS, chip_number
from qnnx_detection.errors import InvalidSocModelError

#: Snapdragon X Elite (SC8380XP, HTP v73): the simulator's default target. Chosen because it is the most common
#: Windows-on-Snapdragon laptop chip and its fp16 numerics are what users deploy to.
DEFAULT_SOC_MODEL = 60


@attrs.frozen
class SocInfo:
    """One SoC QNN can target: a row of the chip table, with the fields of :class:`qnnx_clikit.Chip` (``number``,
    the QNN ``soc_model`` value; ``name``, the part name such as ``"SC8380XP"``; ``marketing_name``; ``htp_arch``,
    e.g. ``73`` for v73; ``aliases``, extra accepted spellings)."""

    number: int
    name: str
    marketing_name: str
    htp_arch: int | None
    aliases: tuple[str, ...] = ()


SOC_TABLE: tuple[SocInfo, ...] = tuple(
    SocInfo(chip.number, chip.name, chip.marketing_name, chip.htp_arch, chip.aliases) for chip in CHIPS
)

_BY_NUMBER = {soc.number: soc for soc in SOC_TABLE}


def soc_info(number: int) -> SocInfo | None:
    """Return what is known about QNN ``soc_model`` ``number``, or None when it is not in the table."""
    return _BY_NUMBER.get(number)


def soc_name(number: int) -> str | None:
    """Return the Qualcomm part name of QNN ``soc_model`` ``number`` (``60`` -> ``"SC8380XP"``), or None if unknown."""
    info = _BY_NUMBER.get(number)
    return info.name if info is not None else None


def htp_arch(number: int) -> int | None:
    """Return the HTP architecture of QNN ``soc_model`` ``number`` (``60`` -> ``73``), or None if unknown."""
    info = _BY_NUMBER.get(number)
    return info.htp_arch if info is not None else None


def accepted_names() -> tuple[str, ...]:
    """The chip names :func:`parse_soc_model` accepts (part names; aliases are accepted too)."""
    return tuple(soc.name for soc in SOC_TABLE)


def parse_soc_model(value: object, *, source: str = "soc_model") -> int:
    """Turn an int, digit string or chip name into a QNN ``soc_model`` number.

    Args:
        value: The value to parse. ``bool`` is rejected even though it is an ``int``.
        source: How the value was given, for the error message (e.g. ``"QNNX_SOC_MODEL"``).

    Raises:
        InvalidSocModelError: ``value`` is negative, of the wrong type, or an unknown name.
    """
    names = ", ".join(accepted_names())
    fix = f"use a non-negative integer or one of: {names} (aliases such as 'x-elite' also work)"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidSocModelError(f"{source}={value!r} has type {type(value).__name__}; {fix}")
    if isinstance(value, int):
        if value < 0:
            raise InvalidSocModelError(f"{source}={value!r} is negative; {fix}")
        return value
    text = value.strip()
    if text.isdecimal() and text.isascii():
        return int(text)
    number = chip_number(text) if text else None
    if number is None:
        raise InvalidSocModelError(f"{source}={value!r} is not a known SoC; {fix}")
    return number
