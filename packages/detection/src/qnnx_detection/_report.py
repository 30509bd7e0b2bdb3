"""The frozen results of :func:`qnnx_detection.probe`."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from qnnx_detection._devices import normalize_device

#: Version of the dictionary layout produced by :meth:`ProbeReport.to_dict` and ``qnnx-detect --json``.
#: Bump it when a key is removed or changes meaning; adding keys keeps the number.
SCHEMA_VERSION = 1

#: QNN backends in the order the backend's device chain tries them.
QNN_DEVICES: tuple[str, ...] = ("npu", "gpu")


@attrs.frozen(kw_only=True)
class QnnDevice:
    """One ``OrtEpDevice`` that the QNN EP reported.

    Attributes:
        hardware_type: ``"NPU"``, ``"GPU"`` or ``"CPU"`` (on x86_64 the single ``"CPU"`` device is the HTP simulator).
        vendor: Vendor name ORT reports, e.g. ``"Qualcomm"`` or ``"Intel"``.
        vendor_id: PCI-style vendor id; Qualcomm is ``0x5143``.
        device_id: Vendor-specific device id.
    """

    hardware_type: str
    vendor: str = "Qualcomm"
    vendor_id: int = 0x5143
    device_id: int = 0


@attrs.frozen(kw_only=True)
class BackendStatus:
    """Whether one QNN backend can run graphs here.

    Attributes:
        device: ``"npu"`` (the HTP backend) or ``"gpu"`` (the Adreno GPU backend).
        available: True only when the backend initialized and prepared a tiny graph during the probe (or during an
            earlier process's probe, when ``reused``).
        reason: Why it is not available (None when available).
        library_path: Path of the QNN backend library (``libQnnHtp.so`` / ``QnnGpu.dll`` ...), when known.
        is_simulator: True when the backend is the x86_64 host simulator inside ``libQnnHtp``, not silicon.
        hardware_type: Hardware type of the QNN ``OrtEpDevice`` used (``"NPU"``, ``"GPU"``, ``"CPU"``), or None.
        soc_model: QNN ``soc_model`` number of the (real or simulated) SoC, when known.
        soc_name: Qualcomm part name of ``soc_model``, when known.
        htp_arch: HTP architecture (e.g. 73), for ``npu`` only, when known.
        soc_source: Where ``soc_model`` came from: ``"QNNX_SOC_MODEL"``, ``"detected"`` or ``"default"``.
        reused: True when ``available`` and ``reason`` are the verdict an earlier process reached by preparing the
            tiny graph, reused from the probe cache because nothing it depends on has changed (versions, native
            libraries, device, SoC, host, boot); False when this process decided.
    """

    device: str
    available: bool
    reason: str | None = None
    library_path: str | None = None
    is_simulator: bool = False
    hardware_type: str | None = None
    soc_model: int | None = None
    soc_name: str | None = None
    htp_arch: int | None = None
    soc_source: str | None = None
    reused: bool = False


@attrs.frozen(kw_only=True)
class Versions:
    """Versions of the software that decides what QNN can do (None: not installed or not reported).

    Attributes:
        onnxruntime: ``onnxruntime`` version.
        onnxruntime_qnn: ``onnxruntime-qnn`` package version.
        qairt: Version of the QAIRT/QNN SDK bundled in onnxruntime-qnn (``build_and_package_info.qnn_version``).
        python: Python version.
    """

    onnxruntime: str | None
    onnxruntime_qnn: str | None
    qairt: str | None
    python: str


@attrs.frozen(kw_only=True)
class PlatformInfo:
    """The host, as Python's :mod:`platform` reports it.

    Attributes:
        system: The operating system (``platform.system()``, e.g. ``"Linux"`` or ``"Windows"``).
        release: Its release (``platform.release()``).
        machine: The CPU architecture (``platform.machine()``, e.g. ``"x86_64"`` or ``"ARM64"``).
    """

    system: str
    release: str
    machine: str


@attrs.frozen(kw_only=True)
class Overrides:
    """Environment overrides, read once per probe from ``QNNX_DISABLE``, ``QNNX_DEVICE`` and ``QNNX_SOC_MODEL``.

    Attributes:
        disabled: QNN is treated as unavailable (``QNNX_DISABLE`` set to a true value, or to an invalid one).
        device: Forced device (``"npu"``, ``"gpu"`` or ``"cpu"``); None when unset or ``auto``.
        soc_model: SoC for the simulator / offline preparation; None when unset or invalid.
        raw_disable: ``QNNX_DISABLE`` as found (None when unset).
        raw_device: ``QNNX_DEVICE`` as found.
        raw_soc_model: ``QNNX_SOC_MODEL`` as found.
        problems: One message per invalid value.
    """

    disabled: bool = False
    device: Literal["npu", "gpu", "cpu"] | None = None
    soc_model: int | None = None
    raw_disable: str | None = None
    raw_device: str | None = None
    raw_soc_model: str | None = None
    problems: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class ProbeReport:
    """What QNN can do on this machine. Produced by :func:`qnnx_detection.probe`; never partial, never raised.

    Attributes:
        backends: One :class:`BackendStatus` per QNN backend, in chain order (npu, gpu).
        versions: Software versions.
        platform: The host.
        overrides: Environment overrides in effect.
        devices: The QNN ``OrtEpDevice`` entries ORT enumerated (empty if QNN could not be registered).
        problems: Everything that went wrong while probing or reading overrides, as human-readable lines.
        elapsed_s: Wall time the probe took, in seconds (0.0 for a fake environment).
        initialized: True when each backend was proven by preparing a tiny graph on it; False for a quick probe
            (``probe(initialize=False)``), where ``available`` means only that nothing known stands in the way
            (QNN installed and not disabled, EP registered, device enumerated, library present).
    """

    backends: tuple[BackendStatus, ...]
    versions: Versions
    platform: PlatformInfo
    overrides: Overrides
    devices: tuple[QnnDevice, ...] = ()
    problems: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    initialized: bool = True

    def backend(self, name: str) -> BackendStatus:
        """Return the status of backend ``name`` (``"npu"``/``"htp"`` or ``"gpu"``).

        Raises:
            InvalidDeviceError: ``name`` is not a QNN backend.
        """
        device = normalize_device(name, allowed=QNN_DEVICES)
        return next(b for b in self.backends if b.device == device)

    @property
    def usable_devices(self) -> tuple[str, ...]:
        """The QNN devices that are available, in chain order (a subset of ``("npu", "gpu")``)."""
        return tuple(b.device for b in self.backends if b.available)

    @property
    def any_available(self) -> bool:
        """True when at least one QNN accelerator is usable."""
        return bool(self.usable_devices)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict; its layout is documented in ``docs/detection.md`` (``schema_version`` 1)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "usable_devices": list(self.usable_devices),
            "backends": [attrs.asdict(b) for b in self.backends],
            "versions": attrs.asdict(self.versions),
            "platform": attrs.asdict(self.platform),
            "overrides": attrs.asdict(self.overrides, value_serializer=_listify),
            "devices": [attrs.asdict(d) for d in self.devices],
            "problems": list(self.problems),
            "elapsed_s": round(self.elapsed_s, 4),
            "initialized": self.initialized,
        }


def _listify(_inst: object, _field: object, value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
