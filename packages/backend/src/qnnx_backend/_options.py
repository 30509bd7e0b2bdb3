"""Validated, immutable options of the ``qnn`` backend (private; public as :class:`qnnx_backend.BackendOptions`)."""

from __future__ import annotations

import ast
import difflib
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from qnnx_backend._quantspec import QuantizeSpec, parse_quantize
from qnnx_backend.errors import InvalidOptionsError

DEVICES = ("auto", "npu", "gpu", "cpu")
_DEVICE_ALIASES = {"htp": "npu", "dsp": "npu"}
PARTITIONS = ("auto", "whole", "mixed")
CHAIN = ("npu", "gpu")
"""The order device='auto' tries QNN backends in, before eager PyTorch."""
OPCHECK_BACKEND = {"npu": "htp", "gpu": "gpu"}
"""qnnx-opcheck's name of each device's table."""


CACHE_KEY = "qnnx_cache_key"
"""The metadata key of every option field: how the option enters the context-cache key (:func:`keyed`), or why it
does not (:func:`not_keyed`). ``cache_material()`` reads it, so an option cannot be left out by mistake."""


def keyed(material: Callable[[BackendOptions], Mapping[str, str]]) -> dict[str, Any]:
    """Field metadata: the option changes what is compiled; ``material`` gives its entries of the cache key."""
    return {CACHE_KEY: material}


def not_keyed(why: str) -> dict[str, Any]:
    """Field metadata: the option does not change the compiled context (``why`` says so, for the reader)."""
    return {CACHE_KEY: why}


def effective_device(requested: str, override: str | None) -> str:
    """The device a compile uses: ``QNNX_DEVICE`` (read by qnnx-detection) replaces ``device='auto'`` only."""
    if requested == "auto" and override not in (None, "auto"):
        return str(override)
    return requested


# QNN EP provider options (onnxruntime-qnn 2.4-2.7) a user may pass through `provider_options`. ORT silently
# ignores unknown keys (verified with 2.7.0), so a typo would otherwise degrade without a word: we check names.
# backend_path/backend_type/soc_model are owned by qnnx (device and soc_model options) and refused here.
PASSTHROUGH_PROVIDER_OPTIONS = frozenset(
    {
        "htp_performance_mode",
        "htp_graph_finalization_optimization_mode",
        "htp_arch",
        "vtcm_mb",
        "device_id",
        "rpc_control_latency",
        "qnn_context_priority",
        "profiling_level",
        "profiling_file_path",
        "enable_htp_fp16_clamp_overflow",
        "enable_htp_spill_fill_buffer",
        "htp_bf16_enable",
        "op_affinity",
        "enable_htp_matmul_lut",
        "dump_json_qnn_graph",
        "json_qnn_graph_dir",
        "enable_htp_monolithic_lstm",
        "offload_graph_io_quantization",
    }
)
_OWNED_PROVIDER_OPTIONS = {
    "backend_path": "device",
    "backend_type": "device",
    "soc_model": "soc_model",
    "enable_htp_fp16_precision": "fp16",
}


