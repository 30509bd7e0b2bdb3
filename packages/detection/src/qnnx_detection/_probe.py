"""The probe: what QNN can do here, computed once per process from a (real or fake) environment."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from qnnx_detection._devices import normalize_device
from qnnx_detection._ep import (
    backend_library,
    checked_provider_options,
    checked_session_config,
    create_session_on,
    import_qnn,
    qnn_ep_devices,
    register_ep,
    to_qnn_device,
)
from qnnx_detection._host import detect_host_soc
from qnnx_detection._native import is_x86
from qnnx_detection._overrides import ENV_DEVICE, ENV_DISABLE, ENV_SOC_MODEL, parse_overrides, probe_cache_root
from qnnx_detection._report import QNN_DEVICES, BackendStatus, Overrides, PlatformInfo, ProbeReport, QnnDevice, Versions
from qnnx_detection._selection import select_device
from qnnx_detection._soc import DEFAULT_SOC_MODEL, htp_arch, parse_soc_model, soc_name
from qnnx_detection._tiny_model import tiny_add_model
from qnnx_detection._verdicts import (
    VerdictStore,
    file_identity,
    folder_identity,
    host_boot_id,
    key_material,
    loader_environment,
)
from qnnx_detection._version import __version__
from qnnx_detection.errors import SessionCreationError

logger = logging.getLogger(__name__)


class Environment(Protocol):
    """What the probe asks of the world. The host implements it for real; ``testing.FakeEnvironment`` fakes it."""

    def environ(self) -> Mapping[str, str]: ...
    def platform(self) -> PlatformInfo: ...
    def versions(self) -> Versions: ...
    def qnn_problem(self) -> str | None: ...
    def register(self) -> None: ...
    def devices(self) -> tuple[QnnDevice, ...]: ...
    def library_path(self, device: str) -> str | None: ...
    def library_exists(self, path: str) -> bool: ...
    def host_soc(self) -> int | None: ...
    def try_init(self, device: str, index: int, soc_model: int) -> str | None: ...
    def probe_cache(self) -> Path | None: ...
    def boot_id(self) -> str | None: ...
    def library_identity(self, device: str) -> tuple[str, ...]: ...


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class HostEnvironment:
    """The real machine."""

    def __init__(self) -> None:
        self._ep_devices: list[Any] = []

    def environ(self) -> Mapping[str, str]:
        return os.environ

    def platform(self) -> PlatformInfo:
        return PlatformInfo(system=platform.system(), release=platform.release(), machine=platform.machine())

    def versions(self) -> Versions:
        # Read from distribution metadata, not by importing onnxruntime: QNNX_DISABLE=1 must load no native code
        # (it is the escape hatch when a native library misbehaves), and the import costs ~0.2 s.
        ort_version = _dist_version("onnxruntime")
        if ort_version is None and "onnxruntime" in sys.modules:  # a differently named build (nightly, source)
            ort_version = str(getattr(sys.modules["onnxruntime"], "__version__", "")) or None
        qnn_version = _dist_version("onnxruntime-qnn")
        qairt = None
        try:
            # Pure-Python module in 2.4-2.7 holding the bundled QAIRT SDK version (qnn_version = "2.51.0" in 2.7.0).
            from onnxruntime_qnn import build_and_package_info

            qairt = str(getattr(build_and_package_info, "qnn_version", "")) or None
            qnn_version = qnn_version or str(getattr(build_and_package_info, "__version__", "")) or None
        except Exception:
            logger.debug("onnxruntime_qnn.build_and_package_info is unavailable", exc_info=True)
        return Versions(
            onnxruntime=ort_version,
            onnxruntime_qnn=qnn_version,
            qairt=qairt,
            python=platform.python_version(),
        )

    def qnn_problem(self) -> str | None:
        try:
            import_qnn()
        except ImportError as exc:
            return str(exc)
        except Exception as exc:  # a broken install raises anything (OSError from a bad .so, AttributeError, ...)
            return f"onnxruntime-qnn is installed but fails to import: {exc!r}; reinstall it"
        return None

    def register(self) -> None:
        register_ep()

    def devices(self) -> tuple[QnnDevice, ...]:
        self._ep_devices = qnn_ep_devices()
        return tuple(to_qnn_device(d) for d in self._ep_devices)

    def library_path(self, device: str) -> str | None:
        return backend_library(device)

    def library_exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def host_soc(self) -> int | None:
        return detect_host_soc(platform.system(), platform.machine())

    def try_init(self, device: str, index: int, soc_model: int) -> str | None:
        options = checked_provider_options(device, backend_library(device), soc_model, None)
        try:
            ort, _ = import_qnn()
            session = create_session_on(
                tiny_add_model(),
                device,
                self._ep_devices[index],
                options,
                checked_session_config(None, False),
                ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                single_threaded=True,
            )
        except SessionCreationError as exc:
            return exc.cause
        del session
        return None

    def probe_cache(self) -> Path | None:
        return probe_cache_root(os.environ)

    def boot_id(self) -> str | None:
        return host_boot_id(platform.system())

    def library_identity(self, device: str) -> tuple[str, ...]:
        # Every native library of onnxruntime-qnn (the EP, the QNN backends, HTP stubs and skels live in one folder)
        # and onnxruntime's own extension module: a reinstall or another build changes a size or a time.
        _, oq = import_qnn()
        ort_native = sys.modules.get("onnxruntime.capi.onnxruntime_pybind11_state")
        ort_file = str(getattr(ort_native, "__file__", "") or "onnxruntime|not-loaded")
        folders = sorted({os.path.dirname(oq.get_library_path()), os.path.dirname(backend_library(device))})
        return (file_identity(ort_file), *(i for f in folders for i in folder_identity(f)))


_active_lock = threading.Lock()
_active_override: Environment | None = None


def set_environment(env: Environment | None) -> Environment | None:
    """Make ``probe()`` answer from ``env`` (None: the real host). Returns the previous override."""
    global _active_override
    with _active_lock:
        previous, _active_override = _active_override, env
        return previous


def active_environment() -> tuple[Environment, bool]:
    """Return ``(environment, is_fake)``."""
    env = _active_override
    return (env, True) if env is not None else (HostEnvironment(), False)


def _guard(problems: list[str], what: str, fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        problems.append(f"{what} failed: {exc}")
        logger.debug("%s failed", what, exc_info=True)
        return default


def _soc_choice(overrides: Overrides, host_soc: int | None) -> tuple[int, str]:
    if overrides.soc_model is not None:
        return overrides.soc_model, ENV_SOC_MODEL
    if host_soc is not None:
        return host_soc, "detected"
    return DEFAULT_SOC_MODEL, "default"


def build_report(env: Environment, *, initialize: bool = True, reuse_verdicts: bool = True) -> ProbeReport:
    """Ask ``env`` everything the report needs and decide availability. Never raises.

    With ``initialize=False`` no backend is initialized (no tiny graph is prepared): the report is cheap, and
    ``available`` only says that nothing known stands in the way. With ``initialize=True`` each backend's verdict
    is read from the probe cache when an earlier process reached it under the same conditions (``reuse_verdicts``),
    else the tiny graph is prepared and its verdict recorded there (see :mod:`qnnx_detection._verdicts`).
    """
    problems: list[str] = []
    unknown_platform = PlatformInfo(system="unknown", release="", machine="unknown")
    environ = _guard(problems, "reading the environment", env.environ, {})
    overrides = _guard(problems, "reading QNNX_* variables", lambda: parse_overrides(environ), Overrides())
    problems.extend(overrides.problems)
    plat = _guard(problems, "reading the platform", env.platform, unknown_platform)
    versions = _guard(
        problems,
        "reading versions",
        env.versions,
        Versions(onnxruntime=None, onnxruntime_qnn=None, qairt=None, python=platform.python_version()),
    )
    x86 = is_x86(plat.machine)
    host_soc = None if x86 else _guard(problems, "detecting the SoC", env.host_soc, None)
    soc_model, soc_source = _soc_choice(overrides, host_soc)

    if overrides.disabled:
        # Decided before importing anything: disabling must not load onnxruntime's native libraries.
        qnn_problem = None
        blocked = f"QNN is disabled by {ENV_DISABLE}={overrides.raw_disable!r}; unset it to use QNN"
    else:
        qnn_problem = _guard(
            problems, "importing onnxruntime-qnn", env.qnn_problem, "onnxruntime-qnn could not be checked"
        )
        blocked = qnn_problem
    devices: tuple[QnnDevice, ...] = ()
    if blocked is None:
        try:
            env.register()
            devices = tuple(env.devices())
        except Exception as exc:
            blocked = f"the QNN execution provider could not be registered: {exc}"
    if blocked is not None and blocked not in problems:
        problems.append(blocked)

    backends: list[BackendStatus] = []
    for device in QNN_DEVICES:
        path = None
        if qnn_problem is None and not overrides.disabled:
            path = _guard(problems, f"locating the {device} library", lambda d=device: env.library_path(d), None)
        index, is_sim = select_device(device, devices, plat.machine)
        if index is None:
            # Without enumerated devices, say what the hardware would be: on x86 the NPU can only be the simulator.
            is_sim = device == "npu" and x86
        if device == "npu":
            fields: dict[str, Any] = {
                "soc_model": soc_model,
                "soc_name": soc_name(soc_model),
                "htp_arch": htp_arch(soc_model),
                "soc_source": soc_source,
            }
        elif host_soc is not None:
            fields = {"soc_model": host_soc, "soc_name": soc_name(host_soc), "soc_source": "detected"}
        else:
            fields = {}
        reason = blocked
        if reason is None and path is None:
            reason = f"the location of the QNN {device} backend library is unknown"
        if reason is None and not _guard(problems, "checking a library", lambda p=path: env.library_exists(p), False):
            reason = f"the QNN {device} backend library {path} is not installed"
        if reason is None and index is None:
            kind = "NPU" if device == "npu" else "GPU"
            reason = f"ONNX Runtime enumerated no QNN {kind} device on this {plat.system} {plat.machine} machine"
        reused = False
        if reason is None and index is not None and initialize:
            reason, reused = _initialize(
                env,
                problems,
                _VerdictQuestion(device, index, soc_model, devices[index], plat, versions, environ),
                reuse=reuse_verdicts,
            )
        backends.append(
            BackendStatus(
                device=device,
                available=reason is None,
                reason=reason,
                library_path=path,
                is_simulator=is_sim,
                hardware_type=devices[index].hardware_type if index is not None else None,
                reused=reused,
                **fields,
            )
        )

    report = ProbeReport(
        backends=tuple(backends),
        versions=versions,
        platform=plat,
        overrides=overrides,
        devices=devices,
        problems=tuple(problems),
        initialized=initialize,
    )
    if overrides.device in QNN_DEVICES and overrides.device not in report.usable_devices:
        note = f"{ENV_DEVICE}={overrides.raw_device!r} forces {overrides.device}, which is not available here"
        report = attrs.evolve(report, problems=(*report.problems, note))
    return report


@attrs.frozen
class _VerdictQuestion:
    """Whether ``device`` initializes: what :func:`_initialize` needs to ask the environment or the probe cache."""

    device: str
    index: int
    soc_model: int
    ep_device: QnnDevice
    platform: PlatformInfo
    versions: Versions
    environ: Mapping[str, str]


def _initialize(env: Environment, problems: list[str], q: _VerdictQuestion, *, reuse: bool) -> tuple[str | None, bool]:
    """``(reason or None, reused)``: the probe cache's verdict for ``q`` if it has one, else ``env.try_init``'s,
    which is then recorded. An initialization that raised is reported and never recorded."""
    store, material = None, None
    try:
        root = env.probe_cache()
        boot = env.boot_id() if root is not None else None
        if root is not None and boot is not None:
            store = VerdictStore(root)
            material = key_material(
                detection_version=__version__,
                platform_info=attrs.asdict(q.platform),
                versions=attrs.asdict(q.versions),
                boot=boot,
                libraries=env.library_identity(q.device),
                loader_env=loader_environment(q.environ, q.platform.system),
                device=q.device,
                ep_device=attrs.asdict(q.ep_device),
                soc_model=q.soc_model,
            )
    except Exception:  # the cache only saves time: without it, the backend is simply initialized
        logger.debug("probe cache unavailable for %s", q.device, exc_info=True)
        store = None
    if store is not None and material is not None and reuse:
        verdict = store.get(material)
        if verdict is not None:
            logger.debug("probe cache: %s verdict from %.0f s ago reused: %s", q.device, verdict.age_s, verdict.reason)
            return verdict.reason, True
    try:
        reason = env.try_init(q.device, q.index, q.soc_model)
    except Exception as exc:
        problems.append(f"initializing the {q.device} backend failed: {exc}")
        logger.debug("initializing the %s backend failed", q.device, exc_info=True)
        return f"initializing the {q.device} backend raised unexpectedly", False
    if store is not None and material is not None:
        store.put(material, reason)
    return reason, False


_probe_lock = threading.Lock()
_cached: dict[bool, ProbeReport] = {}


def _safe_build(env: Environment, initialize: bool = True, refresh: bool = False) -> tuple[ProbeReport, float]:
    start = time.perf_counter()
    try:
        report = build_report(env, initialize=initialize, reuse_verdicts=not refresh)
    except Exception as exc:  # last line of defence: probe() must never raise
        logger.debug("probe failed", exc_info=True)
        status = tuple(
            BackendStatus(device=d, available=False, reason=f"probing failed unexpectedly: {exc!r}")
            for d in QNN_DEVICES
        )
        report = ProbeReport(
            backends=status,
            versions=Versions(onnxruntime=None, onnxruntime_qnn=None, qairt=None, python=platform.python_version()),
            platform=PlatformInfo(system=platform.system(), release=platform.release(), machine=platform.machine()),
            overrides=Overrides(),
            problems=(f"probing failed unexpectedly: {exc!r}",),
            initialized=initialize,
        )
    return report, time.perf_counter() - start


def probe(*, refresh: bool = False, initialize: bool = True) -> ProbeReport:
    """Report what QNN can do on this machine. Cached per process, thread-safe, never raises.

    The first call registers the QNN EP and prepares a tiny graph on each backend (about 0.3 s of the 0.45 s a
    first probe takes on the x86_64 simulator bench); later calls return the cached report. Each backend's verdict
    is also kept on disk (the probe cache, ``QNNX_PROBE_CACHE_DIR`` or the per-user cache folder; ``QNNX_PROBE_CACHE=0``
    turns it off): a later process reuses it instead of preparing the graph again while the versions, native
    libraries, device, SoC, host and boot are the same, for at most a day (an hour for "not usable");
    ``BackendStatus.reused`` says so. Concurrent first calls wait for one probe. Inside
    ``qnnx_detection.testing.use_environment`` it answers from the fake instead (not cached in the process).

    Args:
        refresh: Probe again instead of returning the cached report (environment variables are re-read too), and
            prepare the tiny graphs again instead of reusing the probe cache's verdicts (which are then replaced).
        initialize: False gives a quick report (cached separately) that initializes no backend: for callers that
            are about to create a real session anyway and get the true cause from its failure. A full report, once
            made, also answers quick calls.
    """
    env, fake = active_environment()
    if fake:
        report, _ = _safe_build(env, initialize, refresh)
        return report
    for key in (True,) if initialize else (True, False):
        cached = _cached.get(key)
        if cached is not None and not refresh:
            return cached
    with _probe_lock:
        cached = _cached.get(initialize)
        if cached is not None and not refresh:
            return cached
        report, elapsed = _safe_build(env, initialize, refresh)
        report = attrs.evolve(report, elapsed_s=elapsed)
        logger.debug("QNN probe (initialize=%s) took %.3f s: usable=%s", initialize, elapsed, report.usable_devices)
        _cached[initialize] = report
        if refresh:
            _cached.pop(not initialize, None)
        return report


def is_available(device: str | None = None) -> bool:
    """Say whether QNN can run graphs here, from :func:`probe`.

    Args:
        device: None: the NPU or the GPU is usable. ``"npu"``/``"htp"`` or ``"gpu"``: that backend is usable.
            ``"cpu"``: always True (the backend's last resort is PyTorch on the CPU).

    Raises:
        InvalidDeviceError: ``device`` is not one of those names.
    """
    if device is None:
        return probe().any_available
    canonical = normalize_device(device, allowed=("npu", "gpu", "cpu"))
    if canonical == "cpu":
        return True
    return probe().backend(canonical).available


def resolve_soc_model(value: int | str | None = None) -> int:
    """Turn a user's SoC choice into a QNN ``soc_model`` number.

    Args:
        value: A non-negative int, a digit string, or a chip name (case-insensitive: ``"SM8650"``, ``"sc8380xp"``,
            ``"x-elite"``, ...). None: ``QNNX_SOC_MODEL`` if set, else the detected chip on Snapdragon hardware,
            else 60 (Snapdragon X Elite, SC8380XP).

    Raises:
        InvalidSocModelError: ``value`` (or ``QNNX_SOC_MODEL`` when ``value`` is None) is not acceptable; the message
            names the value and the accepted names.
    """
    if value is not None:
        return parse_soc_model(value)
    env, _ = active_environment()
    raw = env.environ().get(ENV_SOC_MODEL)
    if raw is not None and raw.strip():
        return parse_soc_model(raw, source=ENV_SOC_MODEL)
    if not is_x86(env.platform().machine):
        detected = env.host_soc()
        if detected is not None:
            return detected
    return DEFAULT_SOC_MODEL


def resolve_device(value: str | None = None) -> str:
    """Turn a user's device choice into ``"npu"``, ``"gpu"``, ``"cpu"`` or ``"auto"``.

    Args:
        value: A device name (``"htp"`` is a synonym of ``"npu"``). None: ``QNNX_DEVICE`` if set, else ``"auto"``.

    Raises:
        InvalidDeviceError: ``value`` (or ``QNNX_DEVICE`` when ``value`` is None) is not one of the names.
    """
    allowed = ("npu", "gpu", "cpu", "auto")
    if value is not None:
        return normalize_device(value, allowed=allowed)
    env, _ = active_environment()
    raw = env.environ().get(ENV_DEVICE)
    if raw is not None and raw.strip():
        return normalize_device(raw, allowed=allowed, source=ENV_DEVICE)
    return "auto"
