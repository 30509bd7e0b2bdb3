"""Fakes for tests of code that depends on qnnx_detection (the backend's device chain, CLIs, ...).

Example:
    >>> import qnnx_detection as qd
    >>> from qnnx_detection.testing import FakeEnvironment, use_environment
    >>> with use_environment(FakeEnvironment.snapdragon(soc_model=57)):
    ...     qd.probe().usable_devices
    ('npu', 'gpu')
    >>> with use_environment(FakeEnvironment.without_qnn()):
    ...     qd.is_available()
    False

Inside :func:`use_environment`, :func:`qnnx_detection.probe`, :func:`~qnnx_detection.is_available`,
:func:`~qnnx_detection.resolve_soc_model` and :func:`~qnnx_detection.resolve_device` answer from the fake, through
the same decision logic as on real hardware. Functions that need real ONNX Runtime objects (``register_ep``,
``find_ep_device``, ``create_session``) are not faked.

Seam for counting registrations: :func:`qnnx_detection.register_ep` calls
``onnxruntime.register_execution_provider_library`` through the module attribute at call time, so a test may wrap
that attribute with a counting spy (in a fresh process, before the first registration).
"""

from __future__ import annotations

import contextlib
import platform
import threading
import types
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import attrs

from qnnx_detection._probe import set_environment
from qnnx_detection._report import PlatformInfo, QnnDevice, Versions

__all__ = ["CANNOT_INITIALIZE", "FakeEnvironment", "QnnDevice", "use_environment"]

#: Native error text QNN logs when a backend cannot initialize (the GPU backend on x86_64, onnxruntime-qnn 2.7.0).
CANNOT_INITIALIZE = (
    "QNN SetupBackend failed Failed to initialize backend (backend). "
    "Error: QNN_BACKEND_ERROR_CANNOT_INITIALIZE: Backend failed to initialize"
)

_INTEL_CPU = QnnDevice(hardware_type="CPU", vendor="Intel", vendor_id=0x8086)


def _device_tuple(value: Iterable[QnnDevice]) -> tuple[QnnDevice, ...]:
    return tuple(value)


def _frozen_mapping(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return types.MappingProxyType(dict(value or {}))


@attrs.frozen(kw_only=True)
class FakeEnvironment:
    """A machine as :func:`qnnx_detection.probe` sees it. The defaults describe this x86_64 test bench.

    Attributes:
        system: ``platform.system()``, e.g. ``"Linux"`` or ``"Windows"``.
        release: ``platform.release()``.
        machine: CPU architecture, e.g. ``"x86_64"``, ``"ARM64"``, ``"aarch64"``.
        python: Python version to report.
        onnxruntime: onnxruntime version, or None when it is not installed.
        onnxruntime_qnn: onnxruntime-qnn version, or None when it is not installed.
        qairt: Bundled QAIRT version.
        import_error: When set, onnxruntime-qnn is installed but importing it fails with this message.
        registration_error: When set, registering the EP library fails with this message.
        devices: QNN EP devices ORT enumerates (x86_64: one CPU-type device, the HTP simulator).
        libraries: Backends whose library file is present (``"npu"``, ``"gpu"``).
        init_failures: Native error text per backend whose initialization fails; other backends initialize.
        host_soc: QNN ``soc_model`` of the Snapdragon the machine runs on (ignored on x86).
        environ: Environment variables the probe reads (only these: the real ``os.environ`` is not consulted).
        library_dir: Directory the backend libraries live in.
        probe_cache: Folder of the probe cache (verdicts kept across probes); None (default): fakes keep none.
        boot_id: Identity of the current boot (None: the host has none, so no verdict is kept).
        library_stamp: Stands for the native libraries' sizes and times: change it to model a reinstall or another
            build of the same versions.
    """

    system: str = "Linux"
    release: str = "6.8.0"
    machine: str = "x86_64"
    python: str = attrs.field(factory=platform.python_version)
    onnxruntime: str | None = "1.32.0"
    onnxruntime_qnn: str | None = "2.7.0"
    qairt: str | None = "2.51.0"
    import_error: str | None = None
    registration_error: str | None = None
    devices: tuple[QnnDevice, ...] = attrs.field(default=(_INTEL_CPU,), converter=_device_tuple)
    libraries: frozenset[str] = attrs.field(default=frozenset({"npu", "gpu"}), converter=frozenset)
    init_failures: Mapping[str, str] = attrs.field(
        factory=lambda: {"gpu": CANNOT_INITIALIZE}, converter=_frozen_mapping, hash=False
    )
    host_soc: int | None = None
    environ: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_mapping, hash=False)
    library_dir: str = "/fake/site-packages/onnxruntime_qnn"
    probe_cache: str | None = None
    boot_id: str | None = "fake-boot-1"
    library_stamp: str = "1"

    @classmethod
    def host_simulator(cls, *, environ: Mapping[str, str] | None = None) -> FakeEnvironment:
        """This test bench: Linux x86_64, HTP simulator usable, GPU backend cannot initialize."""
        return cls(environ=environ or {})

    @classmethod
    def snapdragon(
        cls,
        *,
        soc_model: int = 60,
        gpu: bool = True,
        system: str = "Windows",
        environ: Mapping[str, str] | None = None,
    ) -> FakeEnvironment:
        """Real Snapdragon silicon (default: a Windows on Snapdragon X Elite laptop).

        Args:
            soc_model: QNN number of the chip the machine runs on.
            gpu: Whether the GPU backend initializes; when False the GPU is enumerated but its backend fails
                (``QNN_BACKEND_ERROR_CANNOT_INITIALIZE``, as with a missing Adreno driver).
            system: ``"Windows"`` (machine ``ARM64``) or ``"Linux"`` (machine ``aarch64``).
            environ: QNNX_* variables.
        """
        return cls(
            system=system,
            release="11" if system == "Windows" else "6.8.0",
            machine="ARM64" if system == "Windows" else "aarch64",
            devices=(QnnDevice(hardware_type="NPU"), QnnDevice(hardware_type="GPU")),
            init_failures={} if gpu else {"gpu": CANNOT_INITIALIZE},
            host_soc=soc_model,
            environ=environ or {},
            library_dir="C:\\fake\\onnxruntime_qnn" if system == "Windows" else "/fake/onnxruntime_qnn",
        )

    @classmethod
    def without_qnn(cls, *, environ: Mapping[str, str] | None = None) -> FakeEnvironment:
        """onnxruntime is installed, onnxruntime-qnn is not."""
        return cls(onnxruntime_qnn=None, qairt=None, devices=(), libraries=frozenset(), environ=environ or {})

    def library_path(self, device: str) -> str:
        """Where this fake keeps the backend library of ``device``."""
        windows = self.system == "Windows"
        name = {"npu": "QnnHtp", "gpu": "QnnGpu"}[device]
        file = f"{name}.dll" if windows else f"lib{name}.so"
        separator = "\\" if windows else "/"
        return f"{self.library_dir}{separator}{file}"


