"""SoC names, numbers and resolve_soc_model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import qnnx_detection as qd
from qnnx_detection._soc import SOC_TABLE
from qnnx_detection.errors import InvalidSocModelError, QnnxDetectionError
from qnnx_detection.testing import FakeEnvironment, use_environment

REQUIRED = {"SM8450": 36, "SM8550": 43, "SM8650": 57, "SC8380XP": 60, "SM8750": 69, "SM8850": 87, "SC8480XP": 88}


@pytest.mark.parametrize(("name", "number"), sorted(REQUIRED.items()))
def test_required_chip_names_map_to_qnn_numbers(name: str, number: int) -> None:
    """Each chip name the contract lists resolves to QNN's number, in any letter case, and back."""
    assert qd.resolve_soc_model(name) == number
    assert qd.resolve_soc_model(name.lower()) == number
    assert qd.soc_name(number) == name


def test_friendly_aliases() -> None:
    """Marketing names and aliases resolve, ignoring case, spaces, dashes and underscores."""
    assert qd.resolve_soc_model("x-elite") == 60
    assert qd.resolve_soc_model("Snapdragon X Elite") == 60
    assert qd.resolve_soc_model("snapdragon_8_gen_3") == 57
    assert qd.resolve_soc_model("8 Elite") == 69


def test_ints_and_digit_strings_pass_through() -> None:
    """Any non-negative int and digit string is accepted as is, including numbers not in the table."""
    assert qd.resolve_soc_model(0) == 0
    assert qd.resolve_soc_model(" 60 ") == 60
    assert qd.resolve_soc_model(1234) == 1234
    assert qd.soc_name(1234) is None


@pytest.mark.parametrize("bad", [-1, "SM9999", "", "6O", True, 3.5, None.__class__])
def test_bad_values_raise_a_value_error_naming_value_and_choices(bad: object) -> None:
    """Bad SoC values raise InvalidSocModelError (a ValueError) naming the value and the accepted names."""
    with pytest.raises(InvalidSocModelError) as info:
        qd.resolve_soc_model(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, QnnxDetectionError)
    assert repr(bad) in str(info.value)
    assert "SC8380XP" in str(info.value)


def test_none_defaults_to_x_elite_on_the_simulator() -> None:
    """With no value and no QNNX_SOC_MODEL, an x86 host resolves to 60 (Snapdragon X Elite)."""
    assert qd.resolve_soc_model(None) == 60
    assert qd.DEFAULT_SOC_MODEL == 60


def test_none_reads_qnnx_soc_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """QNNX_SOC_MODEL (number or name) is the default when no value is given."""
    monkeypatch.setenv("QNNX_SOC_MODEL", "sm8650")
    assert qd.resolve_soc_model(None) == 57
    monkeypatch.setenv("QNNX_SOC_MODEL", "69")
    assert qd.resolve_soc_model() == 69


def test_invalid_qnnx_soc_model_raises_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid QNNX_SOC_MODEL makes resolve_soc_model(None) raise with the variable's name in the message."""
    monkeypatch.setenv("QNNX_SOC_MODEL", "banana")
    with pytest.raises(InvalidSocModelError, match="QNNX_SOC_MODEL='banana'"):
        qd.resolve_soc_model(None)


def test_none_uses_the_detected_chip_on_silicon() -> None:
    """On real Snapdragon hardware the detected SoC is the default, and QNNX_SOC_MODEL still wins."""
    with use_environment(FakeEnvironment.snapdragon(soc_model=57)):
        assert qd.resolve_soc_model(None) == 57
    with use_environment(FakeEnvironment.snapdragon(soc_model=57, environ={"QNNX_SOC_MODEL": "SM8750"})):
        assert qd.resolve_soc_model(None) == 69


def test_table_is_consistent() -> None:
    """SoC numbers and names are unique, no alias is all digits, and soc_info agrees with soc_name."""
    numbers = [s.number for s in SOC_TABLE]
    names = [s.name for s in SOC_TABLE]
    assert len(set(numbers)) == len(numbers)
    assert len(set(names)) == len(names)
    for soc in SOC_TABLE:
        # a pure-digit alias would be read as a soc_model number instead
        assert not any(alias.isdecimal() for alias in soc.aliases)
        assert qd.soc_info(soc.number) == soc
        assert qd.soc_name(soc.number) == soc.name


_known = st.sampled_from(SOC_TABLE)


@st.composite
def _respelled(draw: st.DrawFn) -> tuple[str, int]:
    soc = draw(_known)
    name = draw(st.sampled_from((soc.name, soc.marketing_name, *soc.aliases)))
    chars = [draw(st.sampled_from((c.lower(), c.upper()))) for c in name]
    sep = draw(st.sampled_from(("", "-", "_", " ")))
    return sep.join(chars) if draw(st.booleans()) else "".join(chars), soc.number


@given(_respelled())
def test_property_names_round_trip(case: tuple[str, int]) -> None:
    """Any spelling of a known chip (case, separators) resolves to its number, and the number back to its name."""
    text, number = case
    assert qd.resolve_soc_model(text) == number
    assert qd.resolve_soc_model(qd.soc_name(number)) == number  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=10**6))
def test_property_numbers_round_trip_through_strings(number: int) -> None:
    """Every non-negative int resolves to itself, as an int and as its decimal string."""
    assert qd.resolve_soc_model(number) == number
    assert qd.resolve_soc_model(str(number)) == number


@given(st.text(max_size=20))
def test_property_text_resolves_or_raises_value_error(text: str) -> None:
    """Arbitrary text either resolves to a non-negative int or raises InvalidSocModelError, never anything else."""
    try:
        number = qd.resolve_soc_model(text)
    except InvalidSocModelError:
        return
    assert isinstance(number, int)
    assert number >= 0
