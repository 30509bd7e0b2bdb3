"""The Snapdragon chips QNN can target (QNN ``soc_model`` numbers, chip names, HTP architectures) and ``--soc-model``.

The one copy of the table: qnnx-detection's ``SOC_TABLE`` and every qnnx command line read it from here.

The numbers are QNN's ``soc_model`` values (not Qualcomm's ``/sys/devices/soc0/soc_id``). For SM8350, SM8450,
SM8475, SM8550, SM8650, SM8750, SM8850, SC8380XP and SC8480XP the name -> number mapping was measured with
onnxruntime-qnn 2.7.0: it accepts those names as ``soc_model`` itself and writes the resolved number into the
EPContext compatibility string (``v2:6:2.51.0:5.51.0:0:<soc>:0:0``). SA8295P (39) and SA8775P (52) come from the
QAIRT device table. HTP architectures come from the QAIRT device table. The x86 HTP simulator of QAIRT 2.51
finalizes a graph for every number listed here (measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re

__all__ = ["CHIPS", "Chip", "chip_number", "normalize_chip_name", "soc_model"]


@dataclasses.dataclass(frozen=True)
class Chip:
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

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every name the chip is accepted by: the part name, the marketing name, then the aliases."""
        return (self.name, self.marketing_name, *self.aliases)


CHIPS: tuple[Chip, ...] = (
    Chip(30, "SM8350", "Snapdragon 888", 68, ("snapdragon888",)),
    Chip(36, "SM8450", "Snapdragon 8 Gen 1", 69, ("8gen1", "snapdragon8gen1")),
    Chip(39, "SA8295P", "Snapdragon SA8295P (automotive)", 68, ("sa8295",)),
    Chip(42, "SM8475", "Snapdragon 8+ Gen 1", 69, ("8+gen1", "8plusgen1", "snapdragon8+gen1")),
    Chip(43, "SM8550", "Snapdragon 8 Gen 2", 73, ("8gen2", "snapdragon8gen2")),
    Chip(52, "SA8775P", "Snapdragon SA8775P (automotive)", 73, ("sa8775",)),
    Chip(57, "SM8650", "Snapdragon 8 Gen 3", 75, ("8gen3", "snapdragon8gen3")),
    Chip(60, "SC8380XP", "Snapdragon X Elite", 73, ("xelite", "snapdragonxelite", "x1e", "x1elite")),
    Chip(69, "SM8750", "Snapdragon 8 Elite", 79, ("8elite", "snapdragon8elite")),
    Chip(87, "SM8850", "Snapdragon 8 Elite Gen 5", 81, ("8elitegen5", "snapdragon8elitegen5")),
    Chip(88, "SC8480XP", "Snapdragon X2 Elite", 81, ("x2elite", "snapdragonx2elite", "x2e")),
)


def normalize_chip_name(name: str) -> str:
    """The form chip names are compared in: lower case, without spaces, ``-`` and ``_`` (``"X-Elite"`` ->
    ``"xelite"``)."""
    return re.sub(r"[\s_\-]+", "", name).lower()


@functools.cache
def _numbers_by_name() -> dict[str, int]:
    return {normalize_chip_name(name): chip.number for chip in CHIPS for name in chip.spellings}


def chip_number(name: str) -> int | None:
    """The QNN ``soc_model`` number of a chip name or alias (``"x-elite"`` -> ``60``), or None when no chip has
    that name. Case, spaces, ``-`` and ``_`` are ignored."""
    return _numbers_by_name().get(normalize_chip_name(name))


def soc_model(text: str) -> int:
    """The ``type`` of a ``--soc-model`` argument: a QNN SoC number (``60``) or a chip name (``SM8650``,
    ``SC8380XP``, ``x-elite``).

    Raises:
        argparse.ArgumentTypeError: ``text`` is neither a non-negative integer nor a chip name; the message names
            the accepted values.
    """
    value = text.strip()
    if value.isdecimal() and value.isascii():
        return int(value)
    number = chip_number(value)
    if number is None:
        accepted = ", ".join(chip.name for chip in CHIPS)
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a SoC; accepted: a non-negative QNN SoC number (e.g. 60) or a chip name: {accepted}"
        )
    return number
