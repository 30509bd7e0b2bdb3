"""Reach Qualcomm QNN through ONNX Runtime: EP registration, truthful device probing, versions.

The public API is exactly ``__all__`` (plus the ``errors`` and ``testing`` submodules and the ``qnnx-detect`` CLI).
Modules whose names start with ``_`` are private.
"""

from qnnx_detection import errors as errors  # so `qnnx_detection.errors.X` works after `import qnnx_detection`
from qnnx_detection._ep import (
    EP_NAME,
    backend_library,
    create_session,
    find_ep_device,
    known_provider_options,
    node_placement,
    provider_options,
    register_ep,
)
from qnnx_detection._probe import is_available, probe, resolve_device, resolve_soc_model
from qnnx_detection._report import (
    SCHEMA_VERSION,
    BackendStatus,
    Overrides,
    PlatformInfo,
    ProbeReport,
    QnnDevice,
    Versions,
)
from qnnx_detection._soc import DEFAULT_SOC_MODEL, SocInfo, soc_info, soc_name
from qnnx_detection._version import __version__
from qnnx_detection._weight_sharing import WeightSharingReport, probe_weight_sharing

__all__ = [
    "DEFAULT_SOC_MODEL",
    "EP_NAME",
    "SCHEMA_VERSION",
    "BackendStatus",
    "Overrides",
    "PlatformInfo",
    "ProbeReport",
    "QnnDevice",
    "SocInfo",
    "Versions",
    "WeightSharingReport",
    "__version__",
    "backend_library",
    "create_session",
    "errors",
    "find_ep_device",
    "is_available",
    "known_provider_options",
    "node_placement",
    "probe",
    "probe_weight_sharing",
    "provider_options",
    "register_ep",
    "resolve_device",
    "resolve_soc_model",
    "soc_info",
    "soc_name",
]
