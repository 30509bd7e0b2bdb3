"""SoC model numbers as QNN knows them, chip names, HTP architectures.

The numbers are QNN's ``soc_model`` values (not Qualcomm's ``/sys/devices/soc0/soc_id``). For SM8350, SM8450,
SM8475, SM8550, SM8650, SM8750, SM8850, SC8380XP and SC8480XP the name -> number mapping was measured with
onnxruntime-qnn 2.7.0: it accepts those names as ``soc_model`` itself and writes the resolved number into the
EPContext compatibility string (``v2:6:2.51.0:5.51.0:0:<soc>:0:0``). SA8295P (39) and SA8775P (52) come from the
QAIRT device table. HTP architectures come from the QAIRT device table. The x86 HTP simulator of QAIRT 2.51
finalizes a graph for every number listed here (measured).
"""

from __future__ import annotations

import re

import attrs

from qnnx_detection.errors import InvalidSocModelError

#: Snapdragon X Elite (SC8380XP, HTP v73): the simulator's default target. Chosen because it is the most common
#: Windows-on-Snapdragon laptop chip and its fp16 numerics are what users deploy to.
DEFAULT_SOC_MODEL = 60


@attrs.frozen
class SocInfo:
    """One SoC QNN can target.

    Attributes:
        number: QNN ``soc_model`` value.
        name: Qualcomm part name, e.g. ``"SC8380XP"``.
        marketing_name: e.g. ``"Snapdragon X Elite"``.
        htp_arch: Hexagon (HTP) architecture version, e.g. ``73`` for v73.
        aliases: Extra accepted spellings (compared case-insensitively, ignoring spaces, ``-`` and ``_``).
    """

    number: int
    name: str
    marketing_name: str
    htp_arch: int | None
    aliases: tuple[str, ...] = ()


SOC_TABLE: tuple[SocInfo, ...] = (
    SocInfo(30, "SM8350", "Snapdragon 888", 68, ("snapdragon888",)),
    SocInfo(36, "SM8450", "Snapdragon 8 Gen 1", 69, ("8gen1", "snapdragon8gen1")),
    SocInfo(39, "SA8295P", "Snapdragon SA8295P (automotive)", 68, ("sa8295",)),
    SocInfo(42, "SM8475", "Snapdragon 8+ Gen 1", 69, ("8+gen1", "8plusgen1", "snapdragon8+gen1")),
    SocInfo(43, "SM8550", "Snapdragon 8 Gen 2", 73, ("8gen2", "snapdragon8gen2")),
    SocInfo(52, "SA8775P", "Snapdragon SA8775P (automotive)", 73, ("sa8775",)),
    SocInfo(57, "SM8650", "Snapdragon 8 Gen 3", 75, ("8gen3", "snapdragon8gen3")),
    SocInfo(60, "SC8380XP", "Snapdragon X Elite", 73, ("xelite", "snapdragonxelite", "x1e", "x1elite")),
    SocInfo(69, "SM8750", "Snapdragon 8 Elite", 79, ("8elite", "snapdragon8elite")),
    SocInfo(87, "SM8850", "Snapdragon 8 Elite Gen 5", 81, ("8elitegen5", "snapdragon8elitegen5")),
    SocInfo(88, "SC8480XP", "Snapdragon X2 Elite", 81, ("x2elite", "snapdragonx2elite", "x2e")),
)

_BY_NUMBER = {soc.number: soc for soc in SOC_TABLE}


def _normalize(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name).lower()


_BY_NAME: dict[str, int] = {}
for _soc in SOC_TABLE:
    for _key in (_soc.name, _soc.marketing_name, *_soc.aliases):
        _BY_NAME[_normalize(_key)] = _soc.number


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


def lookup_name(name: str) -> int | None:
    """Map a chip name or alias to its number, or None. Case, spaces, ``-`` and ``_`` are ignored."""
    return _BY_NAME.get(_normalize(name))


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
    number = lookup_name(text) if text else None
    if number is None:
        raise InvalidSocModelError(f"{source}={value!r} is not a known SoC; {fix}")
    return number
