"""ONNX -> QDQ ONNX: a float exported graph quantized with onnxruntime's QNN tooling on its calibration inputs, and
its accuracy against float eager PyTorch (SQNR, cosine) (private).

The compile asks for the quantized model through :func:`qnnx_backend._export.export_once` and checks it in
:func:`qnnx_backend._build.build_quantized`; :func:`explain_quantized` is the dry run of both for ``explain``.
"""

from __future__ import annotations

import functools
import logging
import math
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qnnx_backend import _scratch
from qnnx_backend._calibrate import Calibration
from qnnx_backend._quantspec import QuantizeFailed, QuantizeSpec, load_values, module_weight_type, tensor_value
from qnnx_backend._report import QuantizationReport

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_QDQ_OPSET = 21
"""Below opset 21 onnxruntime writes 16-bit QuantizeLinear/DequantizeLinear in the ``com.microsoft`` domain
(onnxruntime 1.32); at 21 they are standard ONNX ops, which qnnx-opcheck's QDQ tables describe."""
_ORT_TYPES = {"uint8": "QUInt8", "int8": "QInt8", "uint16": "QUInt16", "int16": "QInt16", "int4": "QInt4"}
MASK_FILL = -255.0
"""The value an attention mask's -inf becomes in a quantized graph: exp(-255) is 0 in float32 (it underflows past
about -104), so a masked position keeps no weight while its score differs from the kept ones by less than 255; the
masked scores then take at most 255 units of the scores' 16-bit range (0.004 per step). A row with every position
masked (a padding token's row) is told apart by a safe softmax from its maximum, at most the largest score minus
255, against half the fill: right while the scores of a row stay within +-127."""
_SCATTERS = ("ScatterElements", "ScatterND")
"""Ops that write rows into a tensor (a KV cache's ``index_copy_``); they stay in float. On the simulator a QDQ
ScatterElements that wrote a 16-token prompt's rows into a fresh [1, 2, 48, 8] cache (a constant of zeros in the
prefill graph, so a calibrated range of [0, 0]) came back with errors of 1.0-1.25 times the cache's scale, while a
one-row write into a filled cache was right. The cache is a float input or output of the graph either way; the
attention that reads it is quantized."""
_ORT_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def measure(
    program: Any,
    gm: torch.fx.GraphModule,
    args: Sequence[object],
    calibration: Calibration,
    written: Sequence[int] = (),
) -> dict[str, Any]:
    """SQNR (dB), cosine and max |error| of the compiled graph against eager PyTorch over the calibration inputs;
    over several float outputs, the worst of each. Empty when the graph has no float output.

    ``written`` are the argument positions the graph writes into (a KV cache): eager and the program each run on
    their own copies of them, so that neither sees the other's writes nor changes the recorded samples."""
    import torch

    def fresh(k: int) -> list[object]:
        call_args = calibration.args_for(args, k)
        for i in written:
            value = call_args[i]
            if isinstance(value, torch.Tensor):
                call_args[i] = value.clone()
        return call_args

    sums: dict[int, list[float]] = {}  # output index -> [sum ref^2, sum err^2, sum got*ref, sum got^2, max |err|]
    for k in range(len(calibration.samples)):
        with torch.no_grad():
            ref = gm(*fresh(k))
            got = program.run(fresh(k))
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
        self.weight_groups: tuple[str, ...] = ()
        """The quantized weights by type, op and module (:func:`weight_groups`)."""

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


def failure(exc: Exception) -> str:
    """One line naming a failed quantization's exception."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:400]


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over the recorded inputs."""

    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._feeds, None)


