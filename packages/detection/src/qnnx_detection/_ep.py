"""Reaching QNN through ONNX Runtime: plugin-EP registration, devices, backend paths, options, sessions.

onnxruntime and onnxruntime_qnn are imported on first use, never at package import.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qnnx_detection._devices import normalize_device
from qnnx_detection._native import capture_native_output, explain_failure
from qnnx_detection._report import QNN_DEVICES, QnnDevice
from qnnx_detection._selection import select_device
from qnnx_detection.errors import (
    InvalidOptionsError,
    QnnNotInstalledError,
    QnnRegistrationError,
    SessionCreationError,
)

if TYPE_CHECKING:
    import onnxruntime

logger = logging.getLogger(__name__)

#: Name under which the QNN plugin EP is registered (``onnxruntime_qnn.get_ep_name()`` in 2.4-2.7).
EP_NAME = "QNNExecutionProvider"

# ORT log severity for our sessions: 3 = ERROR. Warnings (2) would print two lines per session on stderr
# (e.g. "File mapped weights feature is only available on Windows arm64", onnxruntime-qnn 2.7.0); errors are kept
# because the QNN reason for a failed session is only in those lines, and we capture them during creation.
_SESSION_LOG_SEVERITY = 3

_REGISTER_LOCK = threading.Lock()
_registered_name: str | None = None


def import_qnn() -> tuple[Any, Any]:
    """Import and return ``(onnxruntime, onnxruntime_qnn)``.

    Raises:
        QnnNotInstalledError: Either module is missing or fails to import (also for broken installs).
    """
    try:
        import onnxruntime
    except ImportError as exc:
        raise QnnNotInstalledError(
            f"onnxruntime cannot be imported ({exc}); install it with: pip install onnxruntime-qnn"
        ) from exc
    except Exception as exc:  # a broken install fails with anything (OSError from a bad .so, ...)
        raise QnnNotInstalledError(
            f"onnxruntime is installed but fails to import: {exc!r}; reinstall it: pip install --force-reinstall "
            "onnxruntime"
        ) from exc
    try:
        import onnxruntime_qnn
    except ImportError as exc:
        raise QnnNotInstalledError(
            f"onnxruntime-qnn cannot be imported ({exc}); install it with: pip install 'onnxruntime-qnn>=2.4,<2.8'"
        ) from exc
    except Exception as exc:
        raise QnnNotInstalledError(
            f"onnxruntime-qnn is installed but fails to import: {exc!r}; reinstall it: pip install "
            "--force-reinstall 'onnxruntime-qnn>=2.4,<2.8'"
        ) from exc
    return onnxruntime, onnxruntime_qnn


# Prefixes of the QNN EP's provider option names (onnxruntime-qnn 2.4-2.7): the names are read from the installed EP
# library, so a new release's options are accepted without a qnnx update, and everything else in the library's
# string table (symbols, messages) is not.
_OPTION_PREFIXES = (
    b"htp_",
    b"enable_",
    b"qnn_",
    b"vtcm_",
    b"device_id",
    b"profiling_",
    b"rpc_",
    b"dump_",
    b"json_",
    b"op_packages",
    b"op_affinity",
    b"skip_",
    b"offload_",
    b"disable_",
    b"soc_model",
    b"backend_",
)


@functools.cache
def known_provider_options() -> frozenset[str]:
    """The provider option names the installed onnxruntime-qnn's EP library knows (empty when it is missing).

    ONNX Runtime silently ignores an unknown key, so callers check names against this set. The names are the
    library's NUL-terminated strings that look like QNN option names (about 5 MB read once per process, ~20 ms).
    """
    import re

    try:
        _, oq = import_qnn()
        data = Path(oq.get_library_path()).read_bytes()
    except (QnnNotInstalledError, OSError, AttributeError) as exc:
        logger.debug("cannot read the QNN EP library for its option names: %s", exc)
        return frozenset()
    # Option names are identifiers: strings with a dot are the library's source and data file names.
    names = (m.group(1) for m in re.finditer(rb"\x00([a-z][a-z0-9_]{2,60})\x00", data))
    return frozenset(n.decode() for n in names if n.startswith(_OPTION_PREFIXES))


def _ep_name(oq: Any) -> str:
    get_name = getattr(oq, "get_ep_name", None)
    return str(get_name()) if callable(get_name) else EP_NAME


def register_ep() -> str:
    """Register the QNN plugin EP library with ONNX Runtime once per process and return the EP name.

    Idempotent and thread-safe: concurrent first calls register exactly once. If someone else (user code, another
    library) already registered it, that counts as success. ``onnxruntime.register_execution_provider_library`` is
    looked up on the module at call time, so tests may wrap it with a counting spy.

    Raises:
        QnnNotInstalledError: onnxruntime or onnxruntime-qnn is missing.
        QnnRegistrationError: ONNX Runtime refused the library (e.g. onnxruntime older than 1.23 has no plugin EPs).
    """
    global _registered_name
    if _registered_name is not None:
        return _registered_name
    with _REGISTER_LOCK:
        if _registered_name is not None:
            return _registered_name
        ort, oq = import_qnn()
        name = _ep_name(oq)
        if not hasattr(ort, "register_execution_provider_library") or not hasattr(ort, "get_ep_devices"):
            raise QnnRegistrationError(
                f"onnxruntime {getattr(ort, '__version__', '?')} has no plugin-EP API; onnxruntime-qnn 2.x needs "
                "onnxruntime>=1.24.2: pip install -U onnxruntime"
            )
        if any(d.ep_name == name for d in ort.get_ep_devices()):
            logger.debug("QNN EP %s was already registered by someone else", name)
        else:
            library = oq.get_library_path()
            error: Exception | None = None
            with capture_native_output() as out:
                try:
                    ort.register_execution_provider_library(name, library)
                except Exception as exc:  # ORT raises its own Fail type; all of them mean "not registered"
                    error = exc
            if out.text:
                logger.debug("native output while registering %s:\n%s", library, out.text)
            if error is not None and "already registered" not in str(error):
                raise QnnRegistrationError(
                    f"onnxruntime could not load the QNN EP library {library}: {error}. Check that onnxruntime "
                    "and onnxruntime-qnn versions match (onnxruntime-qnn 2.x needs onnxruntime>=1.24.2)"
                ) from error
        logger.debug("QNN EP registered as %s", name)
        _registered_name = name
        return name


def backend_library(device: str) -> str:
    """Return the path of the QNN backend library for ``device``: ``"npu"`` -> libQnnHtp, ``"gpu"`` -> libQnnGpu.

    The path is where onnxruntime-qnn ships the library; whether it loads is for :func:`probe` to say.

    Raises:
        InvalidDeviceError: ``device`` is not ``"npu"`` (or ``"htp"``) or ``"gpu"``.
        QnnNotInstalledError: onnxruntime-qnn is missing.
    """
    canonical = normalize_device(device, allowed=QNN_DEVICES)
    _, oq = import_qnn()
    return str(oq.get_qnn_htp_path() if canonical == "npu" else oq.get_qnn_gpu_path())


def checked_provider_options(
    device: str, backend_path: str, soc_model: int, extra: Mapping[str, object] | None
) -> dict[str, str]:
    """:func:`provider_options` for a device already normalized and its backend library already found."""
    problems: list[str] = []
    if isinstance(soc_model, bool) or not isinstance(soc_model, int) or soc_model < 0:
        problems.append(f"soc_model={soc_model!r} must be a non-negative int; use resolve_soc_model() to get one")
    options = {"backend_path": backend_path, "soc_model": str(soc_model)}
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not key:
            problems.append(f"provider option key {key!r} must be a non-empty str")
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            problems.append(f"provider option {key}={value!r} must be a str (or int)")
            continue
        text = str(value)
        if key in ("backend_path", "backend_type"):
            problems.append(
                f"provider option {key}={text!r} may not be set: the backend library follows device={device!r}; "
                "pass device='npu' or device='gpu' instead"
            )
        elif key == "soc_model" and text != str(soc_model):
            problems.append(
                f"provider option soc_model={text!r} contradicts soc_model={soc_model!r}; pass it only as the "
                "soc_model keyword"
            )
        else:
            options[key] = text
    if problems:
        raise InvalidOptionsError(problems)
    return options


def provider_options(device: str, *, soc_model: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build QNN provider options: ``{"backend_path": ..., "soc_model": str(soc_model)}`` plus ``extra``.

    QNN silently ignores unknown keys and often degrades on bad values (onnxruntime-qnn 2.7.0), so the keys this
    package owns are checked here.

    Args:
        device: ``"npu"`` or ``"gpu"``.
        soc_model: QNN SoC number (see :func:`resolve_soc_model`). Always passed: the HTP simulator keeps
            per-process state, and without it numerics and op coverage depend on earlier sessions.
        extra: More provider options. ``backend_path``/``backend_type`` may not appear; ``soc_model`` only if equal.

    Raises:
        InvalidDeviceError: Bad ``device``.
        InvalidOptionsError: Every problem with ``soc_model`` and ``extra``, in one error.
        QnnNotInstalledError: onnxruntime-qnn is missing.
    """
    canonical = normalize_device(device, allowed=QNN_DEVICES)
    return checked_provider_options(canonical, backend_library(canonical), soc_model, extra)


