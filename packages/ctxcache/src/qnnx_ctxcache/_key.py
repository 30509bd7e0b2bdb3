"""Cache keys: canonical JSON key material and its SHA-256."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from qnnx_ctxcache._fs import CHUNK, sha256_file
from qnnx_ctxcache.errors import InvalidKeyError, UnhashableKeyError

__all__ = [
    "KEY_SCHEMA_VERSION",
    "RUNTIME_ONLY_EP_OPTIONS",
    "SALT_ENV_VAR",
    "CacheKey",
    "canonical_json",
    "diff_key_material",
    "digest_model",
    "host_material",
    "make_key",
]

#: Bump when the layout of the key material or its canonicalisation changes: every key changes with it.
KEY_SCHEMA_VERSION = 1

#: Environment variable whose value, when set and non-empty, is added to every key as ``env_salt``.
SALT_ENV_VAR = "QNNX_CTXCACHE_SALT"

#: EP options that only affect how a compiled context runs, never what is compiled. They are dropped
#: from the key so that e.g. a different power mode reuses the same context. Anything not listed here
#: stays in the key (fail closed). QNN (onnxruntime-qnn 2.7.0): the HTP performance vote and RPC
#: latency are applied per session/run (the run options ``qnn.htp_perf_mode`` and
#: ``qnn.rpc_control_latency`` override them), and profiling only adds an event log.
RUNTIME_ONLY_EP_OPTIONS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "QNNExecutionProvider": frozenset(
            {"htp_performance_mode", "rpc_control_latency", "profiling_level", "profiling_file_path"}
        ),
    }
)

# Session config entries that name *where* a context is written, not what it contains: the staging path
# differs on every build, so keeping them would make every key unique.
_LOCATION_ONLY_SESSION_CONFIG = frozenset({"ep.context_file_path", "ep.context_enable"})


@attrs.frozen(repr=False)
class CacheKey:
    """An immutable cache key.

    Attributes:
        hex: the 64-character lowercase SHA-256 of :func:`canonical_json` of ``material``.
        material: the canonical key material (read-only mapping); stored in each entry's manifest so
            ``qnnx-ctxcache inspect`` can explain what went into the key.
    """

    hex: str
    material: Mapping[str, Any] = attrs.field(eq=False, hash=False)

    def __repr__(self) -> str:
        return f"CacheKey({self.hex[:16]}...)"

    def __str__(self) -> str:
        return self.hex


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _canonical(value: object, field: str) -> Any:
    """Return the canonical JSON-able form of ``value`` or raise UnhashableKeyError naming ``field``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)  # int subclasses (IntEnum...) become plain ints
    if isinstance(value, str):
        return _nfc(value)
    if isinstance(value, float):
        detail = "NaN/inf" if not math.isfinite(value) else "floats have no exact canonical text"
        raise UnhashableKeyError(field, "float", detail)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UnhashableKeyError(f"{field}.{k!r}", type(k).__name__, "mapping keys must be str")
            nk = _nfc(k)
            if nk in out:
                raise UnhashableKeyError(f"{field}.{k}", "str", "two keys are equal after NFC normalisation")
            out[nk] = _canonical(v, f"{field}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [_canonical(v, f"{field}[{i}]") for i, v in enumerate(value)]
    raise UnhashableKeyError(field, type(value).__name__)


def _option_value(value: object, field: str) -> str:
    """Normalise one EP option or session config value to the string ORT receives."""
    if isinstance(value, bool):  # ORT options are strings; QNN parses "1"/"0" for booleans
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        return _nfc(value)
    if isinstance(value, os.PathLike):
        return _nfc(os.fspath(value))
    if isinstance(value, float):
        raise UnhashableKeyError(field, "float", "pass the option as the exact string ORT should receive")
    raise UnhashableKeyError(field, type(value).__name__)


def _options(values: Mapping[str, object] | None, field: str, drop: frozenset[str]) -> dict[str, str]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise UnhashableKeyError(field, type(values).__name__, "expected a mapping of str to str")
    out: dict[str, str] = {}
    for k, v in values.items():
        if not isinstance(k, str):
            raise UnhashableKeyError(f"{field}.{k!r}", type(k).__name__, "option names must be str")
        if k in drop:
            continue
        out[_nfc(k)] = _option_value(v, f"{field}.{k}")
    return out


def host_material() -> dict[str, str]:
    """The host that compiles: OS and CPU architecture.

    Part of every key because the compile path matters: a context generated on an x86_64 host for HTP
    can fail on the device where one generated on the device works (onnxruntime issue #26686).
    """
    return {"os": sys.platform, "machine": platform.machine().lower()}


def diff_key_material(a: CacheKey | Mapping[str, Any], b: CacheKey | Mapping[str, Any]) -> list[str]:
    """Explain why two keys differ: one line per differing leaf of their key material.

    Returns:
        Lines such as ``"ep_options.soc_model: '60' != '69'"``; empty when the materials are equal.
    """
    left = dict(a.material) if isinstance(a, CacheKey) else dict(a)
    right = dict(b.material) if isinstance(b, CacheKey) else dict(b)
    lines: list[str] = []

    def walk(x: object, y: object, path: str) -> None:
        if isinstance(x, Mapping) and isinstance(y, Mapping):
            for k in sorted(set(x) | set(y)):
                sub = f"{path}.{k}" if path else str(k)
                if k not in x:
                    lines.append(f"{sub}: <absent> != {y[k]!r}")
                elif k not in y:
                    lines.append(f"{sub}: {x[k]!r} != <absent>")
                else:
                    walk(x[k], y[k], sub)
        elif x != y:
            lines.append(f"{path}: {x!r} != {y!r}")

    walk(left, right, "")
    return lines


def canonical_json(material: Mapping[str, Any]) -> bytes:
    """Serialise canonical key material to the exact bytes that are hashed.

    Keys are sorted, separators fixed, non-ASCII kept as UTF-8 and strings NFC-normalised by
    :func:`make_key` beforehand, so the bytes are identical across processes and platforms.
    """
    return json.dumps(dict(material), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def make_key(
    *,
    model_digest: str,
    ep_name: str,
    ep_options: Mapping[str, str],
    session_config: Mapping[str, str] | None = None,
    versions: Mapping[str, str],
    input_specs: Sequence[object] | None = None,
    target: Mapping[str, object] | None = None,
    salt: str = "",
) -> CacheKey:
    """Build the cache key for one compiled context.

    Args:
        model_digest: content digest of the source model *including its external data*, e.g. from
            :func:`digest_model`. Any string is accepted; it must change whenever the model does.
        ep_name: execution provider name, e.g. ``"QNNExecutionProvider"``.
        ep_options: every provider option passed to ORT. Values are normalised to the string ORT sees
            (``True``/``1``/``"1"`` are equal); options in :data:`RUNTIME_ONLY_EP_OPTIONS` for this EP
            are dropped.
        session_config: session config entries that affect compilation (graph optimisation level,
            ``session.disable_cpu_ep_fallback``, ``ep.context_embed_mode``...). ``ep.context_file_path``
            and ``ep.context_enable`` are dropped because they name where the context is written.
        versions: runtime-reported versions, e.g. ``{"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0",
            "qairt": "2.51.0"}``. Must not be empty.
        input_specs: JSON-able description of the inputs (names, shapes, dtypes).
        target: the target device, e.g. ``{"soc_model": 60, "htp_arch": 73}``; never defaulted from the host.
        salt: free text mixed into the key; ``$QNNX_CTXCACHE_SALT`` is added as well when set.

    Returns:
        The key; equal inputs give equal keys in every process.

    Raises:
        UnhashableKeyError: a value has no canonical form (callable, float, set, object); names the field.
        InvalidKeyError: a required field is empty or of the wrong type.
    """
    problems: list[str] = []
    if not isinstance(model_digest, str) or not model_digest:
        problems.append(f"model_digest must be a non-empty str, got {model_digest!r}")
    if not isinstance(ep_name, str) or not ep_name:
        problems.append(f"ep_name must be a non-empty str such as 'QNNExecutionProvider', got {ep_name!r}")
    if not isinstance(versions, Mapping) or not versions:
        problems.append(f"versions must be a non-empty mapping such as {{'onnxruntime': '1.32.0'}}, got {versions!r}")
    if not isinstance(salt, str):
        problems.append(f"salt must be a str, got {type(salt).__name__}")
    if problems:
        raise InvalidKeyError("invalid cache key material: " + "; ".join(problems))

    if input_specs is not None and (isinstance(input_specs, str | bytes) or not isinstance(input_specs, Sequence)):
        raise UnhashableKeyError("input_specs", type(input_specs).__name__, "expected a list of specs")
    drop = RUNTIME_ONLY_EP_OPTIONS.get(ep_name, frozenset())
    material: dict[str, Any] = {
        "schema": KEY_SCHEMA_VERSION,
        "model_digest": _nfc(model_digest),
        "ep_name": _nfc(ep_name),
        "ep_options": _options(ep_options, "ep_options", drop),
        "session_config": _options(session_config, "session_config", _LOCATION_ONLY_SESSION_CONFIG),
        "versions": _options(versions, "versions", frozenset()),
        "input_specs": None if input_specs is None else _canonical(list(input_specs), "input_specs"),
        "target": None if target is None else _canonical(target, "target"),
        "salt": _nfc(salt),
        "host": host_material(),
    }
    env_salt = os.environ.get(SALT_ENV_VAR, "")
    if env_salt:
        material["env_salt"] = _nfc(env_salt)
    digest = hashlib.sha256(canonical_json(material)).hexdigest()
    return CacheKey(digest, MappingProxyType(material))


def _may_reference_external_data(path: Path) -> bool:
    """False when the file cannot hold an external-data reference (saves parsing it with onnx).

    Every external tensor carries a ``StringStringEntryProto`` whose key is the ASCII text
    ``location``; a model without that byte string has no external data.
    """
    needle = b"location"
    tail = b""
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            if needle in tail + chunk[: len(needle)] or needle in chunk:
                return True
            tail = chunk[-(len(needle) - 1) :]
    return False


def digest_model(model: str | os.PathLike[str] | bytes) -> str:
    """Content digest of an ONNX model and every external-data file it references.

    The digest depends on bytes only, never on where the model lives: two copies of a model in different
    folders get the same digest; changing one byte of the model or of its external data changes it.

    Args:
        model: path to an ``.onnx`` file, or the serialised model bytes (bytes cannot reference
            external data that would have to be found relative to a folder).

    Returns:
        ``"sha256:<hex>"``.

    Raises:
        FileNotFoundError: the model or one of its external-data files is missing.
    """
    h = hashlib.sha256()
    if isinstance(model, bytes):
        h.update(b"model\0")
        h.update(hashlib.sha256(model).digest())
        return "sha256:" + h.hexdigest()
    path = Path(model)
    h.update(b"model\0")
    h.update(bytes.fromhex(sha256_file(path)))
    if not _may_reference_external_data(path):
        return "sha256:" + h.hexdigest()
    import onnx  # deferred: importing the package must stay cheap

    proto = onnx.load(str(path), load_external_data=False)
    locations: set[str] = set()
    tensors = list(proto.graph.initializer)
    for node in proto.graph.node:
        tensors.extend(a.t for a in node.attribute if a.HasField("t"))
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    for location in sorted(locations):
        h.update(b"external\0" + location.encode("utf-8") + b"\0")
        h.update(bytes.fromhex(sha256_file(path.parent / location)))
    return "sha256:" + h.hexdigest()
