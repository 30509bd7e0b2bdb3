"""Quantized graphs: calibration through torch.compile, QDQ quantization with onnxruntime's QNN tooling, and the
accuracy check against float eager PyTorch (private; public as :func:`qnnx_backend.calibrate`).

A graph compiled with the ``quantize`` option has no quantized form until it is calibrated: inside
:func:`calibrate`, its calls run the original graph in eager PyTorch and record copies of the user inputs. On exit,
each recorded graph (each recorded input shape) is exported, quantized by ``onnxruntime.quantization`` with those
inputs, compiled for QNN, and compared with eager PyTorch on the same inputs (SQNR, cosine). Below ``min_sqnr`` the
graph is compiled in float instead (or raises under ``strict``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import logging
import math
import shutil
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from qnnx_backend._quantspec import QuantizeSpec
from qnnx_backend._report import QuantizationReport
from qnnx_backend.errors import QnnFallbackWarning, QuantizationError

if TYPE_CHECKING:
    import torch

    from qnnx_backend._build import CompileContext
    from qnnx_backend._program import Program

logger = logging.getLogger(__name__)

_QDQ_OPSET = 21
"""Below opset 21 onnxruntime writes 16-bit QuantizeLinear/DequantizeLinear in the ``com.microsoft`` domain
(onnxruntime 1.32); at 21 they are standard ONNX ops, which qnnx-opcheck's QDQ tables describe."""
_ORT_TYPES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16"}
_ORT_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
_HOW_TO = (
    "Calibrate it first: `with qnnx_backend.calibrate(compiled): compiled(x)` for a few representative inputs "
    "(each input shape that should run quantized)"
)


class QuantizeFailed(Exception):
    """onnxruntime's quantization of a graph failed (internal to the backend)."""


@attrs.frozen(eq=False)
class Calibration:
    """The recorded inputs of one static graph, as passed down to its compile.

    ``positions`` are argument positions (in the compiled graph's argument list) of the recorded user inputs;
    ``samples`` holds one tuple of tensors per recorded call, in ``positions`` order.
    """

    spec: QuantizeSpec
    positions: tuple[int, ...]
    samples: tuple[tuple[torch.Tensor, ...], ...]

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of the calibration inputs (dtype, shape and bytes of each, in order)."""
        import torch

        h = hashlib.sha256()
        for sample in self.samples:
            for t in sample:
                t = t.detach().contiguous().cpu()
                h.update(f"{t.dtype}{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def cache_material(self) -> dict[str, str]:
        """What the quantized model depends on besides the graph: the settings and the calibration data."""
        return {**self.spec.cache_material(), "quantize.calibration_sha256": self.digest}

    def args_for(self, template: Sequence[object], k: int) -> list[object]:
        """The graph's full argument list for calibration sample ``k``."""
        args = list(template)
        for pos, tensor in zip(self.positions, self.samples[k], strict=True):
            args[pos] = tensor
        return args

    def without(self, dropped: Sequence[int]) -> Calibration:
        """The same calibration for the graph with the arguments at ``dropped`` removed (symbolic sizes)."""
        gone = sorted(dropped)
        return attrs.evolve(self, positions=tuple(p - sum(1 for d in gone if d < p) for p in self.positions))


@attrs.define
class _Recording:
    template: list[object]
    positions: tuple[int, ...]
    grad: bool
    samples: list[tuple[torch.Tensor, ...]] = attrs.field(factory=list)


class _Session:
    """The graphs called inside one :func:`calibrate` block, with their recorded inputs per input shape."""

    def __init__(self) -> None:
        self.graphs: dict[Any, dict[tuple[object, ...], _Recording]] = {}

    def record(self, graph: Any, args: Sequence[object]) -> Any:
        import torch

        key = _key(graph, args)
        per_key = self.graphs.setdefault(graph, {})
        rec = per_key.get(key)
        if rec is None:
            import qnnx_export

            user = qnnx_export.analyze(graph._gm, args).user_indices
            positions = tuple(i for i in user if isinstance(args[i], torch.Tensor))
            template = [_copy(a) if i in positions else a for i, a in enumerate(args)]
            rec = per_key[key] = _Recording(template=template, positions=positions, grad=torch.is_grad_enabled())
        rec.samples.append(tuple(_copy(args[i]) for i in rec.positions))
        return graph._gm(*args)