def to_qnn_device(ep_device: Any) -> QnnDevice:
    """Describe an ``onnxruntime.OrtEpDevice`` as a :class:`QnnDevice`."""
    hw = ep_device.device
    kind = getattr(hw.type, "name", str(hw.type)).rsplit(".", 1)[-1]
    return QnnDevice(
        hardware_type=kind.upper(),
        vendor=str(hw.vendor),
        vendor_id=int(hw.vendor_id),
        device_id=int(hw.device_id),
    )


def qnn_ep_devices() -> list[Any]:
    """Register the EP and return ORT's QNN ``OrtEpDevice`` objects, in ORT's order."""
    name = register_ep()
    ort, _ = import_qnn()
    return [d for d in ort.get_ep_devices() if d.ep_name == name]


def find_ep_device(device: str) -> onnxruntime.OrtEpDevice | None:
    """Return the ``OrtEpDevice`` that serves ``device`` (``"npu"``/``"gpu"``), or None when there is none.

    On x86_64 both backends are reached through the one host device the EP reports; for the GPU that only means
    QNN will be asked (and will refuse) to initialize it, which is how :func:`probe` learns the reason.

    Raises:
        InvalidDeviceError: Bad ``device``.
        QnnNotInstalledError: onnxruntime-qnn is missing.
        QnnRegistrationError: The EP library could not be registered.
    """
    canonical = normalize_device(device, allowed=QNN_DEVICES)
    devices = qnn_ep_devices()
    index, _ = select_device(canonical, [to_qnn_device(d) for d in devices], platform.machine())
    return devices[index] if index is not None else None


