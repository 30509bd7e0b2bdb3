"""QNNX_* environment overrides: parsing, report, resolve_device."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import qnnx_detection as qd
from qnnx_detection._overrides import parse_overrides
from qnnx_detection.errors import InvalidDeviceError
from qnnx_detection.testing import FakeEnvironment, use_environment


def test_unset_means_no_override() -> None:
    """An empty environment yields no overrides and no problems."""
    o = parse_overrides({})
    assert o == qd.Overrides()


@pytest.mark.parametrize(("raw", "disabled"), [("1", True), ("TRUE", True), ("on", True), ("0", False), ("", False)])
def test_disable_values(raw: str, disabled: bool) -> None:
    """QNNX_DISABLE accepts the usual boolean spellings."""
    o = parse_overrides({"QNNX_DISABLE": raw})
    assert o.disabled is disabled
    assert o.problems == ()
    assert o.raw_disable == raw


def test_invalid_disable_counts_as_disabled_and_is_reported() -> None:
    """An unrecognised QNNX_DISABLE disables QNN (the user wanted it off) and is listed as a problem."""
    o = parse_overrides({"QNNX_DISABLE": "please"})
    assert o.disabled
    assert len(o.problems) == 1
    assert "QNNX_DISABLE='please'" in o.problems[0]


@pytest.mark.parametrize(
    ("raw", "device"), [("npu", "npu"), ("HTP", "npu"), ("gpu", "gpu"), ("cpu", "cpu"), ("auto", None)]
)
def test_device_values(raw: str, device: str | None) -> None:
    """QNNX_DEVICE accepts npu/htp/gpu/cpu/auto; auto means no forced device."""
    o = parse_overrides({"QNNX_DEVICE": raw})
    assert o.device == device
    assert o.problems == ()


def test_all_invalid_values_are_reported_together() -> None:
    """Every invalid variable gets its own problem line (aggregated, not first-only)."""
    o = parse_overrides({"QNNX_DISABLE": "maybe", "QNNX_DEVICE": "tpu", "QNNX_SOC_MODEL": "SM1"})
    assert len(o.problems) == 3
    assert o.device is None
    assert o.soc_model is None
    text = " ".join(o.problems)
    for fragment in ("QNNX_DISABLE='maybe'", "QNNX_DEVICE='tpu'", "QNNX_SOC_MODEL='SM1'"):
        assert fragment in text


def test_report_shows_overrides_and_problems() -> None:
    """probe() carries the overrides and their problems; QNNX_SOC_MODEL sets the simulated SoC."""
    env = {"QNNX_DEVICE": "npu", "QNNX_SOC_MODEL": "SM8650"}
    with use_environment(FakeEnvironment.host_simulator(environ=env)):
        report = qd.probe()
    assert report.overrides.device == "npu"
    assert report.overrides.soc_model == 57
    npu = report.backend("npu")
    assert (npu.soc_model, npu.soc_name, npu.htp_arch, npu.soc_source) == (57, "SM8650", 75, "QNNX_SOC_MODEL")
    with use_environment(FakeEnvironment.host_simulator(environ={"QNNX_SOC_MODEL": "nope"})):
        report = qd.probe()
    assert report.backend("npu").soc_model == 60
    assert any("QNNX_SOC_MODEL='nope'" in p for p in report.problems)


def test_disable_makes_every_backend_unavailable_with_the_variable_named() -> None:
    """QNNX_DISABLE=1: nothing available and each reason names the variable."""
    with use_environment(FakeEnvironment.snapdragon(environ={"QNNX_DISABLE": "1"})):
        report = qd.probe()
        assert not qd.is_available()
        assert qd.is_available("cpu")
    assert report.usable_devices == ()
    assert all("QNNX_DISABLE" in (b.reason or "") for b in report.backends)


def test_resolve_device() -> None:
    """resolve_device normalises names, defaults to QNNX_DEVICE then 'auto', and rejects unknown names."""
    assert qd.resolve_device("HTP") == "npu"
    assert qd.resolve_device(None) == "auto"
    with use_environment(FakeEnvironment(environ={"QNNX_DEVICE": "gpu"})):
        assert qd.resolve_device() == "gpu"
    with (
        use_environment(FakeEnvironment(environ={"QNNX_DEVICE": "tpu"})),
        pytest.raises(InvalidDeviceError, match="QNNX_DEVICE='tpu'"),
    ):
        qd.resolve_device()
    with pytest.raises(InvalidDeviceError, match="'npu', 'gpu', 'cpu', 'auto'"):
        qd.resolve_device("tpu")


_values = st.one_of(st.text(max_size=12), st.sampled_from(["1", "0", "npu", "gpu", "cpu", "auto", "60", "SM8650"]))


@given(st.dictionaries(st.sampled_from(["QNNX_DISABLE", "QNNX_DEVICE", "QNNX_SOC_MODEL", "OTHER"]), _values))
def test_property_parse_never_raises_and_keeps_raw_values(environ: dict[str, str]) -> None:
    """Any environment parses without raising; raw values are kept verbatim; parsed values are valid."""
    o = parse_overrides(environ)
    assert o.raw_disable == environ.get("QNNX_DISABLE")
    assert o.raw_device == environ.get("QNNX_DEVICE")
    assert o.raw_soc_model == environ.get("QNNX_SOC_MODEL")
    assert o.device in (None, "npu", "gpu", "cpu")
    assert o.soc_model is None or o.soc_model >= 0
