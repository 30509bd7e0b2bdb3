"""A content-addressed store of compiled ONNX Runtime EP contexts."""

from qnnx_ctxcache import errors as errors  # so `qnnx_ctxcache.errors.X` works after `import qnnx_ctxcache`
from qnnx_ctxcache._key import (
    KEY_SCHEMA_VERSION,
    RUNTIME_ONLY_EP_OPTIONS,
    CacheKey,
    canonical_json,
    diff_key_material,
    digest_model,
    host_material,
    make_key,
)
from qnnx_ctxcache._layout import default_root
from qnnx_ctxcache._options import StoreOptions
from qnnx_ctxcache._results import (
    BuildResult,
    Entry,
    EntryDetails,
    EntryInfo,
    PackReport,
    Problem,
    PruneReport,
    StoreStats,
    UnpackReport,
    VerifyReport,
)
from qnnx_ctxcache._store import ContextStore
from qnnx_ctxcache._version import __version__

__all__ = [
    "KEY_SCHEMA_VERSION",
    "RUNTIME_ONLY_EP_OPTIONS",
    "BuildResult",
    "CacheKey",
    "ContextStore",
    "Entry",
    "EntryDetails",
    "EntryInfo",
    "PackReport",
    "Problem",
    "PruneReport",
    "StoreOptions",
    "StoreStats",
    "UnpackReport",
    "VerifyReport",
    "__version__",
    "canonical_json",
    "default_root",
    "diff_key_material",
    "digest_model",
    "errors",
    "host_material",
    "make_key",
]
