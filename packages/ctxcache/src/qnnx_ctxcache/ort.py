"""One call for a cached QNN session from plain ONNX Runtime.

.. code-block:: python

    from qnnx_ctxcache.ort import cached_session

    session = cached_session("model.onnx", device="npu", soc_model=60, free_dims={"batch": 1})

The first call compiles the model on the QNN execution provider into the context store and loads the compiled
EPContext model; later calls, in any process on the machine, load it straight from the store. The key is the store's
usual key material (model and external-data bytes, every compile-relevant option, runtime versions, target, host),
and a session load that takes the process down is recorded, so the next call rebuilds instead of crashing again.

This module needs ``onnxruntime`` and ``onnxruntime-qnn`` (the ``qnnx-ctxcache[qnn]`` extra); ``import qnnx_ctxcache``
never imports them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from qnnx_clikit import CHIPS, chip_number
from qnnx_ctxcache._key import CacheKey, digest_model, make_key
from qnnx_ctxcache._results import BuildResult, Entry
from qnnx_ctxcache._shared import SharedContextGroup, SharedGroupCheck, check_shared_group, compile_shared_group
from qnnx_ctxcache._store import ContextStore
from qnnx_ctxcache.errors import InvalidOptionsError

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "EP_NAME",
    "SessionArgs",
    "SharedContextGroup",
    "SharedGroupCheck",
    "cached_session",
    "check_shared_group",
    "compile_model",
    "compile_shared_group",
]

_log = logging.getLogger(__name__)

#: The execution provider this module caches for.
EP_NAME = "QNNExecutionProvider"
_DEVICES = {"npu": "htp", "htp": "htp", "gpu": "gpu"}
# Where the compiled context goes: the EP writes the file the staging path names, never an existing one.
_CONTEXT_FILE = "model_ctx.onnx"
# Set by this module for every compile; the caller's own values for them are refused (they would break the cache).
_OWNED_CONFIG = ("ep.context_enable", "ep.context_file_path", "ep.context_embed_mode")


def _ort() -> tuple[Any, Any]:
    try:
        import onnxruntime as ort
        import onnxruntime_qnn as oq
    except ImportError as exc:
        raise ImportError(
            f"qnnx_ctxcache.ort needs onnxruntime and onnxruntime-qnn ({exc}). Fix: pip install 'qnnx-ctxcache[qnn]'."
        ) from exc
    return ort, oq


def _device(ort: Any) -> Any:
    """The QNN EP device, registering the plugin library once per process."""
    if not any(d.ep_name == EP_NAME for d in ort.get_ep_devices()):
        _, oq = _ort()
        ort.register_execution_provider_library(EP_NAME, oq.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise RuntimeError(f"onnxruntime lists no {EP_NAME} device after registering the onnxruntime-qnn library")
    return devices[0]


def _soc(soc_model: int | str | None) -> int | None:
    if soc_model is None:
        return None
    if isinstance(soc_model, int) and not isinstance(soc_model, bool) and soc_model >= 0:
        return soc_model
    if isinstance(soc_model, str):
        text = soc_model.strip()
        number = int(text) if text.isascii() and text.isdecimal() else chip_number(text)
        if number is not None:
            return number
    names = ", ".join(c.name for c in CHIPS)
    raise InvalidOptionsError(
        f"soc_model={soc_model!r} is not a SoC; accepted: a non-negative QNN SoC number (e.g. 60) or a chip name "
        f"({names}). Fix: pass the SoC of the target device, e.g. soc_model=60."
    )


def _dim_names(model: Path) -> set[str]:
    """The named dims of the model's graph inputs (read without external data)."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    return {
        d.dim_param
        for vi in graph.input
        if vi.name not in inits and vi.type.HasField("tensor_type")
        for d in vi.type.tensor_type.shape.dim
        if d.HasField("dim_param") and d.dim_param
    }


