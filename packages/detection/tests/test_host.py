"""Detecting the Snapdragon the process runs on, from sysfs/device-tree text and Windows brand strings."""

from __future__ import annotations

from pathlib import Path

from qnnx_detection._host import brand_candidates, detect_host_soc, linux_candidates, soc_from_candidates


def test_x86_never_detects_a_soc() -> None:
    """On x86 hosts nothing is read: the HTP there is always the simulator."""
    assert detect_host_soc("Linux", "x86_64") is None
    assert detect_host_soc("Windows", "AMD64") is None


def test_linux_sources(tmp_path: Path) -> None:
    """soc0/machine and NUL-separated device-tree compatible lists yield the chip; missing files are skipped."""
    machine = tmp_path / "machine"
    machine.write_text("SM8650\n")
    compatible = tmp_path / "compatible"
    compatible.write_bytes(b"qcom,x1e80100-crd\x00qcom,x1e80100\x00")
    missing = tmp_path / "nope"
    assert soc_from_candidates(linux_candidates([missing, machine])) == 57
    assert soc_from_candidates(linux_candidates([compatible])) == 60
    assert soc_from_candidates(linux_candidates([missing])) is None


def test_windows_brand_strings() -> None:
    """Windows processor brand strings of X Elite and X2 Elite machines map to 60 and 88; others to nothing."""
    assert soc_from_candidates(brand_candidates("Snapdragon(R) X Elite - X1E78100 - Qualcomm(R) Oryon(TM) CPU")) == 60
    assert soc_from_candidates(brand_candidates("Snapdragon(R) X2 Elite Extreme - X2E94100")) == 88
    assert soc_from_candidates(brand_candidates("Intel(R) Core(TM) i7-1185G7")) is None