def _device(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidOptionsError(
            f"device={value!r} is not valid; accepted: {', '.join(map(repr, DEVICES))}. "
            "Example: options={'device': 'npu'}"
        )
    name = _DEVICE_ALIASES.get(value.strip().lower(), value.strip().lower())
    if name not in DEVICES:
        raise InvalidOptionsError(
            f"device={value!r} is not valid; accepted: {', '.join(map(repr, DEVICES))} "
            "('htp' is accepted as another name for 'npu')."
        )
    return name


def _bool(name: str):
    def convert(value: object) -> bool:
        if isinstance(value, bool):
            return value
        raise InvalidOptionsError(f"{name}={value!r} is not valid; accepted: True or False.")

    return convert


_CACHE_ENV = "QNNX_CACHE"
_CACHE_MAX_ENV = "QNNX_CACHE_MAX_BYTES"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _cache_default() -> bool:
    """``False`` (``True`` with ``QNNX_CACHE=1``).

    The default of ``cache``: ``QNNX_CACHE=1`` turns the context cache on for every compile that does not pass it.
    """
    raw = os.environ.get(_CACHE_ENV, "").strip().lower()
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    raise InvalidOptionsError(
        f"{_CACHE_ENV}={os.environ[_CACHE_ENV]!r} is not valid; accepted: 1/true/yes/on or 0/false/no/off."
    )


def _cache_max_default() -> int | None:
    """``None``, or ``QNNX_CACHE_MAX_BYTES`` when it is set."""
    raw = os.environ.get(_CACHE_MAX_ENV, "").strip()
    return _cache_max_bytes(raw, source=_CACHE_MAX_ENV) if raw else None


def _cache_max_bytes(value: object, source: str = "cache_max_bytes") -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidOptionsError(
            f"{source}={value!r} is not valid; accepted: a positive number of bytes (e.g. {20 * 2**30} for 20 GiB), "
            "or None for the cache's default cap (10 GiB)."
        )
    return value


def _soc_model(value: object) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidOptionsError(
            f"soc_model={value!r} is not valid; accepted: a QNN SoC number (e.g. 60) or a chip name "
            "(e.g. 'SC8380XP'), or None for the detected chip."
        )
    import qnnx_detection  # cheap: importing detection does no work

    try:
        return qnnx_detection.resolve_soc_model(value)
    except ValueError as exc:
        raise InvalidOptionsError(f"soc_model={value!r} is not valid: {exc}") from exc


def _cache_dir(value: object) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise InvalidOptionsError(f"cache_dir={value!r} is not valid; accepted: a path (str or os.PathLike) or None.")
    return Path(value).expanduser()


def _installed_provider_options() -> frozenset[str]:
    """The option names the installed onnxruntime-qnn knows (read from its EP library once per process), less
    those qnnx owns; empty when onnxruntime-qnn is missing (then only the listed options are accepted)."""
    import qnnx_detection

    return qnnx_detection.known_provider_options() - frozenset(_OWNED_PROVIDER_OPTIONS)


def _provider_options(value: object) -> tuple[tuple[str, str], ...]:
    if value is None or value == ():
        return ()
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)  # already-normalised pairs, e.g. from attrs.evolve
    if not isinstance(value, Mapping):
        raise InvalidOptionsError(
            f"provider_options={value!r} is not valid; accepted: a dict of QNN EP option names to values."
        )
    pairs = []
    errors = []
    for key, val in value.items():
        if key in _OWNED_PROVIDER_OPTIONS:
            errors.append(f"{key!r} is set by qnnx; use the {_OWNED_PROVIDER_OPTIONS[key]!r} option instead")
        elif key not in PASSTHROUGH_PROVIDER_OPTIONS and key not in _installed_provider_options():
            known = sorted(PASSTHROUGH_PROVIDER_OPTIONS | _installed_provider_options())
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append(f"{key!r} is not an option of the installed QNN EP{hint}")
        elif not isinstance(val, str | int) or isinstance(val, bool):
            errors.append(f"{key!r} has value {val!r}; accepted: str or int")
        else:
            pairs.append((key, str(val)))
    if errors:
        accepted = ", ".join(sorted(PASSTHROUGH_PROVIDER_OPTIONS | _installed_provider_options()))
        raise InvalidOptionsError(
            "provider_options is not valid: " + "; ".join(errors) + f". Accepted keys: {accepted}."
        )
    return tuple(sorted(pairs))