def _copy(value: Any) -> Any:
    import torch

    return value.detach().clone() if isinstance(value, torch.Tensor) else value


_ACTIVE: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("qnnx_calibrating", default=None)


@contextlib.contextmanager
def calibrate(compiled: Any) -> Iterator[None]:
    """Calibrate a model compiled with ``options={"quantize": ...}`` on the inputs it is called with in the block.

    Inside the block, each Dynamo graph compiled with ``quantize`` runs the original PyTorch graph and records a
    copy of its inputs; graph breaks are fine, and every input shape seen is calibrated. On a normal exit each
    recorded graph is quantized with onnxruntime's QNN tooling, compiled for QNN and compared with eager PyTorch on
    the recorded inputs (the figures are in :func:`qnnx_backend.compile_reports`); later calls run the quantized
    graphs. Calibrating again replaces the quantized graphs of the shapes seen.

    The block records the quantizing graphs called in the current thread (or asyncio task), which are those of
    ``compiled`` when only it is called inside the block.

    Example::

        compiled = torch.compile(model.eval(), backend="qnn", options={"quantize": "a16w8"})
        with torch.no_grad():
            with qnnx_backend.calibrate(compiled):
                for x in samples:
                    compiled(x)
            y = compiled(x)  # quantized, on the NPU

    Raises:
        TypeError: ``compiled`` is not what ``torch.compile`` returns.
        QuantizationError: the block is nested in another one, or no graph compiled with ``quantize`` ran inside
            it; under ``strict=True``, a graph that cannot run quantized (see :class:`QuantizationError`).
    """
    if not hasattr(compiled, "_torchdynamo_orig_callable"):
        raise TypeError(
            f"calibrate() takes what torch.compile returns (a compiled module or function), not "
            f"{type(compiled).__name__}: compiled = torch.compile(model, backend='qnn', options={{'quantize': "
            "'a16w8'}}), then `with qnnx_backend.calibrate(compiled): compiled(x)`."
        )
    if _ACTIVE.get() is not None:
        raise QuantizationError("calibrate() blocks cannot be nested; close the first block before opening another")
    session = _Session()
    token = _ACTIVE.set(session)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
    if not session.graphs:
        raise QuantizationError(
            "no graph compiled with the quantize option ran inside calibrate(): compile the model with "
            "torch.compile(model, backend='qnn', options={'quantize': 'a16w8'}) and call the compiled model inside "
            "the block"
        )
    for graph, per_key in session.graphs.items():
        for key, rec in per_key.items():
            calibration = Calibration(
                spec=graph._options.quantize,
                positions=rec.positions,
                samples=tuple(rec.samples),
            )
            _install(graph, key, rec.template, calibration, rec.grad)


def _key(graph: Any, args: Sequence[object]) -> tuple[object, ...]:
    return tuple(int(args[i]) for i in graph._sym_positions)


def _install(graph: Any, key: tuple[object, ...], args: list[object], calibration: Calibration, grad: bool) -> None:
    import torch

    from qnnx_backend._compiled import _compiling, _gc_paused

    with torch.set_grad_enabled(grad), graph._lock, _compiling(), _gc_paused():
        graph._variants[key] = _compile_variant(graph, args, calibration)


def _compile_variant(graph: Any, args: Sequence[object], calibration: Calibration) -> Any:
    from qnnx_backend._compiled import _Specialized, specialize

    if graph._sym_positions:
        static = specialize(graph._gm, args, graph._sym_positions)
        rest = [a for i, a in enumerate(args) if i not in graph._sym_positions]
        inner = graph._compile(static, rest, calibration=calibration.without(graph._sym_positions))
        return _Specialized(inner, graph._sym_positions)
    return graph._compile(graph._gm, list(args), calibration=calibration)


def call_quantizing(graph: Any, args: Sequence[object]) -> Any:
    """``QnnGraph.__call__`` of a graph compiled with ``quantize``: record under :func:`calibrate`, else run the
    quantized variant of this shape (a shape never calibrated runs in float with a warning, or raises under
    strict)."""
    session = _ACTIVE.get()
    if session is not None:
        return session.record(graph, args)
    key = _key(graph, args)
    variant = graph._known_variant(key)
    if variant is None:
        from qnnx_backend._compiled import _compiling, _gc_paused

        with graph._lock, _compiling(), _gc_paused():
            variant = graph._variants.get(key)
            if variant is None:
                if graph._options.strict:
                    sizes = f" for the input sizes {list(key)}" if key else ""
                    raise QuantizationError(
                        f"qnn backend: a graph compiled with quantize={graph._options.quantize.scheme!r} was called "
                        f"before it was calibrated{sizes}. {_HOW_TO}."
                    )
                # No samples: compiled in float, with the warning and report of a graph that is not quantized.
                empty = Calibration(spec=graph._options.quantize, positions=(), samples=())
                variant = _compile_variant(graph, args, empty)
                graph._variants[key] = variant
    return variant(args)