def quantize_model(exported: Any, args: Sequence[object], calibration: Calibration) -> QuantizedModel:
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationMethod, QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    spec = calibration.spec
    names = [s.name for s in exported.signature.inputs]
    feeds = [
        {n: t.numpy() for n, t in zip(names, exported.signature.onnx_inputs(calibration.args_for(args, k)))}
        for k in range(len(calibration.samples))
    ]
    folder = _scratch.make_dir("quant")
    try:
        # Every model of the folder keeps its weights in a file beside it, whatever their size: the graph edits
        # below and onnxruntime's config read the structure alone, and only the tools that need the values
        # (the block quantizer, for its weights; onnxruntime's quantizer) load them, once each.
        exported.save(folder / "float.onnx", external_data=True)
        model = onnx.load(str(folder / "float.onnx"), load_external_data=False)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), _QDQ_OPSET)
        if opset < _QDQ_OPSET:
            model = version_converter.convert_version(model, _QDQ_OPSET)
        finite_masks(model, folder)
        untie_transposed_weights(
            model, lambda node: _module_type(node, spec, exported.node_origins) is not None, base_dir=folder
        )
        # onnxruntime's tools are given paths: from a ModelProto they write and re-read temporary copies whose
        # external data they then fail to find (onnxruntime 1.32).
        source = folder / "source.onnx"
        onnx.save_model(model, str(source), save_as_external_data=True, location="source.onnx.data")
        float_io = _io(model)
        del model
        preprocessed = qnn_preprocess_model(
            str(source),
            folder / "pre.onnx",
            fuse_layernorm=True,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            external_data_location="pre.onnx.data",
        )
        if preprocessed:
            source = folder / "pre.onnx"
        kept = _kept_in_float(onnx.load(str(source), load_external_data=False).graph.node, spec, exported.node_origins)
        blocked: dict[str, str] = {}
        if spec.block_size:
            blocked = block_weights(source, folder / "blocks.onnx", spec, exported.node_origins, kept, True)
            if any(not reason for reason in blocked.values()):
                source = folder / "blocks.onnx"
        structure = onnx.load(str(source), load_external_data=False).graph
        initializers = {i.name: tuple(i.dims) for i in structure.initializer}
        overrides = {
            name: [_ort_override(o, QuantType)]
            for name, o in weight_overrides(structure.node, initializers, spec, exported.node_origins).items()
        }
        del structure
        config = get_qnn_qdq_config(
            str(source),
            _Reader(feeds),
            calibrate_method=getattr(CalibrationMethod, _ORT_METHODS[spec.calibration]),
            activation_type=getattr(QuantType, _ORT_TYPES[spec.activation_type]),
            weight_type=getattr(QuantType, _ORT_TYPES[spec.weight_type]),
            per_channel=spec.per_channel,
            init_overrides=overrides or None,
            nodes_to_exclude=kept or None,
        )
        config.use_external_data_format = True
        out = folder / "model_qdq.onnx"
        quantize_calibrated(source, out, config, folder / "ranges.json")
        quantized = onnx.load(str(out), load_external_data=False)
        if _io(quantized) != float_io:
            raise QuantizeFailed(f"the quantized model's inputs/outputs {_io(quantized)} differ from {float_io}")
        groups = weight_groups(quantized, exported.node_origins, {n: r for n, r in blocked.items() if r})
        (folder / "ranges.json").unlink(missing_ok=True)
        for leftover in ("float.onnx", "source.onnx", "pre.onnx", "blocks.onnx"):
            (folder / f"{leftover}.data").unlink(missing_ok=True)
            (folder / leftover).unlink(missing_ok=True)
        result = QuantizedModel(out, exported)
        result.weight_groups = groups
        return result
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def quantize_calibrated(source: Path, out: Path, config: Any, ranges: Path) -> None:
    """onnxruntime's ``quantize(source, out, config)`` for a static QDQ ``config``, in two steps that do not hold the
    float weights together: the calibration first (its model and its session on the CPU EP), its ranges written to
    ``ranges`` (onnxruntime's calibration cache), then ``quantize_static`` from that cache, which loads the float
    model only to quantize it. In one call, the float model loaded for quantization stayed in memory while the
    calibration loaded a second copy and a session a third (a 2-layer Qwen2.5-0.5B-width decoder: 3 GiB above the
    model's own weights).

    The calibration options are the ones ``quantize_static`` hands its calibrator (onnxruntime 1.32)."""
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data
    from onnxruntime.quantization.quantize import quantize_static

    options = config.extra_options
    keys = {
        "CalibTensorRangeSymmetric": "symmetric",
        "CalibMovingAverage": "moving_average",
        "CalibMovingAverageConstant": "averaging_constant",
        "CalibMaxIntermediateOutputs": "max_intermediate_outputs",
        "CalibPercentile": "percentile",
    }
    if options.get("CalibStridedMinMax") or options.get("SmoothQuant"):
        raise QuantizeFailed("strided or SmoothQuant calibration is not used by the backend's configurations")
    with tempfile.TemporaryDirectory(prefix="qnnx-calib-", dir=source.parent) as scratch:
        calibrator = create_calibrator(
            source,
            config.op_types_to_quantize,
            augmented_model_path=str(Path(scratch) / "augmented.onnx"),
            calibrate_method=config.calibrate_method,
            use_external_data_format=True,
            providers=config.calibration_providers,
            extra_options={key: options[name] for name, key in keys.items() if name in options},
        )
        calibrator.collect_data(config.calibration_data_reader)
        save_tensors_data(calibrator.compute_data(), ranges)
        del calibrator
    quantize_static(
        str(source),
        str(out),
        None,
        calibrate_method=config.calibrate_method,
        quant_format=config.quant_format,
        activation_type=config.activation_type,
        weight_type=config.weight_type,
        op_types_to_quantize=config.op_types_to_quantize,
        nodes_to_quantize=config.nodes_to_quantize,
        nodes_to_exclude=config.nodes_to_exclude,
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        use_external_data_format=config.use_external_data_format,
        calibration_providers=config.calibration_providers,
        extra_options=options,
        calibration_cache_path=str(ranges),
    )