def checked_session_config(config: Mapping[str, str] | None, allow_cpu_fallback: bool) -> dict[str, str]:
    """The session config entries ``config`` asks for, checked, plus the CPU-fallback switch (raises
    InvalidOptionsError with every problem)."""
    problems: list[str] = []
    entries: dict[str, str] = {}
    for key, value in (config or {}).items():
        if not isinstance(key, str) or not isinstance(value, str | int) or isinstance(value, bool):
            problems.append(f"session config entry {key!r}={value!r} must map str to str")
        elif key == "session.disable_cpu_ep_fallback":
            problems.append(
                "session config entry 'session.disable_cpu_ep_fallback' is controlled by allow_cpu_fallback; "
                "pass allow_cpu_fallback=True/False instead"
            )
        else:
            entries[key] = str(value)
    if problems:
        raise InvalidOptionsError(problems)
    if not allow_cpu_fallback:
        # Without this, nodes QNN declines (or a GPU backend that cannot initialize) silently run on ORT's CPU EP.
        entries["session.disable_cpu_ep_fallback"] = "1"
    return entries


_RECORD_PLACEMENT = "session.record_ep_graph_assignment_info"


def node_placement(session: Any) -> dict[str, tuple[str, ...]] | None:
    """Return ``{EP name: names of the nodes assigned to it}`` for a session, or None when it was not recorded.

    Recorded for sessions that :func:`create_session` made with ``allow_cpu_fallback=True`` (or with the
    ``session.record_ep_graph_assignment_info`` config entry); requires onnxruntime >= 1.32's
    ``InferenceSession.get_provider_graph_assignment_info``.
    """
    getter = getattr(session, "get_provider_graph_assignment_info", None)
    if not callable(getter):
        return None
    try:
        subgraphs = getter()
    except Exception:  # not recorded for this session
        return None
    if not subgraphs:
        return None
    placement: dict[str, tuple[str, ...]] = {}
    for subgraph in subgraphs:
        names = tuple(node.name for node in subgraph.get_nodes())
        placement[subgraph.ep_name] = placement.get(subgraph.ep_name, ()) + names
    return placement