def _free_dims(free_dims: Mapping[str, int] | None, model: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, size in (free_dims or {}).items():
        if not isinstance(name, str) or not name or isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidOptionsError(
                f"free_dims[{name!r}] = {size!r}; accepted: dimension names mapped to positive integers. "
                f"Fix: e.g. free_dims={{'batch': 1}}."
            )
        out[name] = size
    if out:
        # onnxruntime ignores an override whose name no input has: the compile would then meet a symbolic dim.
        known = _dim_names(model)
        unknown = sorted(set(out) - known)
        if unknown:
            raise InvalidOptionsError(
                f"free_dims names {', '.join(map(repr, unknown))}, which no graph input of {model.name} has; accepted: "
                f"{', '.join(sorted(known)) or 'none (the inputs have no named dims)'}. Fix: use those names."
            )
    return out


def _config(session_options: object) -> dict[str, str]:
    if session_options is None:
        return {}
    if not isinstance(session_options, Mapping):
        raise InvalidOptionsError(
            f"session_options is a {type(session_options).__name__}; accepted: a mapping of session config entries "
            f"(name -> value, as SessionOptions.add_session_config_entry takes them). An onnxruntime.SessionOptions "
            f"cannot be read back, so its settings could not be part of the cache key. Fix: pass them as a dict, "
            f"e.g. session_options={{'session.disable_cpu_ep_fallback': '1'}}."
        )
    owned = sorted(k for k in session_options if k in _OWNED_CONFIG)
    if owned:
        raise InvalidOptionsError(
            f"session_options sets {', '.join(owned)}; accepted: any entry but {', '.join(_OWNED_CONFIG)}, which the "
            f"cache sets for each compile. Fix: leave them out."
        )
    return {str(k): str(v) for k, v in session_options.items()}


class SessionPlan:
    """Everything one cached session needs: the key, and the session options for the compile and the load."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        device: str,
        soc_model: int | str | None,
        free_dims: Mapping[str, int] | None,
        provider_options: Mapping[str, object] | None,
        session_options: object,
    ) -> None:
        backend = _DEVICES.get(str(device).strip().lower())
        if backend is None:
            raise InvalidOptionsError(
                f"device={device!r} is not a QNN device; accepted: npu (alias htp), gpu. Fix: device='npu'."
            )
        self.model = Path(model)
        if not self.model.is_file():
            raise FileNotFoundError(f"{self.model}: no such ONNX file. Fix: pass the path of a .onnx model.")
        self.ort, oq = _ort()
        self.soc = _soc(soc_model)
        self.free_dims = _free_dims(free_dims, self.model)
        self.config = _config(session_options)
        options = {str(k): str(v) for k, v in (provider_options or {}).items()}
        if "backend_type" not in options and "backend_path" not in options:
            options["backend_path"] = oq.get_qnn_htp_path() if backend == "htp" else oq.get_qnn_gpu_path()
        if self.soc is not None:
            options["soc_model"] = str(self.soc)
        self.options = options
        # The backend library's path differs per installation; its version is keyed through `versions`.
        key_options = dict(options)
        if "backend_path" in key_options:
            key_options["backend_path"] = Path(key_options["backend_path"]).name
        self.key: CacheKey = make_key(
            model_digest=digest_model(self.model),
            ep_name=EP_NAME,
            ep_options=key_options,
            session_config={**self.config, "ep.context_embed_mode": "0"},
            versions={"onnxruntime": self.ort.__version__, "onnxruntime-qnn": metadata.version("onnxruntime-qnn")},
            input_specs=[{"free_dims": dict(sorted(self.free_dims.items()))}],
            target={"device": backend, "soc_model": self.soc if self.soc is not None else "unset"},
        )

    def session_options(self, extra: Mapping[str, str] | None = None) -> onnxruntime.SessionOptions:
        so = self.ort.SessionOptions()
        for name, value in {**self.config, **(extra or {})}.items():
            so.add_session_config_entry(name, value)
        for name, size in self.free_dims.items():
            so.add_free_dimension_override_by_name(name, size)
        so.add_provider_for_devices([_device(self.ort)], self.options)
        return so

    def build(self, staging: Path) -> BuildResult:
        """Compile into ``staging``: a session with ``ep.context_enable=1`` writes the EPContext model and its
        context binary beside it."""
        started = time.monotonic()
        extra = {
            "ep.context_enable": "1",
            "ep.context_file_path": str(staging / _CONTEXT_FILE),
            "ep.context_embed_mode": "0",
        }
        self.ort.InferenceSession(str(self.model), sess_options=self.session_options(extra))
        _log.info("compiled %s for QNN in %.2f s", self.model, time.monotonic() - started)
        return BuildResult(model_file=_CONTEXT_FILE, metadata={"source": self.model.name})

    def load(self, entry: Entry) -> onnxruntime.InferenceSession:
        return self.ort.InferenceSession(str(entry.model_path), sess_options=self.session_options())


# One store per root and process: it remembers which entries this process has fully verified, and its counters
# reach the store's stats at exit.
_STORES: dict[Path | None, ContextStore] = {}


def _store(cache_dir: str | os.PathLike[str] | None) -> ContextStore:
    root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else None
    store = _STORES.get(root)
    if store is None:
        store = _STORES[root] = ContextStore(root)
    return store


def cached_session(
    model: str | os.PathLike[str],
    *,
    device: str = "npu",
    soc_model: int | str | None = None,
    free_dims: Mapping[str, int] | None = None,
    provider_options: Mapping[str, object] | None = None,
    session_options: Mapping[str, str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> onnxruntime.InferenceSession:
    """An ``onnxruntime.InferenceSession`` of ``model`` on the QNN EP, loaded from the context store, or built after
    compiling the model into it.

    Args:
        model: Path of the ``.onnx`` file (its external data beside it).
        device: ``"npu"`` (alias ``"htp"``) or ``"gpu"``.
        soc_model: The target SoC: a QNN SoC number (``60``) or a chip name (``"SC8380XP"``). On the x86 HTP
            simulator it also selects device-like fp16 numerics. None: the EP's default.
        free_dims: Sizes of the model's named free dimensions (``{"batch": 1}``); QNN compiles static shapes.
        provider_options: More QNN provider options (``backend_path`` defaults to the installed onnxruntime-qnn's).
        session_options: Session config entries (name -> value, e.g. ``{"session.disable_cpu_ep_fallback": "1"}``).
        cache_dir: The store's root. None: ``$QNNX_CTXCACHE_DIR`` or the per-user cache folder.

    Returns:
        The session. A hit, a compile and any cache trouble (logged, never raised) are counted in the store's stats.

    Raises:
        qnnx_ctxcache.errors.InvalidOptionsError: a bad device, SoC, free dim, or session option.
        FileNotFoundError: ``model`` is not a file.
        ImportError: onnxruntime or onnxruntime-qnn is not installed.
    """
    plan = SessionPlan(
        model,
        device=device,
        soc_model=soc_model,
        free_dims=free_dims,
        provider_options=provider_options,
        session_options=session_options,
    )
    entry, session = _store(cache_dir).load_or_rebuild(plan.key, plan.build, plan.load)
    _log.info("%s %s: %s", "hit" if entry.hit else "compiled", model, entry.model_path)
    return session


class SessionArgs(TypedDict, total=False):
    """The keyword arguments :func:`cached_session` and :func:`compile_model` share."""

    device: str
    soc_model: int | str | None
    free_dims: Mapping[str, int] | None
    provider_options: Mapping[str, object] | None
    session_options: Mapping[str, str] | None
    cache_dir: str | os.PathLike[str] | None


def compile_model(model: str | os.PathLike[str], **options: Unpack[SessionArgs]) -> Entry:
    """Compile ``model`` into the store unless it is there already (for a build host, before ``pack``). It takes the
    keyword arguments of :func:`cached_session` and makes the same key, so a later ``cached_session`` call with them
    is a hit.

    Returns:
        The entry (``entry.hit`` is True when it was already in the store).
    """
    plan = SessionPlan(
        model,
        device=options.get("device", "npu"),
        soc_model=options.get("soc_model"),
        free_dims=options.get("free_dims"),
        provider_options=options.get("provider_options"),
        session_options=options.get("session_options"),
    )
    return _store(options.get("cache_dir")).get_or_create(plan.key, plan.build)