# -- compile ---------------------------------------------------------------------------------------------------


def build_program(ctx: CompileContext, device: str, graph_id: int) -> tuple[Program, QuantizationReport]:
    """Compile the quantized graph for ``device`` and check it against eager PyTorch on the calibration inputs;
    a graph that cannot run quantized is compiled in float (raises QuantizationError under strict).

    Raises DeviceRejected (from the float build) when the device cannot take the graph at all.
    """
    from qnnx_backend._build import build_program as build
    from qnnx_backend._session import DeviceRejected

    calibration = ctx.calibration
    assert calibration is not None, "the quantized build needs the graph's calibration"
    gm, args, opts, timings = ctx.gm, ctx.args, ctx.options, ctx.timings
    spec = calibration.spec
    base: dict[str, Any] = {
        "scheme": spec.label,
        "activation_type": spec.activation_type,
        "weight_type": spec.weight_type,
        "samples": len(calibration.samples),
        "calibration_sha256": calibration.digest,
        "min_sqnr": spec.min_sqnr,
    }
    figures: dict[str, Any] = {}
    if not calibration.samples:
        reason = f"it was not calibrated. {_HOW_TO}"
    elif ctx.analysis.mutated_indices:
        reason = "it writes in place into its arguments, which quantization does not support"
    else:
        try:
            program = build(ctx, device)
        except (QuantizeFailed, DeviceRejected) as exc:
            reason = f"the quantized graph was not compiled ({exc})"
        else:
            t = time.perf_counter()
            figures = measure(program, gm, args, calibration)
            timings["quantize_check"] = time.perf_counter() - t
            sqnr = figures.get("sqnr_db")
            if spec.min_sqnr is None or sqnr is None or sqnr >= spec.min_sqnr:
                return program, QuantizationReport(used=True, **figures, **base)
            reason = (
                f"its SQNR against float eager PyTorch is {sqnr:.1f} dB (cosine {figures['cosine']:.5f}), below "
                f"min_sqnr={spec.min_sqnr:g} dB"
            )
    if opts.strict:
        fix = (
            "Calibrate first"
            if not calibration.samples
            else "Use a wider scheme ('a16w8', per_channel), keep "
            "sensitive ops in float (keep_float_ops), lower min_sqnr, or pass strict=False to run it in float"
        )
        raise QuantizationError(f"qnn backend: graph {graph_id} cannot run quantized: {reason}. {fix}.")
    warnings.warn(
        f"qnn backend: graph {graph_id} runs in float on {device}: {reason}", QnnFallbackWarning, stacklevel=6
    )
    program = build(ctx.in_float(), device)
    return program, QuantizationReport(used=False, reason=reason, **figures, **base)