def create_session_on(
    model: bytes | str,
    device: str,
    ep_device: Any,
    options: Mapping[str, str],
    config: Mapping[str, str],
    graph_optimization_level: Any = None,
    *,
    single_threaded: bool = False,
) -> onnxruntime.InferenceSession:
    """Create a session on a given ``OrtEpDevice`` with native output captured. See :func:`create_session`.

    ``single_threaded`` is for the probe's tiny graph: ORT's per-session thread pools cost more than the graph
    (about 40% of a probe session's creation time measured on the 2-core bench under load).
    """
    ort, _ = import_qnn()
    so = ort.SessionOptions()
    so.log_severity_level = _SESSION_LOG_SEVERITY
    if single_threaded:
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    if graph_optimization_level is not None:
        so.graph_optimization_level = graph_optimization_level
    if config.get("session.disable_cpu_ep_fallback") != "1" and _RECORD_PLACEMENT not in config:
        # Fallback allowed: record where nodes went so a session in which QNN took nothing can be refused.
        so.add_session_config_entry(_RECORD_PLACEMENT, "1")
    so.add_provider_for_devices([ep_device], dict(options))
    error: Exception | None = None
    session = None
    with capture_native_output() as out:
        try:
            session = ort.InferenceSession(model, sess_options=so)
        except Exception as exc:  # ORT raises Fail/InvalidArgument/EPFail...; all are a failed creation here
            error = exc
    if out.text:
        logger.debug("native output while creating a QNN %s session:\n%s", device, out.text)
    if error is not None or session is None:
        cause = explain_failure(device, out.text, str(error), machine=platform.machine())
        raise SessionCreationError(device, cause, out.text) from error
    placement = node_placement(session)
    if placement is not None and not placement.get(EP_NAME):
        # With CPU fallback allowed ORT succeeds even when QNN took nothing (e.g. the GPU backend failed to
        # initialize, onnxruntime-qnn 2.7.0 on x86_64): that is not a QNN session, so say so instead of running on CPU.
        if "QNN_" in out.text:
            cause = explain_failure(device, out.text, "", machine=platform.machine())
        else:
            cause = (
                f"QNN took none of the graph's {sum(map(len, placement.values()))} node(s); all would run on the CPU"
            )
        raise SessionCreationError(device, cause, out.text)
    disable_fallback = getattr(session, "disable_fallback", None)
    if callable(disable_fallback):
        # ORT's Python wrapper otherwise re-creates the session on CPU after an EP error in run() (ORT 1.32).
        disable_fallback()
    return session


def create_session(
    model: bytes | str | os.PathLike[str],
    device: str,
    *,
    soc_model: int,
    provider_options: Mapping[str, str] | None = None,
    session_config: Mapping[str, str] | None = None,
    allow_cpu_fallback: bool = False,
    graph_optimization_level: onnxruntime.GraphOptimizationLevel | None = None,
) -> onnxruntime.InferenceSession:
    """Create an ONNX Runtime session that runs ``model`` on a QNN backend.

    Native output (the simulator's LIBNATIVE line on stdout, ORT/QNN error lines on stderr) is kept off the user's
    terminal by redirecting fds 1 and 2 to a temporary file during creation; creations are serialized; the captured
    text is logged at DEBUG and attached to errors.

    Args:
        model: ONNX bytes or a path.
        device: ``"npu"`` (HTP; ``"htp"`` also accepted) or ``"gpu"``.
        soc_model: QNN SoC number; always required (see :func:`provider_options`).
        provider_options: Extra QNN provider options (not ``backend_path``/``backend_type``).
        session_config: Extra ``SessionOptions`` config entries, e.g. ``{"ep.context_enable": "1"}``.
        allow_cpu_fallback: Let ORT run nodes QNN declines on its CPU EP. Off by default so "ran on QNN" is true.
            When on, placement is recorded (see :func:`node_placement`) and a session in which QNN took no node
            at all is refused with :class:`SessionCreationError` (it would silently be a CPU session).
        graph_optimization_level: ORT graph optimization level; ORT's default when None.

    Returns:
        The session, with ORT's silent CPU re-creation on run errors disabled.

    Raises:
        InvalidDeviceError: Bad ``device``.
        InvalidOptionsError: Malformed or contradictory options (all problems listed).
        QnnNotInstalledError: onnxruntime-qnn is missing.
        QnnRegistrationError: The EP library could not be registered.
        SessionCreationError: QNN refused; ``.cause`` says why in one line, ``.native_log`` has the details.
    """
    canonical = normalize_device(device, allowed=QNN_DEVICES)
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, bytes | str):
        raise InvalidOptionsError([f"model must be ONNX bytes or a path, not {type(model).__name__}"])
    # The provider_options parameter shadows the public function of the same name: call the private builder.
    options = checked_provider_options(canonical, backend_library(canonical), soc_model, provider_options)
    config = checked_session_config(session_config, allow_cpu_fallback)
    ep_device = find_ep_device(canonical)
    if ep_device is None:
        raise SessionCreationError(
            canonical, f"ONNX Runtime reports no QNN device that can serve {canonical!r} on this machine"
        )
    return create_session_on(model, canonical, ep_device, options, config, graph_optimization_level)