class _FakeAdapter:
    """Implements the probe's Environment protocol from a FakeEnvironment."""

    def __init__(self, fake: FakeEnvironment) -> None:
        self._fake = fake

    def environ(self) -> Mapping[str, str]:
        return self._fake.environ

    def platform(self) -> PlatformInfo:
        return PlatformInfo(system=self._fake.system, release=self._fake.release, machine=self._fake.machine)

    def versions(self) -> Versions:
        f = self._fake
        installed = f.onnxruntime_qnn is not None
        return Versions(
            onnxruntime=f.onnxruntime,
            onnxruntime_qnn=f.onnxruntime_qnn,
            qairt=f.qairt if installed else None,
            python=f.python,
        )

    def qnn_problem(self) -> str | None:
        f = self._fake
        if f.onnxruntime is None:
            return "onnxruntime cannot be imported (No module named 'onnxruntime'); install it with: pip install onnxruntime-qnn"
        if f.onnxruntime_qnn is None:
            return (
                "onnxruntime-qnn cannot be imported (No module named 'onnxruntime_qnn'); "
                "install it with: pip install 'onnxruntime-qnn>=2.4,<2.8'"
            )
        if f.import_error is not None:
            return f"onnxruntime-qnn is installed but fails to import: {f.import_error}; reinstall it"
        return None

    def register(self) -> None:
        if self._fake.registration_error is not None:
            raise RuntimeError(self._fake.registration_error)

    def devices(self) -> tuple[QnnDevice, ...]:
        return self._fake.devices

    def library_path(self, device: str) -> str | None:
        return self._fake.library_path(device)

    def library_exists(self, path: str) -> bool:
        return any(self._fake.library_path(d) == path for d in self._fake.libraries)

    def host_soc(self) -> int | None:
        return self._fake.host_soc

    def try_init(self, device: str, index: int, soc_model: int) -> str | None:
        from qnnx_detection._native import explain_failure

        failure = self._fake.init_failures.get(device)
        if failure is None:
            return None
        return explain_failure(device, failure, failure, machine=self._fake.machine)

    def probe_cache(self) -> Path | None:
        return Path(self._fake.probe_cache) if self._fake.probe_cache is not None else None

    def boot_id(self) -> str | None:
        return self._fake.boot_id

    def library_identity(self, device: str) -> tuple[str, ...]:
        f = self._fake
        return (f"{f.library_path(device)}|{f.onnxruntime_qnn}|{f.library_stamp}", f"onnxruntime|{f.onnxruntime}")


_use_lock = threading.Lock()


@contextlib.contextmanager
def use_environment(env: FakeEnvironment) -> Iterator[FakeEnvironment]:
    """Make :func:`qnnx_detection.probe` and friends answer from ``env`` inside the block, in every thread.

    Nesting works (the inner fake wins, the outer one is restored). The real cached report is untouched.
    """
    if not isinstance(env, FakeEnvironment):
        raise TypeError(f"use_environment() needs a FakeEnvironment, not {type(env).__name__}")
    with _use_lock:
        previous = set_environment(_FakeAdapter(env))
    try:
        yield env
    finally:
        with _use_lock:
            set_environment(previous)