def measure(program: Any, gm: torch.fx.GraphModule, args: Sequence[object], calibration: Calibration) -> dict[str, Any]:
    """SQNR (dB), cosine and max |error| of the compiled graph against eager PyTorch over the calibration inputs;
    over several float outputs, the worst of each. Empty when the graph has no float output."""
    import torch

    sums: dict[int, list[float]] = {}  # output index -> [sum ref^2, sum err^2, sum got*ref, sum got^2, max |err|]
    for k in range(len(calibration.samples)):
        call_args = calibration.args_for(args, k)
        with torch.no_grad():
            ref = gm(*call_args)
            got = program.run(call_args)
        ref_leaves = [t for t in torch.utils._pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
        got_leaves = [t for t in torch.utils._pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
        for j, (g, r) in enumerate(zip(got_leaves, ref_leaves, strict=True)):
            if not (g.is_floating_point() and r.is_floating_point()) or r.numel() == 0:
                continue
            g64, r64 = g.detach().double().flatten(), r.detach().double().flatten()
            err = g64 - r64
            acc = sums.setdefault(j, [0.0, 0.0, 0.0, 0.0, 0.0])
            acc[0] += float(r64 @ r64)
            acc[1] += float(err @ err)
            acc[2] += float(g64 @ r64)
            acc[3] += float(g64 @ g64)
            acc[4] = max(acc[4], float(err.abs().max()))
    if not sums:
        return {}
    sqnrs, cosines = [], []
    for signal, noise, dot, got_sq, _ in sums.values():
        sqnrs.append(math.inf if noise == 0 else (-math.inf if signal == 0 else 10 * math.log10(signal / noise)))
        denom = math.sqrt(signal * got_sq)
        cosines.append(dot / denom if denom > 0 else (1.0 if noise == 0 else 0.0))
    return {"sqnr_db": min(sqnrs), "cosine": min(cosines), "max_abs_error": max(a[4] for a in sums.values())}


# -- ONNX -> QDQ ONNX ------------------------------------------------------------------------------------------


class QuantizedModel:
    """A float exported graph quantized to QDQ: what ``_session`` needs of an exported graph (signature,
    structure, save), the quantized model living in a temporary folder removed with this object."""

    def __init__(self, path: Path, exported: Any) -> None:
        self.path = path
        self._remove = weakref.finalize(self, shutil.rmtree, str(path.parent), True)
        self.signature = exported.signature
        self.passes_applied = exported.passes_applied
        self.node_origins = exported.node_origins
        self.exporter = exported.exporter
        self.external_data = exported.external_data

    @functools.cached_property
    def structure(self) -> Any:
        import onnx

        return onnx.load(str(self.path), load_external_data=False)

    def save(self, path: str | Path, *, external_data: bool | None = None) -> Path:
        import onnx

        path = Path(path)
        model = onnx.load(str(self.path))
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=bool(external_data or self.external_data),
            location=f"{path.name}.data",
            size_threshold=1024,
        )
        return path


def quantized_model(exported: Any, ctx: CompileContext) -> QuantizedModel:
    """The QDQ model of ``exported`` for ``ctx.calibration``, made once per graph (``ctx.memo``); raises
    QuantizeFailed, with the same cause for every device once it failed."""
    memo = ctx.memo
    if memo.quantize_refusal is not None:
        raise QuantizeFailed(memo.quantize_refusal)
    if memo.quantized is None:
        assert ctx.calibration is not None
        t = time.perf_counter()
        try:
            memo.quantized = _quantize(exported, ctx.args, ctx.calibration)
        except Exception as exc:
            memo.quantize_refusal = _failure(exc)
            raise QuantizeFailed(memo.quantize_refusal) from exc
        finally:
            ctx.timings["quantize"] = time.perf_counter() - t
    quantized: QuantizedModel = memo.quantized
    return quantized


def _failure(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:400]


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over the recorded inputs."""

    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._feeds, None)


def _quantize(exported: Any, args: Sequence[object], calibration: Calibration) -> QuantizedModel:
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    spec = calibration.spec
    names = [s.name for s in exported.signature.inputs]
    feeds = [
        {n: t.numpy() for n, t in zip(names, exported.signature.onnx_inputs(calibration.args_for(args, k)))}
        for k in range(len(calibration.samples))
    ]
    folder = Path(tempfile.mkdtemp(prefix="qnnx-quant-"))
    try:
        big = bool(exported.external_data)
        exported.save(folder / "float.onnx", external_data=True)
        model = onnx.load(str(folder / "float.onnx"))
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), _QDQ_OPSET)
        if opset < _QDQ_OPSET:
            model = version_converter.convert_version(model, _QDQ_OPSET)
        # onnxruntime's tools are given paths: from a ModelProto they write and re-read temporary copies whose
        # external data they then fail to find (onnxruntime 1.32).
        source = folder / "source.onnx"
        onnx.save_model(model, str(source), save_as_external_data=big, location="source.onnx.data")
        if qnn_preprocess_model(str(source), folder / "pre.onnx", fuse_layernorm=True, save_as_external_data=big):
            source = folder / "pre.onnx"
        nodes = onnx.load(str(source), load_external_data=False).graph.node
        config = get_qnn_qdq_config(
            str(source),
            _Reader(feeds),
            calibrate_method=getattr(CalibrationMethod, _ORT_METHODS[spec.calibration]),
            activation_type=getattr(QuantType, _ORT_TYPES[spec.activation_type]),
            weight_type=getattr(QuantType, _ORT_TYPES[spec.weight_type]),
            per_channel=spec.per_channel,
            nodes_to_exclude=_kept_in_float(nodes, spec, exported.node_origins) or None,
        )
        config.use_external_data_format = big
        out = folder / "model_qdq.onnx"
        quantize(str(source), out, config)
        _check_io(onnx.load(str(out), load_external_data=False), model)
        for leftover in ("float.onnx", "source.onnx", "pre.onnx"):
            (folder / f"{leftover}.data").unlink(missing_ok=True)
            (folder / leftover).unlink(missing_ok=True)
        return QuantizedModel(out, exported)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _kept_in_float(nodes: Sequence[Any], spec: QuantizeSpec, origins: Any) -> list[str]:
    """Names of the ONNX nodes the spec keeps in float: by op type, or by the PyTorch module they come from."""
    kept = [n.name for n in nodes if n.op_type in spec.keep_float_ops]
    if spec.keep_float_modules:
        prefixes = tuple(spec.keep_float_modules)
        for n in nodes:
            module = str(origins.get(n.name, "")).split(" ", 1)[0]
            if module and any(module == p or module.startswith(p + ".") for p in prefixes):
                kept.append(n.name)
        if not kept:
            logger.info("qnn backend: keep_float_modules %s matched no ONNX node of this graph", list(prefixes))
    return sorted(set(kept))


def _check_io(quantized: Any, original: Any) -> None:
    """The quantized model must keep the float model's inputs and outputs (names and float types): the call path
    feeds and reads them by name."""

    def io(m: Any) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        inits = {i.name for i in m.graph.initializer}
        ins = [(i.name, i.type.tensor_type.elem_type) for i in m.graph.input if i.name not in inits]
        return ins, [(o.name, o.type.tensor_type.elem_type) for o in m.graph.output]

    if io(quantized) != io(original):
        raise QuantizeFailed(f"the quantized model's inputs/outputs {io(quantized)} differ from {io(original)}")


class _CpuRunner:
    """Runs a QDQ model on ONNX Runtime's CPU EP (which computes the quantized arithmetic) with Dynamo's
    arguments, for :func:`explain_quantized`."""

    def __init__(self, model: QuantizedModel) -> None:
        import onnxruntime

        self._model = model
        self._session = onnxruntime.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])

    def run(self, args: Sequence[object]) -> Any:
        import torch

        signature = self._model.signature
        feed = {s.name: t.numpy() for s, t in zip(signature.inputs, signature.onnx_inputs(args), strict=True)}
        return signature.assemble([torch.from_numpy(o) for o in self._session.run(None, feed)], args)


def explain_quantized(
    exported: Any, gm: torch.fx.GraphModule, args: Sequence[object], spec: QuantizeSpec, analysis: Any
) -> tuple[Any, QuantizationReport]:
    """For :func:`qnnx_backend.explain`: the QDQ model of ``exported`` calibrated on the example inputs alone, and
    its figures against eager PyTorch computed on ONNX Runtime's CPU EP (no QNN session is needed). Returns the
    float model and a report saying why when quantization fails."""
    import torch

    positions = tuple(i for i in analysis.user_indices if isinstance(args[i], torch.Tensor))
    calibration = Calibration(spec=spec, positions=positions, samples=(tuple(args[i] for i in positions),))
    base: dict[str, Any] = {
        "scheme": spec.label,
        "activation_type": spec.activation_type,
        "weight_type": spec.weight_type,
        "samples": 1,
        "calibration_sha256": calibration.digest,
        "min_sqnr": spec.min_sqnr,
    }
    try:
        model = _quantize(exported, args, calibration)
    except Exception as exc:
        failed = f"onnxruntime's quantization failed ({_failure(exc)})"
        return exported, QuantizationReport(used=False, reason=failed, **base)
    figures = measure(_CpuRunner(model), gm, args, calibration)
    sqnr = figures.get("sqnr_db")
    below = spec.min_sqnr is not None and sqnr is not None and sqnr < spec.min_sqnr
    reason = f"SQNR {sqnr:.1f} dB on the CPU EP is below min_sqnr={spec.min_sqnr:g} dB" if below else None
    return model, QuantizationReport(used=not below, reason=reason, **figures, **base)
