"""ExportOptions validation."""

from __future__ import annotations

import attrs
import pytest

import qnnx_export as qe
from qnnx_export.errors import InvalidOptionsError, QnnxExportError


def test_defaults() -> None:
    """Defaults: opset 20, default pipeline, 2 GiB external-data threshold."""
    opts = qe.ExportOptions()
    assert opts.opset == 20
    assert opts.passes is None
    assert opts.external_data_threshold == 2 * 1024**3
    assert "tile_layernorm_broadcast" in opts.resolved_passes()


def test_keyword_only_and_frozen() -> None:
    """Options are keyword-only and immutable."""
    with pytest.raises(TypeError):
        qe.ExportOptions(21)  # type: ignore[misc]
    opts = qe.ExportOptions(opset=21)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        opts.opset = 22  # type: ignore[misc]


@pytest.mark.parametrize("opset", [19, 24, "20", True, 20.0])
def test_bad_opset(opset: object) -> None:
    """An opset outside [20, 23] or not an int is refused with a ValueError naming it."""
    with pytest.raises(InvalidOptionsError, match="opset") as info:
        qe.ExportOptions(opset=opset)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, QnnxExportError)


def test_bad_passes_reports_all() -> None:
    """Every unknown and duplicated pass name is reported at once, with the accepted names."""
    with pytest.raises(InvalidOptionsError) as info:
        qe.ExportOptions(passes=("nope", "fuse_erf_gelu", "fuse_erf_gelu", "also_nope"))
    msg = str(info.value)
    assert "nope" in msg and "also_nope" in msg and "duplicated" in msg and "tile_layernorm_broadcast" in msg


def test_passes_string_refused() -> None:
    """A bare string for passes is refused (it would be split into characters)."""
    with pytest.raises(InvalidOptionsError, match="tuple"):
        qe.ExportOptions(passes="fuse_erf_gelu")  # type: ignore[arg-type]


def test_passes_list_converted_to_tuple() -> None:
    """A list of pass names is accepted and stored as a tuple; () means no passes."""
    assert qe.ExportOptions(passes=["fuse_erf_gelu"]).passes == ("fuse_erf_gelu",)  # type: ignore[arg-type]
    assert qe.ExportOptions(passes=()).resolved_passes() == ()


@pytest.mark.parametrize("value", [-1, 1.5, None])
def test_bad_threshold(value: object) -> None:
    """A negative or non-int external_data_threshold is refused."""
    with pytest.raises(InvalidOptionsError, match="external_data_threshold"):
        qe.ExportOptions(external_data_threshold=value)  # type: ignore[arg-type]