def _tolerance(name: str):
    def convert(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise InvalidOptionsError(f"{name}={value!r} is not valid; accepted: a finite number > 0.")
        return float(value)

    return convert


def _disable_passes(value: object) -> tuple[str, ...]:
    if value is None or value == ():
        return ()
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise InvalidOptionsError(
            f"disable_passes={value!r} is not valid; accepted: a list of qnnx-export rewrite pass names, e.g. "
            "['tile_layernorm_broadcast']."
        )
    import qnnx_export  # the backend runs inside torch.compile: torch is already imported

    known = tuple(qnnx_export.ExportOptions().resolved_passes())
    bad = sorted(str(p) for p in value if p not in known)
    if bad:
        raise InvalidOptionsError(f"disable_passes names unknown pass(es) {bad!r}; accepted: {', '.join(known)}.")
    return tuple(p for p in known if p in value)


def _exporter(value: object) -> str:
    import qnnx_export  # the backend runs inside torch.compile: torch is already imported

    if value not in qnnx_export.EXPORTERS:
        raise InvalidOptionsError(
            f"exporter={value!r} is not valid; accepted: {', '.join(map(repr, qnnx_export.EXPORTERS))} ('auto' "
            "translates the graph directly when qnnx-export covers all its ops and uses torch.onnx otherwise)."
        )
    return str(value)


def _buckets(value: object) -> str | tuple[int, ...] | None:
    if value is None or value == "auto":
        return value
    if (
        isinstance(value, list | tuple)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        return tuple(sorted(set(value)))
    raise InvalidOptionsError(
        f"buckets={value!r} is not valid; accepted: 'auto' (powers of two from 16), a list of positive sizes such as "
        "[32, 64, 128], or None (compile every size exactly)."
    )


def _max_graphs(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionsError(
            f"max_graphs={value!r} is not valid; accepted: an int >= 1 (the static QNN graphs one Dynamo graph with "
            "dynamic sizes may compile; default 8)."
        )
    return value


# The most experts whose grouped product is computed densely (qnnx-export's own default, which a test holds equal):
# on the simulator the dense form took 1.2-5.2x the time of the gathered form at 8 and 32 experts and 3.9-6.4x at 128
# (a one-layer Mixtral at 1 and 16 tokens; docs/benchmarks.md, "Mixture of experts"). Past 32 experts a call with
# more (token, expert) pairs than experts is gathered too, within max_gathered_expert_bytes.
DEFAULT_MAX_DENSE_EXPERTS = 32


def _max_dense_experts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionsError(
            f"max_dense_experts={value!r} is not valid; accepted: an int >= 1 (the most experts of a mixture-of-"
            f"experts layer computed densely, every token by every expert; default {DEFAULT_MAX_DENSE_EXPERTS})."
        )
    return value


# The most bytes of expert weights one grouped expert product gathers for its rows (qnnx-export's own default, which
# a test holds equal): a decode step of Qwen3-30B-A3B gathers 100 MB in float32, GPT-OSS-20B's 265 MB.
DEFAULT_MAX_GATHERED_EXPERT_BYTES = 512 << 20


def _max_gathered_expert_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidOptionsError(
            f"max_gathered_expert_bytes={value!r} is not valid; accepted: an int >= 0 (the most bytes of expert "
            "weights a mixture-of-experts layer gathers for its tokens, 0 for never; default "
            f"{DEFAULT_MAX_GATHERED_EXPERT_BYTES}, 512 MiB)."
        )
    return value


# The weights one QNN HTP context may hold before a graph is split into parts. HTP addresses about 2 GiB per context
# (builds that need more fail with QNN_MEMORY_ALLOCATION_ERROR), and activations, the KV cache and spill-fill
# buffers share it with the weights; published Snapdragon LLM deployments keep each part near 1 GiB of weights.
DEFAULT_MAX_GRAPH_BYTES = 1 << 30


def _max_graph_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionsError(
            f"max_graph_bytes={value!r} is not valid; accepted: a positive int, the most weight bytes one QNN "
            f"context holds before the graph is split into parts (default {DEFAULT_MAX_GRAPH_BYTES}, 1 GiB; e.g. "
            "512 * 2**20)."
        )
    return value


def _partition(value: object) -> str:
    if value not in PARTITIONS:
        raise InvalidOptionsError(
            f"partition={value!r} is not valid; accepted: {', '.join(map(repr, PARTITIONS))} ('auto' splits a graph "
            "between QNN and ONNX Runtime's CPU EP unless strict=True, 'whole' never splits, 'mixed' always may)."
        )
    return str(value)


@attrs.frozen(kw_only=True)
class BackendOptions:
    """Options of ``torch.compile(model, backend="qnn", options={...})``.

    Parsed and validated before any work: an unknown key or a bad value raises
    :class:`~qnnx_backend.errors.InvalidOptionsError` naming the accepted keys or values.
    """

    device: str = attrs.field(
        default="auto",
        converter=_device,
        metadata=not_keyed("the device a context is compiled for is in the key's EP options and target"),
    )
    """``"auto"`` tries the NPU (HTP), then the GPU, then the original PyTorch graph; ``"npu"`` (alias ``"htp"``),
    ``"gpu"``, or ``"cpu"`` (the original PyTorch graph, no ONNX, no QNN)."""

    strict: bool = attrs.field(
        default=False,
        converter=_bool("strict"),  # type: ignore[misc]  # mypy's attrs plugin takes only named converters
        metadata=not_keyed(
            "where a failure goes, not what is compiled",
        ),
    )
    """A failure on the chosen device raises (``QnnDeviceError``, ``UnsupportedGraphError``) naming the device and
    the cause, instead of falling back with one log line. A graph with nothing to compute (every output empty, no
    argument with elements written) is no failure: PyTorch returns its empty outputs."""

    fp16: bool = attrs.field(
        default=False,
        converter=_bool("fp16"),  # type: ignore[misc]  # mypy's attrs plugin takes only named converters
        metadata=keyed(lambda o: {"fp16": str(o.fp16)}),
    )
    """Export the graph in float16: weights and float inputs are cast to fp16 at the ONNX boundary, outputs are cast
    back to the caller's dtype. HTP computes float graphs in fp16 anyway on QAIRT >= 2.35, so on the NPU this halves
    weight memory and the cached context, not precision. See the README's *fp16*."""

    cache: bool = attrs.field(
        factory=_cache_default,
        converter=_bool("cache"),  # type: ignore[misc]  # mypy's attrs plugin takes only named converters
        metadata=not_keyed(
            "whether the cache is used at all",
        ),
    )
    """Keep compiled QNN contexts (EPContext) in a content-addressed cache (qnnx-ctxcache): a later process with the
    same graph, weights, options and versions loads the context without exporting or compiling."""

    cache_max_bytes: int | None = attrs.field(
        factory=_cache_max_default, converter=_cache_max_bytes, metadata=not_keyed("the cache's size cap")
    )
    """Size cap of the cache in bytes; least recently used entries are evicted past it. None: the cache's
    default, 10 GiB."""

    cache_dir: Path | None = attrs.field(
        default=None, converter=_cache_dir, metadata=not_keyed("where the cache lives")
    )
    """Where the cache lives (requires ``cache=True``); None: ``QNNX_CTXCACHE_DIR``, else the platform's user cache
    directory."""

    soc_model: int | None = attrs.field(
        default=None, converter=_soc_model, metadata=not_keyed("the SoC is in the key's EP options and target")
    )
    """Target Snapdragon: a QNN SoC number (``60``) or a chip name (``"SC8380XP"``, ``"SM8650"``, ...). None:
    ``QNNX_SOC_MODEL`` when set, else the detected chip on real hardware and Snapdragon X Elite (60) on the host
    simulator, so that numerics match the device."""

    provider_options: tuple[tuple[str, str], ...] = attrs.field(
        factory=tuple,
        converter=_provider_options,
        metadata=keyed(lambda o: {f"provider.{k}": v for k, v in o.provider_options}),
    )
    """Extra QNN EP options passed through, e.g. ``{"htp_performance_mode": "burst"}``. Names are checked
    against the options the installed onnxruntime-qnn knows (read from its EP library), since ONNX Runtime silently
    ignores unknown keys; a typo is refused with the closest name."""

    verify: bool = attrs.field(
        default=True,
        converter=_bool("verify"),  # type: ignore[misc]  # mypy's attrs plugin takes only named converters
        metadata=not_keyed(
            "a check of the first call, after the compile",
        ),
    )
    """Accuracy guard: the first call of each compiled float graph is compared with eager PyTorch on the same
    inputs, its outputs and what it writes into its arguments (a KV cache), within ``verify_rtol`` and
    ``verify_min_cosine``; a NaN or infinity where eager has none counts as a mismatch. A mismatch sends the graph
    down the device chain with the figures in the report and one ``QnnFallbackWarning`` (raises under ``strict``). The
    first call with a float input beyond float16's range (which HTP gets clipped to +-65504) is compared too: where it
    differs, such calls are computed in PyTorch. It costs one eager run per graph, once (twice with such an input);
    ``False`` skips it (inputs are then clipped unchecked)."""

    verify_rtol: float = attrs.field(
        default=5e-2,
        converter=_tolerance("verify_rtol"),  # type: ignore[misc]  # mypy's attrs plugin takes only named converters
        metadata=not_keyed(
            "a limit of the first-call check",
        ),
    )
    """The accuracy guard's limit on max |qnn - eager| / max |eager| (fp16-level)."""

    verify_min_cosine: float = attrs.field(
        default=0.999,
        converter=_tolerance("verify_min_cosine"),  # type: ignore[misc]  # mypy's attrs plugin takes only named converters
        metadata=not_keyed(
            "a limit of the first-call check",
        ),
    )
    """The accuracy guard's limit on the cosine similarity of the QNN and eager outputs."""

    partition: str = attrs.field(
        default="auto", converter=_partition, metadata=keyed(lambda o: {"partition": o.resolved_partition})
    )
    """``"auto"``: a graph with nodes qnnx-opcheck does not vouch for (or a part QNN fails to finalize, found by
    narrowing) still runs on QNN, with those nodes' op types pinned to ONNX Runtime's CPU EP in the same session,
    when QNN keeps more than half of the graph's nodes (else it runs in PyTorch); under ``strict`` it is
    ``"whole"``. ``"whole"``: a graph runs wholly on QNN or not at all.
    ``"mixed"``: split whatever share stays on QNN. See the README's *Where it runs*."""

    disable_passes: tuple[str, ...] = attrs.field(
        factory=tuple,
        converter=_disable_passes,
        metadata=keyed(lambda o: {"disable_passes": ",".join(o.disable_passes)}),
    )
    """Names of qnnx-export rewrite passes to skip, for debugging. The passes avoid known QNN defects (some
    of them silent wrong results), so keep ``verify`` on when skipping any. Two of them trade speed for precision:
    ``gelu_written_out`` and ``sigmoid_written_out`` compute GELU and Sigmoid (SiLU) in about 25 and 8 elementwise
    ops, because HTP's own Gelu and Sigmoid are several float16 steps off, which compounds through convolution
    stacks to 1-4% of a model's output (``docs/qnn-facts.md``); skipping them keeps HTP's one op."""

    buckets: str | tuple[int, ...] | None = attrs.field(
        default="auto",
        converter=_buckets,
        metadata=not_keyed("which static sizes are compiled: each size is its own graph and key"),
    )
    """Length buckets for dynamic sizes (a sequence length Dynamo marks dynamic after a second shape, or
    ``mark_dynamic``): ``"auto"`` pads each size to the next power of two from 16 (bounded by ``mark_dynamic``'s
    ``max``), a list such as ``[32, 64, 128]`` uses those sizes, None compiles every size exactly. Inputs are padded
    with zeros (an attention mask then masks the padding) and outputs sliced back; padding is used only once eager
    PyTorch proves it neutral for the graph (same outputs at the true and the padded size), else the graph compiles
    exact sizes (an error under ``strict``)."""

    max_graphs: int = attrs.field(
        default=8, converter=_max_graphs, metadata=not_keyed("how many static graphs are compiled, not what each is")
    )
    """Recompile budget of a graph with dynamic sizes: at most this many static QNN graphs, one per concrete
    shape; later new shapes run in PyTorch with one warning naming the shapes seen (an error under ``strict``)."""

    max_graph_bytes: int = attrs.field(
        default=DEFAULT_MAX_GRAPH_BYTES,
        converter=_max_graph_bytes,
        metadata=keyed(lambda o: {"max_graph_bytes": str(o.max_graph_bytes)}),
    )
    """The most weight bytes one QNN context holds (default 1 GiB, under the HTP's about 2 GiB per
    context); float32 weights count as float16 on the NPU, which computes in float16. A larger graph runs as several
    contexts in sequence, cut where the fewest activation bytes cross (between decoder layers or residual blocks).
    See the README's *Large models*."""

    exporter: str = attrs.field(default="auto", converter=_exporter, metadata=keyed(lambda o: {"exporter": o.exporter}))
    """How the graph becomes ONNX. ``"auto"``: qnnx-export's direct ATen->ONNX translator when it covers every op
    of the graph (about 10x faster than torch.onnx; see docs/export.md), ``torch.onnx.export`` otherwise; ``"fast"``:
    the translator or an error; ``"torch.onnx"``: always torch.onnx."""

    max_dense_experts: int = attrs.field(
        default=DEFAULT_MAX_DENSE_EXPERTS,
        converter=_max_dense_experts,
        metadata=keyed(lambda o: {"max_dense_experts": str(o.max_dense_experts)}),
    )
    """A mixture-of-experts layer with transformers' default experts (``grouped_mm``: tokens sorted by expert,
    groups of data-dependent sizes) runs on QNN with static shapes, by gathering each token's experts' weights or by
    multiplying every token by every expert and keeping its own experts' products. The dense form is allowed up to
    this many experts (default 32). See the README's *Mixture-of-experts models*."""

    max_gathered_expert_bytes: int = attrs.field(
        default=DEFAULT_MAX_GATHERED_EXPERT_BYTES,
        converter=_max_gathered_expert_bytes,
        metadata=keyed(lambda o: {"max_gathered_expert_bytes": str(o.max_gathered_expert_bytes)}),
    )
    """The gathered form of a mixture-of-experts layer (one expert product per token and chosen expert) is allowed
    while the expert weights it gathers take at most this many bytes (default 512 MiB; 0: never). It is chosen when
    a call has fewer (token, expert) pairs than experts, as a decode step does, or the layer has more experts than
    ``max_dense_experts``; the dense form otherwise. A layer over both limits runs in PyTorch (an error under
    ``strict``) with a reason naming both options. See the README's *Mixture-of-experts models*."""

    quantize: QuantizeSpec | None = attrs.field(
        default=None,
        converter=parse_quantize,
        metadata=not_keyed("keyed with the calibration data, by the quantized build (Calibration.cache_material)"),
    )
    """Run each graph as a QDQ integer graph after calibrating it with :func:`qnnx_backend.calibrate`:
    ``"a16w8"`` (uint16 activations, uint8 weights; QNN's recommended default), ``"a8w8"``, ``"a16w4"`` (int4
    weights, one scale per output channel), ``"llm-a16w4"`` (the decoder recipe: int4 decoder blocks with one scale
    per 32 inputs, 8-bit head), or a dict of settings (``scheme``, ``activation_type``, ``weight_type``,
    ``per_channel``, ``calibration``, ``keep_float_ops``, ``keep_float_modules``, ``min_sqnr``,
    ``module_weight_types``, ``block_size``); None: float graphs. See the README's *Quantized models*."""

    def __attrs_post_init__(self) -> None:
        if self.quantize is not None and self.fp16:
            raise InvalidOptionsError(
                f"quantize={self.quantize.scheme!r} and fp16=True cannot be combined: a quantized graph is "
                "calibrated and run with float32 inputs. Drop fp16, or drop quantize."
            )
        if self.cache_dir is not None and not self.cache:
            raise InvalidOptionsError(
                f"cache_dir={str(self.cache_dir)!r} is set but cache=False; pass cache=True to use the context "
                "cache, or drop cache_dir."
            )
        if self.cache_max_bytes is not None and not self.cache and _CACHE_MAX_ENV not in os.environ:
            raise InvalidOptionsError(
                f"cache_max_bytes={self.cache_max_bytes} is set but cache=False; pass cache=True to use the "
                "context cache, or drop cache_max_bytes."
            )

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The option names ``torch.compile(..., options=...)`` accepts."""
        return tuple(a.name for a in attrs.fields(cls))

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | BackendOptions | None) -> BackendOptions:
        """Parse ``torch.compile(..., options=...)``; every failure is an InvalidOptionsError."""
        if raw is None:
            return cls()
        if isinstance(raw, BackendOptions):
            return raw
        if not isinstance(raw, Mapping):
            raise InvalidOptionsError(f"options={raw!r} is not valid; accepted: a dict such as {{'device': 'npu'}}.")
        unknown = sorted(str(k) for k in raw if k not in cls.option_names())
        if unknown:
            raise InvalidOptionsError(
                f"unknown option(s) {', '.join(map(repr, unknown))} for backend='qnn'; valid keys: "
                f"{', '.join(cls.option_names())}."
            )
        try:
            return cls(**dict(raw))
        except InvalidOptionsError:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidOptionsError(f"invalid options for backend='qnn': {exc}") from exc

    @property
    def resolved_partition(self) -> str:
        """How a graph may be split: ``"whole"`` (never), ``"mixed"`` (whenever nodes are refused) or ``"auto"``
        (when QNN keeps more than half of the nodes); ``partition="auto"`` under ``strict`` is ``"whole"``."""
        if self.partition == "auto" and self.strict:
            return "whole"
        return self.partition

    def cache_material(self) -> dict[str, str]:
        """The options that change what is compiled (they go into the context-cache key), as each field declares."""
        material: dict[str, str] = {}
        for field in attrs.fields(type(self)):
            declared = field.metadata[CACHE_KEY]
            if callable(declared):
                material.update(declared(self))
        return material


# -- the README's options table ---------------------------------------------------------------------------------------

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :func:`x` -> `x`
_README_SECTION = re.compile(r"([Ss]ee) the README's (\*[^*]+\*)")  # the table stands above those sections


def _markdown(doc: str) -> str:
    """A docstring as one table cell: on one line, reST literals and roles as Markdown code, ``|`` escaped."""
    text = " ".join(doc.split())
    text = _ROLE.sub(r"`\1`", text).replace("``", "`")
    return _README_SECTION.sub(r"\1 \2 below", text).replace("|", "\\|")


def _field_docs() -> dict[str, str]:
    """Each option's docstring, read from this module's source (Python keeps no attribute docstrings)."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == BackendOptions.__name__)
    return {
        node.target.id: doc.value.value
        for node, doc in zip(cls.body, cls.body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(doc, ast.Expr)
        and isinstance(doc.value, ast.Constant)
        and isinstance(doc.value.value, str)
    }


def shown_default(value: object) -> str:
    """A default as the options table shows it: its Python literal (strings in double quotes), as code."""
    return f"`{json.dumps(value)}`" if isinstance(value, str) else f"`{value!r}`"


def _default_cell(field: attrs.Attribute[Any]) -> str:
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # attrs types Factory as a function
        factory = default.factory
        if factory.__module__ == __name__:  # read from the environment: the first line of its docstring says how
            return _markdown((factory.__doc__ or "").strip().split("\n")[0].rstrip("."))
        default = factory()
    return shown_default(default)


def options_table() -> str:
    """The README's options table (Markdown, ending in a newline): a row per option in field order, with its name,
    its default (a factory of this module shows the first line of its docstring) and its docstring."""
    docs = _field_docs()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for field in attrs.fields(BackendOptions):
        if field.name not in docs:
            raise LookupError(f"BackendOptions.{field.name} has no docstring: the options table is written from it")
        rows.append(f"| `{field.name}` | {_default_cell(field)} | {_markdown(docs[field.name])} |")
    return "\n".join(rows) + "\n"
