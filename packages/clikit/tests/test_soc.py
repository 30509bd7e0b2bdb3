"""The chip table, chip names in any spelling, and the --soc-model argument type."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

import qnnx_clikit as clikit

_SEPARATORS = st.text(alphabet=" -_\t", max_size=2)
_SPELLINGS = st.sampled_from([(name, chip.number) for chip in clikit.CHIPS for name in chip.spellings])


@st.composite
def _respelled(draw: st.DrawFn) -> tuple[str, int]:
    """A chip name or alias in another letter case, with spaces, dashes and underscores anywhere, and its number."""
    name, number = draw(_SPELLINGS)
    chars = [c.upper() if draw(st.booleans()) else c.lower() for c in name]
    return "".join(draw(_SEPARATORS) + c for c in chars) + draw(_SEPARATORS), number


def _garbage(text: str) -> bool:
    value = text.strip()
    return not (value.isdecimal() and value.isascii()) and clikit.chip_number(text) is None


def _parser() -> clikit.Parser:
    parser = clikit.Parser(prog="tool")
    parser.add_argument("--soc-model", type=clikit.soc_model)
    return parser


@given(_respelled())
def test_every_chip_name_in_any_spelling_resolves_to_its_number(case: tuple[str, int]) -> None:
    """Case, spaces, dashes and underscores never change which chip a name means."""
    text, number = case
    assert clikit.chip_number(text) == number
    assert clikit.soc_model(text) == number
    assert _parser().parse_args([f"--soc-model={text}"]).soc_model == number


@given(st.integers(min_value=0), st.text(alphabet=" \t", max_size=2), st.text(alphabet=" \t", max_size=2))
def test_every_non_negative_integer_string_is_accepted(number: int, before: str, after: str) -> None:
    """Any non-negative number is a SoC, listed in the table or not (QNN knows more chips than the names here)."""
    assert clikit.soc_model(f"{before}{number}{after}") == number


@given(st.text(max_size=30).filter(_garbage))
def test_garbage_is_an_argparse_error_naming_the_accepted_values(text: str) -> None:
    """Anything else (a negative number, an unknown name, '') is refused with the numbers' form and every part
    name; under a Parser that is a UsageError naming the option."""
    with pytest.raises(argparse.ArgumentTypeError) as info:
        clikit.soc_model(text)
    message = str(info.value)
    assert repr(text) in message and "non-negative QNN SoC number" in message
    assert all(chip.name in message for chip in clikit.CHIPS)
    with pytest.raises(clikit.UsageError, match=r"argument --soc-model: .* is not a SoC; accepted: "):
        _parser().parse_args([f"--soc-model={text}"])


@pytest.mark.parametrize(("text", "number"), [("SC8380XP", 60), ("x-elite", 60), ("Snapdragon 8 Gen 3", 57),
                                              ("snapdragon_8+_gen_1", 42), (" 60 ", 60), ("0", 0), ("1234", 1234)])  # fmt: skip
def test_examples(text: str, number: int) -> None:
    assert clikit.soc_model(text) == number


@pytest.mark.parametrize("text", ["-3", "SM9999", "", "  ", "6O", "٣"])
def test_refused_examples(text: str) -> None:
    """A negative number, an unknown part, nothing, a letter O for a zero, a non-ASCII digit."""
    with pytest.raises(argparse.ArgumentTypeError, match="is not a SoC"):
        clikit.soc_model(text)


def test_the_table_has_one_number_and_one_meaning_per_name() -> None:
    """Numbers are unique, and no spelling of one chip reads as a spelling of another."""
    numbers = [chip.number for chip in clikit.CHIPS]
    assert len(set(numbers)) == len(numbers) == 11
    owners: dict[str, int] = {}
    for chip in clikit.CHIPS:
        for name in chip.spellings:
            assert owners.setdefault(clikit.normalize_chip_name(name), chip.number) == chip.number, name
    assert clikit.CHIPS[7] == clikit.Chip(60, "SC8380XP", "Snapdragon X Elite", 73, ("xelite", "snapdragonxelite",
                                                                                      "x1e", "x1elite"))  # fmt: skip
    assert clikit.CHIPS[7].spellings[:2] == ("SC8380XP", "Snapdragon X Elite")


def test_normalize_chip_name() -> None:
    assert clikit.normalize_chip_name(" Snapdragon X-Elite_ ") == "snapdragonxelite"
    assert clikit.normalize_chip_name("8+ Gen 1") == "8+gen1"
