"""Which QNN ``OrtEpDevice`` serves which backend, and whether it is silicon: pure functions of the environment."""

from __future__ import annotations

from collections.abc import Sequence

from qnnx_detection._native import is_x86
from qnnx_detection._report import QnnDevice

#: PCI vendor id of Qualcomm (``onnxruntime.OrtDeviceVendorId.QUALCOMM``).
QUALCOMM_VENDOR_ID = 0x5143


def select_device(device: str, devices: Sequence[QnnDevice], machine: str) -> tuple[int | None, bool]:
    """Pick the QNN EP device for backend ``device`` and say whether it is the host simulator.

    Rules (onnxruntime-qnn 2.x): on Windows/Linux ARM64 the EP enumerates NPU and GPU devices with Qualcomm's vendor
    id; on x86_64 it enumerates one device of hardware type CPU, which is the HTP simulator inside libQnnHtp. The GPU
    backend has no simulator. When no GPU device is enumerated we still hand back a host device so the caller can
    try to initialize the GPU backend and report QNN's own reason for failing.

    Args:
        device: ``"npu"`` or ``"gpu"``.
        devices: QNN EP devices in the order ORT listed them.
        machine: ``platform.machine()`` of the host.

    Returns:
        ``(index into devices or None, is_simulator)``. ``is_simulator`` is True only for ``npu`` served by a host
        (CPU-type) device on an x86 machine.
    """
    wanted = "NPU" if device == "npu" else "GPU"
    for i, dev in enumerate(devices):
        if dev.hardware_type.upper() == wanted and dev.vendor_id == QUALCOMM_VENDOR_ID:
            return i, False
    for i, dev in enumerate(devices):
        if dev.hardware_type.upper() == "CPU":
            return i, device == "npu" and is_x86(machine)
    return None, False