def _ort_override(override: Mapping[str, Any], quant_type: Any) -> dict[str, Any]:
    """A :func:`weight_overrides` entry with onnxruntime's ``QuantType`` members for the type names."""
    done = {**override, "quant_type": getattr(quant_type, _ORT_TYPES[override["quant_type"]])}
    if "convert" in override:
        done["convert"] = _ort_override(override["convert"], quant_type)
    return done


def finite_masks(model: Any, base_dir: Path | None = None) -> int:
    """Give the masks of ``model`` a finite fill: each ``Where`` operand that is a constant -inf (an additive
    attention mask) becomes :data:`MASK_FILL`, and a safe softmax's test for fully masked rows
    (``LessOrEqual(ReduceMax(x), t)`` with ``t <= -32768``, as qnnx-export writes it) moves to half the fill.
    Returns how many fills were replaced.

    A quantized tensor has a finite range: calibrating a mask of 0 and -inf gives an infinite scale and NaN zero
    points (onnxruntime 1.32 quantizes them without an error), and a large finite fill would spend the 16 bits of
    the attention scores the mask is added to on the mask. ``base_dir``: where the model's external weights are
    (a candidate fill is read from there; the model is not changed otherwise)."""
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    constants.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant" and n.attribute})
    producers = {o: n for n in graph.node for o in n.output}

    def replace(node: Any, k: int, test: Callable[[Any], bool], fill: float, suffix: str) -> bool:
        tensor = constants.get(node.input[k]) if k < len(node.input) else None
        if tensor is None:
            return False
        value = tensor_value(tensor, base_dir)
        if value.dtype.kind != "f" or value.size == 0 or not bool(np.all(test(value))):
            return False
        name = f"{node.input[k]}_{suffix}"
        if name not in constants:
            constants[name] = numpy_helper.from_array(np.full(value.shape, fill, dtype=value.dtype), name)
            graph.initializer.append(constants[name])
        node.input[k] = name
        return True

    replaced = sum(
        replace(node, k, lambda v: np.isneginf(v), MASK_FILL, "finite_mask")
        for node in graph.node
        if node.op_type == "Where"
        for k in (1, 2)
    )
    if replaced:
        for node in graph.node:
            stat = producers.get(node.input[0]) if node.op_type == "LessOrEqual" else None
            if stat is not None and stat.op_type == "ReduceMax":
                replace(node, 1, lambda v: v <= -32768, MASK_FILL / 2, "finite_mask_test")
        logger.info("qnn backend: %d mask fill(s) of -inf quantized as %g", replaced, MASK_FILL)
    return replaced


