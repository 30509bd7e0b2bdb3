"""Freeze a Dynamo FX graph into a deterministic ONNX model."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs

from qnnx_export._analysis import GraphAnalysis, analyze
from qnnx_export._complex_core import COMPLEX_OUTPUTS, complex_values
from qnnx_export._fingerprint import weight_digest
from qnnx_export._naming import UniqueNames, identifier, module_origin
from qnnx_export._options import ExportOptions
from qnnx_export._signature import COMPLEX_PARTS, GraphSignature, InputSpec, OutputSlot, RowWriteback, dtype_name
from qnnx_export._torch_onnx import torch_onnx_model
from qnnx_export.errors import ExportError

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir
    import torch

__all__ = ["ExportedGraph", "export"]

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True, eq=False)
class _ParamRecord:
    index: int
    ref: Any  # weakref to the frozen tensor
    data_ptr: int
    version: int


@attrs.frozen(kw_only=True, eq=False)
class ExportedGraph:
    """A frozen ONNX model plus how to call it with Dynamo's arguments.

    The weights are not copied at export: the model's initializers refer to the frozen tensors (and to the
    tensors folded from them). :attr:`model` builds the protobuf (a copy of the weights) on first use;
    :attr:`structure` and :meth:`save` with ``external_data=True`` never hold a second copy of the weights.
    Both refuse (``ExportError``) once a frozen parameter was changed in place or replaced, so a model is
    never written with weights other than those :attr:`weight_digest` names.

    Attributes:
        signature: The mapping between Dynamo arguments/outputs and ONNX inputs/outputs.
        weight_digest: sha256 hex digest of the frozen parameter/buffer bytes.
        passes_applied: Names of the rewrite passes that changed the graph, in order.
        passes_run: Names of every pass that ran (changed the graph or not).
        timings: Seconds per stage (``prepare``, ``translate`` (the direct translator or torch.onnx),
            ``passes``, ``size_check`` (whether the weights go to external data); the model is serialized
            later, on first use of :meth:`model_bytes` or :meth:`save`).
        external_data: True when the weights exceed ``ExportOptions.external_data_threshold``; then
            :meth:`model_bytes` refuses and :meth:`save` writes the weights beside the model.
        opset: The ONNX opset of the default domain.
        node_origins: For each ONNX node the exporter made, where it comes from in the PyTorch model, e.g.
            ``"encoder.layers.0.linear1 (Linear): aten.linear"`` (nodes a rewrite pass created have none). Kept
            beside the model, not in it, so that the model bytes stay deterministic and small.
        exporter: Which exporter made the model: ``"fast"`` (the direct ATen->ONNX translator),
            ``"torch.onnx"``, or ``"none"`` (a graph without ONNX outputs).
        fast_path_declined: Why the direct translator declined the graph (``exporter="auto"`` then
            used torch.onnx), or None.
    """

    signature: GraphSignature
    weight_digest: str
    passes_applied: tuple[str, ...]
    passes_run: tuple[str, ...]
    timings: Mapping[str, float]
    external_data: bool
    opset: int
    _ir_model: Any = attrs.field(repr=False, alias="_ir_model")
    _params: tuple[_ParamRecord, ...] = attrs.field(repr=False, alias="_params")
    _cache: dict[str, Any] = attrs.field(factory=dict, repr=False, alias="_cache")
    node_origins: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    exporter: str = "torch.onnx"
    fast_path_declined: str | None = None

    @property
    def model(self) -> onnx.ModelProto:
        """The ONNX model: parameters and buffers are initializers, user inputs are graph inputs.

        Built on first use and kept (this copies the weights into the protobuf). For an external-data model the
        tensors above 1 KiB are references to ``weights.data`` (for inspection; load it through :meth:`save`).
        """
        cached = self._cache.get("model")
        if cached is None:
            self._require_frozen_weights()
            cached = _external_proto(self._ir_model) if self.external_data else _ir_to_proto(self._ir_model)
            self._cache["model"] = cached
        return cached

    @property
    def structure(self) -> onnx.ModelProto:
        """The model without its weight bytes, cheap at any size: initializers above 1 KiB (1-D integer ones
        above 64 KiB) are external-data references to ``weights.data``, which does not exist. Nodes, inputs,
        outputs, dtypes, shapes and small constants are those of :attr:`model`: what an op checker needs."""
        cached = self._cache.get("structure")
        if cached is None:
            cached = _external_proto(self._ir_model)
            self._cache["structure"] = cached
        return cached

    def _require_frozen_weights(self) -> None:
        # The model holds the frozen tensors' storage: only an in-place write to that storage changes it.
        for rec in self._params:
            t = rec.ref()
            if t is not None and t.data_ptr() == rec.data_ptr and t._version != rec.version:
                raise ExportError(
                    "a frozen parameter or buffer was changed in place or replaced after export, so the model would "
                    "no longer hold the weights it was exported with (weight_digest); export the graph again."
                )

    def model_bytes(self) -> bytes:
        """Return the serialized model (deterministic: same graph and inputs give the same bytes).

        Raises:
            ExportError: The model uses external data (weights above the threshold); use :meth:`save`.
        """
        if self.external_data:
            raise ExportError(
                "this model keeps its weights as external data (they exceed "
                "ExportOptions.external_data_threshold), so it has no single-buffer form; call "
                "ExportedGraph.save(path) and load the model from that path."
            )
        cached = self._cache.get("bytes")
        if cached is None:
            cached = self.model.SerializeToString(deterministic=True)
            self._cache["bytes"] = cached
        return cached

    def save(self, path: str | Path, *, external_data: bool | None = None) -> Path:
        """Write the model to ``path``; external weights go to ``<path name>.data`` beside it.

        Args:
            path: Destination ``.onnx`` file; its directory must exist.
            external_data: True writes every initializer above 1 KiB to ``<path name>.data``, straight from the
                frozen tensors (no copy of the weights in memory; ONNX Runtime memory-maps the file). False
                writes one self-contained file (not possible for an external-data model). None (default):
                external only when :attr:`external_data` is True.

        Returns:
            The path written.

        Raises:
            ExportError: ``external_data=False`` for a model above the protobuf limit, or the weights changed
                since export.
        """
        import onnx_ir as ir

        path = Path(path)
        if external_data is False and self.external_data:
            raise ExportError(
                "this model's weights exceed ExportOptions.external_data_threshold, so it cannot be written as one "
                "file; call save(path) or save(path, external_data=True)."
            )
        if self.external_data or external_data:
            self._require_frozen_weights()
            ir.save(self._ir_model, path, external_data=f"{path.name}.data", size_threshold_bytes=1024)
        else:
            path.write_bytes(self.model_bytes())
        return path

    def params_unchanged(self, args: Sequence[Any]) -> bool:
        """Tell whether the parameter/buffer arguments are still the tensors that were frozen.

        Dynamo passes parameters and buffers on every call. A buffer reassigned in ``forward``
        (``self.count = self.count + 1``) arrives as a new tensor, and an in-place update under
        ``no_grad`` (optimizer step) bumps the tensor's version counter: either way the frozen copy
        is stale and the caller must re-export. Writes through ``.data`` are invisible here.
        """
        for rec in self._params:
            if rec.index >= len(args):
                return False
            t = args[rec.index]
            if rec.ref() is not t or t.data_ptr() != rec.data_ptr or t._version != rec.version:
                return False
        return True


def _attr_name(placeholder_name: str, names: UniqueNames) -> str:
    """A valid, unique module attribute name for a frozen parameter, from Dynamo's placeholder name
    (``l_self_modules_x_parameters_weight_``)."""
    name = identifier(placeholder_name).strip("_") or "param"
    return names(f"p_{name}" if name[0].isdigit() else name)


def _build_frozen_module(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], analysis: GraphAnalysis, options: ExportOptions
) -> tuple[
    Callable[[], torch.fx.GraphModule],
    list[tuple[str, int]],
    list[OutputSlot],
    list[Any],
    Literal["tuple", "list", "single"],
]:
    """Copy ``gm`` into a new graph whose params are attributes (get_attr) and whose fused fast-path
    calls are decomposed. ``gm`` is not modified (Dynamo's calling convention depends on it).

    The first item makes the ``GraphModule`` (its code generation is costly on large graphs); only torch.onnx
    needs it, so the direct translator's path never builds it."""
    import torch
    import torch.fx

    from qnnx_export._decompose import unfuse

    params = set(analysis.param_indices)
    root = torch.nn.Module()
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    used = UniqueNames()
    user_inputs: list[tuple[str, int]] = []
    placeholder_index: dict[torch.fx.Node, int] = {}
    ph_i = 0
    output_node = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            i = ph_i
            ph_i += 1
            placeholder_index[node] = i
            if i in params:
                name = _attr_name(node.name, used)
                root.register_buffer(name, example_inputs[i].detach())
                env[node] = graph.get_attr(name)
                # Its shape and dtype, which the rewrites of unfuse read (the experts' count of a grouped product).
                if "example_value" in node.meta:
                    env[node].meta["example_value"] = node.meta["example_value"]
            else:
                new = graph.placeholder(node.name)
                new.meta = dict(node.meta)
                env[node] = new
                # FX may rename on a clash with a get_attr node: map by the name actually used.
                used.take(new.name)
                user_inputs.append((new.name, i))
            continue
        if node.op == "output":
            output_node = node
            continue
        if node.op in ("get_attr", "call_module"):
            top = str(node.target).split(".")[0]
            if not hasattr(root, top):
                setattr(root, top, getattr(gm, top))
        new = graph.node_copy(node, lambda n: env[n])
        unfuse(
            new,
            max_dense_experts=options.max_dense_experts,
            max_gathered_expert_bytes=options.max_gathered_expert_bytes,
        )
        env[node] = new

    if output_node is None:
        raise ExportError("the graph has no output node; pass the GraphModule Dynamo gave the backend.")
    out_arg = output_node.args[0]
    container: Literal["tuple", "list", "single"] = (
        "list" if isinstance(out_arg, list) else "tuple" if isinstance(out_arg, tuple) else "single"
    )
    elements = list(out_arg) if isinstance(out_arg, (tuple, list)) else [out_arg]
    slots: list[OutputSlot] = []
    onnx_nodes: list[torch.fx.Node] = []
    onnx_index: dict[torch.fx.Node, int] = {}
    bad: list[str] = []
    for pos, el in enumerate(elements):
        if isinstance(el, torch.fx.Node):
            if el.op == "placeholder":
                slots.append(OutputSlot(kind="arg", index=placeholder_index[el]))
            else:
                if el not in onnx_index:
                    onnx_index[el] = len(onnx_nodes)
                    onnx_nodes.append(el)
                # dtype is filled in once the ONNX output dtypes are known.
                slots.append(OutputSlot(kind="onnx", index=onnx_index[el]))
        elif el is None:
            slots.append(OutputSlot(kind="none"))
        elif isinstance(el, (bool, int, float, str)):
            slots.append(OutputSlot(kind="constant", value=el))
        else:
            bad.append(f"output {pos} is a {type(el).__name__} ({el!r})")
    if bad:
        raise ExportError(
            "unsupported graph output structure: " + "; ".join(bad) + ". Graph outputs must be a flat tuple/list "
            "of tensors, None or Python scalars (what Dynamo produces)."
        )
    graph.output(tuple(env[n] for n in onnx_nodes))

    def make_module() -> torch.fx.GraphModule:
        frozen = torch.fx.GraphModule(root, graph, class_name="QnnxFrozenGraph")
        frozen.eval()
        return frozen

    return make_module, user_inputs, slots, onnx_nodes, container


def _export_lifted(
    lifted: tuple[Any, tuple[Any, ...]],
    example_inputs: Sequence[Any],
    analysis: GraphAnalysis,
    user_inputs: Sequence[tuple[str, int]],
    options: ExportOptions,
    declined: BaseException,
) -> tuple[ir.Model, tuple[Any, ...]]:
    """Export the functional trace of a graph whose writes were lifted (``Declined.lifted``) with torch.onnx.

    Its outputs are the graph's results, then what each write returns; every one must stay a distinct ONNX output
    (a written value that is also a result, or a graph input, declines as before). Its ONNX inputs are renamed to
    the names of Dynamo's graph, which the signature uses."""
    traced, writes = lifted
    make_frozen, traced_inputs, _, onnx_nodes, _ = _build_frozen_module(traced, example_inputs, analysis, options)
    (out_arg,) = next(n for n in traced.graph.nodes if n.op == "output").args
    if len(onnx_nodes) != len(out_arg):
        raise ExportError(
            f"the in-place writes of this graph cannot be lifted: the direct translator declines it ({declined}), "
            "and a written value is also a result or an input, which torch.onnx cannot return twice."
        ) from declined
    model = torch_onnx_model(make_frozen(), tuple(example_inputs[i].detach() for _, i in traced_inputs), options.opset)
    by_position = {i: name for name, i in user_inputs}
    traced_names = {name: i for name, i in traced_inputs}
    for value in model.graph.inputs:
        if value.name in traced_names:
            value.name = by_position[traced_names[value.name]]
    return model, writes


def _restore_input_names(model: ir.Model, names: Sequence[str]) -> None:
    """Give torch.onnx's graph inputs the placeholder names again, by position.

    A placeholder that is also a result (an op torch.onnx folds to nothing: ``logsumexp`` of a scalar, ``t`` of a
    1-D tensor, ``max(dim)`` of a scalar) comes back named after the output, and onnx_ir's output fix then renames
    it ``<output>_orig`` behind an Identity. torch.onnx keeps the inputs in the placeholders' order; when the count
    differs nothing is renamed (the signature check then names the mismatch)."""
    inputs = list(model.graph.inputs)
    if len(inputs) != len(names) or all(v.name == n for v, n in zip(inputs, names, strict=True)):
        return
    taken = {v.name for node in model.graph for v in node.outputs} | {v.name for v in model.graph.initializers.values()}
    for value, name in zip(inputs, names, strict=True):
        if value.name != name and name not in taken:
            value.name = name


def _writebacks(writes: Sequence[Any], first: int) -> dict[str, Any]:
    """The signature's write-back fields for the translator's writes, whose outputs start at ONNX output ``first``."""
    whole: list[tuple[int, int]] = []
    rows: list[RowWriteback] = []
    at = first
    for w in writes:
        if w.dim < 0:
            whole.append((at, w.arg))
        else:
            index = at + 1 if w.index_arg < 0 else -1
            rows.append(RowWriteback(arg_index=w.arg, dim=w.dim, values=at, index=index, index_arg=w.index_arg))
        at += w.outputs
    return {"writebacks": tuple(whole), "row_writebacks": tuple(rows)}


def export(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: ExportOptions | None = None,
    analysis: GraphAnalysis | None = None,
) -> ExportedGraph:
    """Export a Dynamo FX graph to a frozen ONNX model.

    Parameters and buffers (lifted to placeholders by Dynamo) become ONNX initializers; user inputs
    stay graph inputs. The QNN-safe rewrite passes of ``options.passes`` run on the result. The same
    graph and inputs give byte-identical :meth:`ExportedGraph.model_bytes`, also across processes.

    Args:
        gm: The graph Dynamo passes to the backend. It is not modified.
        example_inputs: The real example arguments Dynamo passes (parameters included).
        options: Export options (default :class:`ExportOptions`).
        analysis: The :func:`analyze` result for the same graph, to avoid redoing it.

    Returns:
        The :class:`ExportedGraph`.

    Raises:
        ExportError: The graph has problems (all are listed, see :attr:`ExportError.problems`), or the
            exporter failed (the message names the op and cause).
    """
    import torch

    from qnnx_export._passes import run_passes

    options = options if options is not None else ExportOptions()
    t0 = time.perf_counter()
    analysis = analysis if analysis is not None else analyze(gm, example_inputs)
    if options.lift_mutations and not analysis.exportable:
        from qnnx_export._analysis import lift_mutations

        analysis = lift_mutations(analysis) or analysis
    written = analysis.mutated_indices if analysis.exportable else ()
    if written and not options.lift_mutations:
        raise ExportError(
            f"the graph writes in place into argument(s) {list(written)}; export it with "
            "ExportOptions(lift_mutations=True) so the writes come back as outputs."
        )
    if not analysis.exportable:
        lines = "\n".join(f"  - [{p.kind}] {p.detail}" for p in analysis.problems)
        raise ExportError(
            f"the graph cannot be exported faithfully ({len(analysis.problems)} problem(s)):\n{lines}",
            problems=analysis.problems,
        )
    originals = example_inputs
    if complex_values(gm, example_inputs):
        # The analysis found a real-pair rewrite for every complex value: the export reads the rewritten copy.
        # The rewrite's module (with the Fourier transforms' tables, about 2 ms to import) only for such a graph.
        from qnnx_export._complex import as_real_pairs

        try:
            gm, example_inputs = as_real_pairs(gm, example_inputs)
        except ValueError as exc:
            raise ExportError(f"{exc}; ONNX and QNN have no complex type, so run this graph in PyTorch.") from exc
    make_frozen, user_inputs, slots, onnx_nodes, container = _build_frozen_module(gm, example_inputs, analysis, options)
    user_args = tuple(example_inputs[i].detach() for _, i in user_inputs)
    digest = weight_digest(originals, analysis)
    t1 = time.perf_counter()

    exporter, declined, origins_before = "none", None, None
    model: ir.Model | None = None
    writes: tuple[Any, ...] = ()
    if written and options.exporter == "torch.onnx":
        raise ExportError(
            "the graph writes in place into its arguments and torch.onnx drops such writes; use exporter='auto' "
            "or 'fast' (the direct translator returns the written values)."
        )
    if (onnx_nodes or written) and options.exporter != "torch.onnx":
        from qnnx_export import _fast

        try:
            model, origins_before, writes = _fast.translate(
                gm,
                example_inputs,
                param_indices=analysis.param_indices,
                user_inputs=user_inputs,
                outputs=onnx_nodes,
                opset=options.opset,
                written=written,
                max_dense_experts=options.max_dense_experts,
                max_gathered_expert_bytes=options.max_gathered_expert_bytes,
            )
            exporter = "fast"
        except _fast.Declined as exc:
            if written and exc.lifted is not None and options.exporter != "fast":
                # The writes are lifted into a functional trace; only an op lacked a translation. torch.onnx
                # exports that trace, its written values included, instead of Dynamo's graph (whose writes it
                # would drop).
                model, writes = _export_lifted(exc.lifted, example_inputs, analysis, user_inputs, options, exc)
                exporter, declined = "torch.onnx", str(exc)
            elif written:
                raise ExportError(
                    f"the in-place writes of this graph cannot be lifted: the direct translator declines it ({exc}) "
                    "and torch.onnx would drop the writes."
                ) from exc
            elif options.exporter == "fast":
                raise ExportError(
                    f"ExportOptions.exporter='fast' but the direct translator cannot take this graph: {exc}. "
                    "Fix: use exporter='auto' (falls back to torch.onnx) or 'torch.onnx'."
                ) from exc
            else:
                declined = str(exc)
                log.debug("direct translation declined (%s); exporting with torch.onnx", declined)
    if model is None and onnx_nodes:
        model = torch_onnx_model(make_frozen(), user_args, options.opset)
        _restore_input_names(model, [name for name, _ in user_inputs])
        exporter = "torch.onnx"
    elif model is None:
        model = _empty_model(options.opset)
    t2 = time.perf_counter()

    # Record the torch dtypes of the outputs before passes may legalize them (int64 -> int32).
    torch_out_dtypes = [_ir_to_torch_dtype_name(v.dtype) for v in model.graph.outputs]
    if origins_before is None:  # torch.onnx wrote them as node metadata, which _canonicalize clears
        origins_before = {
            n.name: o for n in model.graph if n.name and (o := _origin(n.metadata_props.get("namespace")))
        }
    pass_report = run_passes(model, options.resolved_passes())
    from qnnx_export._host_views import merge_integer_ranks  # onnx_ir: at export time

    input_views, output_views = merge_integer_ranks(model, results=len(onnx_nodes))
    present = {n.name for n in model.graph}
    origins = {name: o for name, o in origins_before.items() if name in present}
    _canonicalize(model)
    t3 = time.perf_counter()

    external = _initializer_bytes(model) > options.external_data_threshold
    t4 = time.perf_counter()

    names = {name: i for name, i in user_inputs}
    from qnnx_export._int_ranges import IntegerOverflow, integer_input_bounds  # onnx_ir: at export time

    try:
        bounds = integer_input_bounds(model)
    except IntegerOverflow as exc:
        raise ExportError(str(exc)) from None
    specs: list[InputSpec] = []
    for value in model.graph.inputs:
        if value.name not in names:
            raise ExportError(
                f"the exported ONNX input {value.name!r} matches no graph placeholder "
                f"({sorted(names)}); this is a qnnx-export bug, please report it."
            )
        i = names[value.name]
        t = example_inputs[i]
        specs.append(
            InputSpec(
                name=value.name,
                arg_index=i,
                dtype=dtype_name(t.dtype),
                onnx_dtype=_ir_to_torch_dtype_name(value.dtype),
                shape=tuple(t.shape),
                max_abs=bounds.get(value.name),
                onnx_shape=input_views.get(value.name),
            )
        )
    complex_outputs = set(gm.meta.get(COMPLEX_OUTPUTS, ()))
    final_slots = [
        OutputSlot(
            kind="onnx",
            index=s.index,
            dtype=_slot_dtype(torch_out_dtypes[s.index], k in complex_outputs),
            shape=output_views.get(s.index),
        )
        if s.kind == "onnx"
        else s
        for k, s in enumerate(slots)
    ]
    signature = GraphSignature(
        inputs=tuple(specs),
        outputs=tuple(final_slots),
        onnx_output_names=tuple(cast(str, v.name) for v in model.graph.outputs),  # exported outputs are named
        onnx_output_dtypes=tuple(_ir_to_torch_dtype_name(v.dtype) for v in model.graph.outputs),
        output_container=container,
        **_writebacks(writes, len(onnx_nodes)),
    )
    if len(signature.onnx_output_names) != len(onnx_nodes) + sum(w.outputs for w in writes):
        raise ExportError(
            f"the model has {len(signature.onnx_output_names)} outputs for {len(onnx_nodes)} results and "
            f"{len(written)} writes; this is a qnnx-export bug, please report it."
        )
    params = tuple(
        _ParamRecord(
            index=i,
            ref=weakref.ref(originals[i]),
            data_ptr=originals[i].data_ptr(),
            version=originals[i]._version,
        )
        for i in analysis.param_indices
        if isinstance(originals[i], torch.Tensor)
    )
    timings = {"prepare": t1 - t0, "translate": t2 - t1, "passes": t3 - t2, "size_check": t4 - t3}
    log.debug("exported graph: %d nodes, timings %s", len(model.graph), timings)
    return ExportedGraph(
        signature=signature,
        weight_digest=digest,
        passes_applied=tuple(r for r, changed in pass_report if changed),
        passes_run=tuple(r for r, _ in pass_report),
        timings=timings,
        external_data=external,
        opset=options.opset,
        node_origins=origins,
        exporter=exporter,
        fast_path_declined=declined,
        _ir_model=model,
        _params=params,
    )


def _slot_dtype(onnx_dtype: str, is_complex: bool) -> str:
    """The dtype an ONNX output slot returns: the ONNX output's, or the complex dtype whose real pair it holds."""
    if not is_complex:
        return onnx_dtype
    pair_of = {real: name for name, real in COMPLEX_PARTS.items()}
    if onnx_dtype not in pair_of:
        raise ExportError(
            f"a complex output came out of the ONNX model as {onnx_dtype}, not as a real pair of "
            f"{sorted(pair_of)}; this is a qnnx-export bug, please report it."
        )
    return pair_of[onnx_dtype]


def _origin(namespace: str | None) -> str | None:
    """Turn torch.onnx's ``namespace`` node metadata into ``"<module path> (<class>): <aten op>"``.

    torch 2.13 writes e.g. ``L['self']: M/L['self'].fc1: torch.nn.modules.linear.Linear/linear: aten.linear.default``.
    """
    if not namespace:
        return None
    scopes = [part.partition(": ") for part in namespace.split("/")]
    module_scopes = [(name, kind) for name, _, kind in scopes[:-1]]
    op = scopes[-1][2].removesuffix(".default") or scopes[-1][0]
    if not module_scopes:
        return op
    name, kind = module_scopes[-1]
    return module_origin(name, kind, op)


def _ir_to_torch_dtype_name(dtype: Any) -> str:
    from onnx_ir.tensor_adapters import to_torch_dtype

    try:
        return dtype_name(to_torch_dtype(dtype))
    except TypeError as exc:
        raise ExportError(f"ONNX dtype {dtype} has no torch equivalent handled by qnnx-export.") from exc


def _empty_model(opset: int) -> ir.Model:
    import onnx_ir as ir

    return ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": opset}, name="main_graph"), ir_version=10)


def _initializer_bytes(model: ir.Model) -> int:
    total = 0
    for value in model.graph.initializers.values():
        if value.const_value is not None:
            total += value.const_value.nbytes
    return total


def _canonicalize(model: ir.Model) -> None:
    """Strip what varies between runs or processes and carries no meaning (doc strings, stack traces)."""
    model.producer_name = "qnnx-export"
    from qnnx_export._version import __version__

    model.producer_version = __version__
    model.doc_string = None
    model.graph.doc_string = None
    model.metadata_props.clear()
    model.graph.metadata_props.clear()
    for node in model.graph.all_nodes() if hasattr(model.graph, "all_nodes") else model.graph:
        node.doc_string = None
        node.metadata_props.clear()
    for value in model.graph.initializers.values():
        value.metadata_props.clear()
        value.doc_string = None


_SWAP_LOCK = threading.Lock()


def _ir_to_proto(model: ir.Model) -> onnx.ModelProto:
    import onnx_ir as ir

    with _SWAP_LOCK:  # not while another thread has swapped tensors out in _external_proto
        return ir.to_proto(model)


def _keeps_data(tensor: Any) -> bool:
    """Small tensors, and 1-D integer ones up to 64 KiB (shapes, indices), keep their bytes in the structure."""
    import onnx_ir as ir

    if tensor.nbytes <= 1024:
        return True
    integer = tensor.dtype in (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8)
    return integer and len(tensor.shape) <= 1 and tensor.nbytes <= 64 * 1024


def _external_proto(model: ir.Model) -> onnx.ModelProto:
    """Return the model proto without weight bytes (big tensors are references to ``weights.data``).

    Used for inspection and op checks; :meth:`ExportedGraph.save` writes the loadable files.
    """
    import onnx_ir as ir

    with _SWAP_LOCK:
        return _external_proto_locked(model, ir)


def _external_proto_locked(model: ir.Model, ir: Any) -> onnx.ModelProto:
    saved: dict[str, Any] = {}
    offset = 0
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or _keeps_data(tensor):
            continue
        saved[name] = tensor
        value.const_value = ir.ExternalTensor(
            location="weights.data",
            offset=offset,
            length=tensor.nbytes,
            dtype=tensor.dtype,
            shape=tensor.shape,
            name=name,
        )
        offset += tensor.nbytes
    try:
        return ir.to_proto(model)
    finally:
        for name, tensor in saved.items():
            model.graph.initializers[name].const_value = tensor