def _module_type(node: Any, spec: QuantizeSpec, origins: Any) -> str | None:
    """The weight type a ``module_weight_types`` entry (or the recipe's) gives ``node``'s module; None when the
    scheme's own type applies."""
    module = str(origins.get(node.name, "")).split(" ", 1)[0]
    weight_type = spec.weight_type_of(module)
    return None if weight_type == spec.weight_type else weight_type


def untie_transposed_weights(
    model: Any, wanted: Callable[[Any], bool] = lambda node: True, base_dir: Path | None = None
) -> int:
    """Give each MatMul/Gemm whose weight is a ``Transpose`` of an initializer, and that ``wanted`` accepts, a
    transposed initializer of its own (named as the Transpose's output), and drop the Transpose once nothing else
    reads it. Returns how many weights were written.

    A decoder with tied embeddings (Qwen2.5-0.5B, Llama-3.2-1B, Gemma) exports its head as ``MatMul(x,
    Transpose(table))`` over the embedding's table: onnxruntime's QDQ tooling then sees no weight there and quantizes
    the Transpose's output as an activation (16-bit under ``uint16`` activations), so the head took neither its
    scheme's type nor a scale per output channel, and the table's bytes were held twice at 16 bits (a 2-layer
    Qwen2.5-0.5B-width decoder under ``llm-a16w4``: a context of 538 MiB against 577 MiB in float). With a weight of
    its own, the head is quantized as its module's weight (int8 per output channel in the LLM recipe). The compile
    unties only the layers a module weight type names (the recipe's head): under a plain scheme the head keeps its
    16-bit form, which would otherwise become the scheme's 8-bit weight. ``base_dir``: where the model's external
    weights are; the tables read from there stay external (only the written weights are held in the model)."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, k))
    outputs = {o.name for o in graph.output}
    untied, dropped = 0, []
    for node in graph.node:
        if node.op_type != "Transpose" or node.input[0] not in inits or node.output[0] in outputs:
            continue
        uses = readers.get(node.output[0], [])
        weight_uses = [(n, k) for n, k in uses if n.op_type in ("MatMul", "Gemm") and k == 1 and wanted(n)]
        if not weight_uses:
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        name = node.output[0] if len(weight_uses) == len(uses) else f"{node.output[0]}_weight"
        value = tensor_value(inits[node.input[0]], base_dir).transpose(perm).copy()
        graph.initializer.append(numpy_helper.from_array(value, name))
        for reader, k in weight_uses:
            reader.input[k] = name
        untied += len(weight_uses)
        if len(weight_uses) == len(uses):
            dropped.append(node)
    for node in dropped:
        graph.node.remove(node)
    if untied:
        logger.info("qnn backend: %d MatMul/Gemm weight(s) read through a Transpose given weights of their own", untied)
    return untied


_WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Conv": 1, "ConvTranspose": 1, "Gather": 0}
"""Which input of each weight-carrying op is its weight."""
_SIGNED = ("int8", "int4")


def weight_overrides(
    nodes: Sequence[Any], initializers: Mapping[str, tuple[int, ...]], spec: QuantizeSpec, origins: Any
) -> dict[str, dict[str, Any]]:
    """onnxruntime's tensor overrides (``init_overrides``) for the weights whose type or form differs from what the
    scheme alone gives: a ``module_weight_types`` entry's type; signed weights (int8, int4) symmetric, since QNN HTP
    computed a MatMul of int4 weights with a zero point of -1 wrongly on the simulator (relative error 1.75, where
    the same layer with zero point 0 was right); and with ``per_channel``, signed MatMul/Gemm weights one scale per
    output channel (onnxruntime's ``per_channel`` alone leaves them per tensor). Weight types are names here.

    A Gather's table is quantized as its output (onnxruntime's QDQ tooling gives them one scale): a table that a
    ``module_weight_types`` entry makes narrower than the activations (an 8-bit embedding under 16-bit activations)
    also gets its output's override, the table's type with a conversion to the activation type for the nodes that
    read it, so that no op mixes 8-bit and 16-bit inputs (without it the tooling wrote the table in 8 bits and let
    its readers take the 8-bit tensor as it was)."""
    overrides: dict[str, dict[str, Any]] = {}
    readers: dict[str, set[str]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name)
    for node in nodes:
        k = _WEIGHT_INPUT.get(node.op_type)
        if k is None or len(node.input) <= k or node.input[k] not in initializers or node.input[k] in overrides:
            continue
        name, dims = node.input[k], initializers[node.input[k]]
        module = str(origins.get(node.name, "")).split(" ", 1)[0]
        weight_type = spec.weight_type_of(module)
        signed_table = node.op_type == "Gather" and weight_type == "int8"
        if signed_table:
            # A table is looked up, not multiplied: signed symmetric storage buys it nothing, and the op tables vouch
            # for Gather in QDQ form with uint8 data, not int8 (the decoder trained in the test suite ran its three
            # int8 Gathers and every node reading them on the CPU EP).
            weight_type = "uint8"
        override: dict[str, Any] = {"quant_type": weight_type}
        if weight_type in _SIGNED:
            override["symmetric"] = True
        if spec.per_channel and weight_type in _SIGNED and len(dims) == 2 and node.op_type in ("MatMul", "Gemm"):
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            override["axis"] = 0 if trans_b else 1
        elif spec.per_channel and node.op_type in ("Conv", "ConvTranspose") and weight_type != spec.weight_type:
            override["axis"] = 1 if node.op_type == "ConvTranspose" else 0
        named = module_weight_type(module, spec.module_weight_types) is not None
        narrow_table = node.op_type == "Gather" and (named or signed_table) and weight_type != spec.activation_type
        if weight_type != spec.weight_type or len(override) > 1 or narrow_table:
            overrides[name] = override
        if narrow_table and readers.get(node.output[0]):
            convert = {"quant_type": spec.activation_type, "recv_nodes": readers[node.output[0]]}
            overrides[node.output[0]] = {"quant_type": weight_type, "convert": convert}
    return overrides


def block_plan(
    nodes: Sequence[Any], initializers: Mapping[str, tuple[int, ...]], spec: QuantizeSpec, origins: Any
) -> dict[str, str]:
    """Which int4 MatMul/Gemm weights take ``spec.block_size``: node name -> "" for a node whose weight is written in
    blocks, or the reason it keeps the per-channel form. Other nodes are not named.

    A block must divide the weight's input count K: on onnxruntime-qnn 2.7.0 HTP computed a [200, 128] weight in
    blocks of 16 or 32 (the last block short, as ONNX allows) wrongly (-9.7 dB against the CPU EP's 22 dB) and
    refused blocks of 64 and 128."""
    block = spec.block_size
    uses: dict[str, int] = {}
    for node in nodes:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    plan: dict[str, str] = {}
    for node in nodes:
        if not block or node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        name = node.input[1]
        dims = initializers.get(name)
        module = str(origins.get(node.name, "")).split(" ", 1)[0]
        if dims is None or spec.weight_type_of(module) != "int4":
            continue
        attrs = {a.name: a for a in node.attribute}
        trans_b = "transB" in attrs and attrs["transB"].i
        k = dims[1 if trans_b else 0] if len(dims) == 2 else None
        if k is None:
            plan[node.name] = f"a rank-{len(dims)} weight"
        elif k % block:
            plan[node.name] = f"K={k} is no multiple of {block}"
        elif uses.get(name, 0) > 1:
            plan[node.name] = "a weight shared by several nodes"
        elif node.op_type == "Gemm" and (
            ("transA" in attrs and attrs["transA"].i)
            or any(n in attrs and attrs[n].f != 1.0 for n in ("alpha", "beta"))
            or (len(node.input) > 2 and node.input[2] and node.input[2] not in initializers)
        ):
            plan[node.name] = "a Gemm with transA, alpha, beta or a computed bias"
        else:
            plan[node.name] = ""
    return plan


def block_weights(
    source: Path, out: Path, spec: QuantizeSpec, origins: Any, kept: Sequence[str], big: bool
) -> dict[str, str]:
    """Write ``source``'s int4 MatMul/Gemm weights chosen by :func:`block_plan` block-wise into ``out`` with
    onnxruntime's block quantizer (``MatMulNBitsQuantizer``, QDQ format, symmetric: a block-wise int4
    ``DequantizeLinear`` before the MatMul, which the QDQ tooling then wraps in 16-bit activations: the form HTP
    takes). A chosen Gemm becomes a MatMul (and an Add of its bias) first: the block quantizer takes MatMul only, and
    onnxruntime 1.32's QDQ tooling fails on a Gemm's bias over block-wise weights (it sizes the int32 bias by the
    weight's scales: "cannot reshape array of size 256 into shape (64,)").
    Only the chosen weights are read: the others of an external-data ``source`` stay in its file, which ``out``
    then refers to (``big``: ``out`` writes its own weights beside it too).
    Returns :func:`block_plan`'s answer; nodes keep their names."""
    import onnx
    from onnx import helper, numpy_helper
    from onnxruntime.quantization.quant_utils import QuantFormat

    nbits = import_block_quantizer()
    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    plan = block_plan(graph.node, {n: tuple(i.dims) for n, i in inits.items()}, spec, origins)
    chosen = {name for name, reason in plan.items() if not reason and name not in kept}
    for name, reason in plan.items():
        if reason:
            logger.info("qnn backend: %s keeps int4 per-channel weights (%s)", name, reason)
    if not chosen:
        return {n: r or "kept in float" for n, r in plan.items()}
    for node in graph.node:
        if node.name in chosen:
            load_values(inits[node.input[1]], source.parent)
    rewritten = []
    for node in graph.node:
        if node.op_type != "Gemm" or node.name not in chosen:
            rewritten.append(node)
            continue
        weight = inits[node.input[1]]
        if any(a.name == "transB" and a.i for a in node.attribute):
            value = numpy_helper.to_array(weight).T.copy()
            graph.initializer.remove(weight)
            graph.initializer.append(numpy_helper.from_array(value, weight.name))
        has_bias = len(node.input) > 2 and bool(node.input[2])
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        rewritten.append(helper.make_node("MatMul", [node.input[0], node.input[1]], [product], name=node.name))
        if has_bias:
            add = helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_bias")
            rewritten.append(add)
    del graph.node[:]
    graph.node.extend(rewritten)
    others = [n.name for n in graph.node if n.op_type == "MatMul" and n.name not in chosen]
    config = nbits.DefaultWeightOnlyQuantConfig(
        block_size=spec.block_size, is_symmetric=True, quant_format=QuantFormat.QDQ
    )
    quantizer = nbits.MatMulNBitsQuantizer(model, nodes_to_exclude=others, algo_config=config)
    quantizer.process()
    blocked = quantizer.model.model
    for node in blocked.graph.node:  # the quantizer renames the MatMul; origins are read by name
        if node.op_type == "MatMul" and node.name.endswith("_matmul_Q4") and node.name[: -len("_matmul_Q4")] in chosen:
            node.name = node.name[: -len("_matmul_Q4")]
    onnx.save_model(blocked, str(out), save_as_external_data=big, location=f"{out.name}.data")
    return {n: "" if n in chosen else (r or "kept in float") for n, r in plan.items()}


def import_block_quantizer() -> Any:
    """onnxruntime's ``matmul_nbits_quantizer`` module, imported without the ``logging.basicConfig(level=INFO)`` its
    import runs (onnxruntime 1.32): a library must not configure the process's logging, which would print every
    library's INFO records."""
    import importlib
    import sys

    name = "onnxruntime.quantization.matmul_nbits_quantizer"
    if name in sys.modules:
        return sys.modules[name]
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return importlib.import_module(name)
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


def weight_groups(model: Any, origins: Any, reasons: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The weights of a QDQ model by type, op and module (layer numbers as ``*``), e.g.
    ``"int4 per-channel: 14 MatMul in model.layers.*.mlp.up_proj"`` or ``"int4 blocks of 32: 2 MatMul in ..."``,
    for the report. ``reasons`` (node name -> why) says why a node kept its form where blocks were asked for."""
    import re

    from onnx import TensorProto

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    dequantized = {n.output[0]: n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    counts: dict[tuple[str, str, str], int] = {}
    for node in graph.node:
        k = _WEIGHT_INPUT.get(node.op_type)
        dq = dequantized.get(node.input[k]) if k is not None and len(node.input) > k else None
        if dq is None:
            continue
        dtype = TensorProto.DataType.Name(inits[dq.input[0]].data_type).lower()
        scale = inits.get(dq.input[1])
        form = " per-channel" if scale is not None and len(scale.dims) > 0 and max(scale.dims) > 1 else ""
        block = next((a.i for a in dq.attribute if a.name == "block_size"), 0)
        form = f" blocks of {block}" if block else form
        if reasons and node.name in reasons:
            form = f"{form} ({reasons[node.name]})"
        module = str(origins.get(node.name, "")).split(" ", 1)[0]
        module = re.sub(r"\.\d+(?=\.|$)", ".*", re.sub(r"^\[\d+\]\.", "", module)) or "?"
        key = (f"{dtype}{form}", node.op_type, module)
        counts[key] = counts.get(key, 0) + 1
    return tuple(f"{t}: {n} {op} in {m}" for (t, op, m), n in sorted(counts.items()))


def _kept_in_float(nodes: Sequence[Any], spec: QuantizeSpec, origins: Any) -> list[str]:
    """Names of the ONNX nodes the spec keeps in float: by op type, or by the PyTorch module they come from; and
    the scatters (a KV cache's ``index_copy_``), always: see :data:`_SCATTERS`."""
    kept = [n.name for n in nodes if n.op_type in spec.keep_float_ops or n.op_type in _SCATTERS]
    if spec.keep_float_modules:
        prefixes = tuple(spec.keep_float_modules)
        for n in nodes:
            module = str(origins.get(n.name, "")).split(" ", 1)[0]
            if module and any(module == p or module.startswith(p + ".") for p in prefixes):
                kept.append(n.name)
        if not kept:
            logger.info("qnn backend: keep_float_modules %s matched no ONNX node of this graph", list(prefixes))
    return sorted(set(kept))


def _io(model: Any) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """A model's inputs and outputs (names and element types): the quantized model must keep the float model's,
    since the call path feeds and reads them by name."""
    inits = {i.name for i in model.graph.initializer}
    ins = [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input if i.name not in inits]
    return ins, [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output]


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
        model = quantize_model(exported, args, calibration)
    except Exception as exc:
        failed = f"onnxruntime's quantization failed ({failure(exc)})"
        return exported, QuantizationReport(used=False, reason=failed, **base)
    figures = measure(_CpuRunner(model), gm, args, calibration, analysis.mutated_indices)
    sqnr = figures.get("sqnr_db")
    below = spec.min_sqnr is not None and sqnr is not None and sqnr < spec.min_sqnr
    reason = f"SQNR {sqnr:.1f} dB on the CPU EP is below min_sqnr={spec.min_sqnr:g} dB" if below else None
    return model, QuantizationReport(used=not below, reason=reason, weights=model.weight_groups, **figures, **base)
