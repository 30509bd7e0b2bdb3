"""Static checks of a Dynamo FX graph before freezing it into ONNX."""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs

if TYPE_CHECKING:
    import torch

__all__ = [
    "MUTATION_KINDS",
    "GraphAnalysis",
    "Problem",
    "ProblemKind",
    "analyze",
    "is_param_placeholder",
    "lift_mutations",
    "written_arguments",
]

log = logging.getLogger(__name__)

ProblemKind = Literal[
    "input_mutation",
    "buffer_mutation",
    "training_op",
    "requires_grad",
    "dynamic_shape",
    "unsupported_input",
    "empty_tensor",
    "unsupported_value",
]
PROBLEM_KINDS: frozenset[str] = frozenset(get_args(ProblemKind))


@attrs.frozen
class Problem:
    """One reason a graph cannot be frozen into ONNX faithfully.

    Attributes:
        kind: One of ``input_mutation``, ``buffer_mutation``, ``training_op``, ``requires_grad``,
            ``dynamic_shape``, ``unsupported_input``, ``empty_tensor`` (a tensor with zero elements: QNN HTP
            kills the process on them) or ``unsupported_value`` (an intermediate value ONNX or QNN cannot hold
            faithfully, such as a complex tensor).
        detail: A sentence naming the node/op and what goes wrong.
        node: Name of the FX node concerned (``""`` when the problem is graph-wide).
    """

    kind: ProblemKind = attrs.field(validator=attrs.validators.in_(PROBLEM_KINDS))
    detail: str
    node: str = ""


@attrs.frozen(kw_only=True, eq=False)
class GraphAnalysis:
    """What :func:`analyze` learnt about a Dynamo graph.

    Attributes:
        param_indices: Positions (in the Dynamo argument list) of lifted parameters and buffers.
        user_indices: Positions of real user inputs (everything that is not a parameter or buffer).
        problems: Everything that prevents a faithful frozen export; empty when exportable.
        placeholder_names: FX placeholder names, in argument order.
    """

    param_indices: tuple[int, ...]
    user_indices: tuple[int, ...]
    problems: tuple[Problem, ...]
    placeholder_names: tuple[str, ...] = ()
    mutated_indices: tuple[int, ...] = ()
    """Positions of the placeholders the graph writes in place (inputs or buffers): see :func:`lift_mutations`."""
    # Memo for the weight digest so analyze -> fingerprint -> export hashes weights once.
    _memo: dict[Any, Any] = attrs.field(factory=dict, repr=False, alias="_memo")

    @property
    def exportable(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def _placeholder_source(node: Any) -> Any:
    """Return Dynamo's Source for a placeholder, or None when the graph did not come from Dynamo."""
    grapharg = node.meta.get("grapharg")
    if grapharg is not None and getattr(grapharg, "source", None) is not None:
        return grapharg.source
    # torch 2.13 copies the source onto the node before calling the backend
    # (torch/_dynamo/output_graph.py, call_user_compiler) and deletes meta["grapharg"] in cleanup().
    return getattr(node, "_dynamo_source", None)


def is_param_placeholder(node: Any, example: Any) -> bool:
    """Tell whether a placeholder is a lifted parameter/buffer (to freeze) or a user input.

    Uses the private ``torch._dynamo.source.is_from_unspecialized_param_buffer_source`` (torch 2.13;
    Dynamo lifts params/buffers as placeholders since ``inline_inbuilt_nn_modules`` became the
    default in torch 2.5). If that API moves, falls back to the source type name, then to
    ``isinstance(example, nn.Parameter)`` (which misses plain buffers).
    """
    import torch

    source = _placeholder_source(node)
    if source is not None:
        try:
            from torch._dynamo.source import is_from_unspecialized_param_buffer_source

            return bool(is_from_unspecialized_param_buffer_source(source))
        except ImportError:  # pragma: no cover - depends on the torch version
            log.debug("torch._dynamo.source.is_from_unspecialized_param_buffer_source is gone; using fallback")
        cur = source
        while cur is not None:
            if "ParamBufferSource" in type(cur).__name__ or "NNModuleSource" in type(cur).__name__:
                return True
            cur = getattr(cur, "base", None)
        return False
    return isinstance(example, torch.nn.Parameter)


def _is_model_state(node: Any) -> bool:
    """Whether a placeholder is read from an attribute or a global (the model's state, such as Meta's reference
    Llama's plain ``self.freqs_cis``) rather than passed as an argument of the compiled function."""
    source = _placeholder_source(node)
    kinds: list[str] = []
    while source is not None:
        kinds.append(type(source).__name__)
        source = getattr(source, "base", None)
    return bool(kinds) and (kinds[-1] != "LocalSource" or any("Attr" in kind for kind in kinds))


# Ops whose result may share storage with their first argument: an in-place op on their result
# writes into the argument.
_VIEW_METHODS = frozenset(
    {
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "transpose",
        "permute",
        "t",
        "T",
        "mT",
        "expand",
        "expand_as",
        "narrow",
        "select",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "unfold",
        "contiguous",
        "detach",
        "as_strided",
        "chunk",
        "split",
        "unbind",
        "tensor_split",
        "movedim",
        "swapaxes",
        "swapdims",
        "diagonal",
        "real",
        "imag",
        "__getitem__",
        "data",
        "type_as",
        "to",
        "float",
        "type",
        "view_as_real",
        "view_as_complex",
        "split_with_sizes",
        "hsplit",
        "vsplit",
    }
)
_INPLACE_OPERATORS = frozenset(
    {
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
        operator.imatmul,
        operator.setitem,
    }
)
_INPLACE_DUNDERS = frozenset(
    {
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ifloordiv__",
        "__imod__",
        "__ipow__",
        "__iand__",
        "__ior__",
        "__ixor__",
        "__ilshift__",
        "__irshift__",
        "__imatmul__",
        "__setitem__",
    }
)
_DROPOUT_NAMES = frozenset(
    {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "feature_dropout"}
)


def _target_name(node: Any) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", "") or str(target)


def _is_view_like(node: Any) -> bool:
    name = _target_name(node)
    if node.op == "call_method":
        return name in _VIEW_METHODS
    if node.op == "call_function":
        return name in _VIEW_METHODS or node.target is operator.getitem
    return False


def _mutated_arg(node: Any) -> Any:
    """Return the FX node written in place by ``node``, or None."""
    import torch.fx

    if node.op not in ("call_method", "call_function"):
        return None
    name = _target_name(node)
    first = node.args[0] if node.args else None
    if node.op == "call_function" and node.target in _INPLACE_OPERATORS:
        # operator.iadd on a tensor mutates it; on Python numbers Dynamo never emits a node.
        return first if isinstance(first, torch.fx.Node) else None
    if node.kwargs.get("inplace") is True or (
        # F.relu(x, True) / F.dropout(x, p, training, True): the positional inplace flag.
        node.op == "call_function"
        and name in ("relu", "relu6", "elu", "selu", "celu", "leaky_relu", "hardtanh", "silu", "mish")
        and len(node.args) >= 2
        and node.args[-1] is True
    ):
        return first if isinstance(first, torch.fx.Node) else None
    if node.op == "call_function" and name in _DROPOUT_NAMES and len(node.args) >= 4 and node.args[3] is True:
        return first if isinstance(first, torch.fx.Node) else None
    out = node.kwargs.get("out")
    if isinstance(out, torch.fx.Node):
        return out
    if node.op == "call_method" and name in _INPLACE_DUNDERS:
        return first if isinstance(first, torch.fx.Node) else None
    if node.op == "call_function" and getattr(node.target, "__module__", None) == "_operator":
        # Python's operator module: only its i* functions (handled above) write in place; and_, or_, not_
        # (what Dynamo records for &, |, not) end with "_" but write nothing.
        return None
    if name.endswith("set_") and _set_to_itself(node):
        return None
    if name.endswith("_") and not name.endswith("__") and name not in ("requires_grad_",):
        return first if isinstance(first, torch.fx.Node) else None
    return None


def _set_to_itself(node: Any) -> bool:
    """Whether ``node`` is ``x.set_(x.to(...))`` where the ``to`` changes neither dtype nor device, so it returns
    ``x`` itself and the ``set_`` writes nothing: what ``module.to(dtype)`` (or ``.float()``) in a forward records
    for a parameter already of that dtype (Switch Transformers' router casts its classifier each call)."""
    import torch.fx

    if len(node.args) < 2 or not all(isinstance(a, torch.fx.Node) for a in node.args[:2]):
        return False
    x, source = node.args[0], node.args[1]
    if source.op != "call_method" or source.target != "to" or not source.args or source.args[0] is not x:
        return False
    copy_flag = source.kwargs.get("copy", source.args[4] if len(source.args) > 4 else False)
    before, after = x.meta.get("example_value"), source.meta.get("example_value")
    return (
        copy_flag is False
        and isinstance(before, torch.Tensor)
        and isinstance(after, torch.Tensor)
        and before.dtype == after.dtype
        and before.device == after.device
    )


def _node_writes(gm: torch.fx.GraphModule, placeholders: Sequence[Any]) -> Iterator[tuple[Any, list[Any]]]:
    """Each node of ``gm`` (placeholders and output aside) with the placeholders it writes in place, through any
    view of them (sorted by name; usually none)."""
    import torch.fx

    # Alias roots: which placeholders each node may share storage with.
    roots: dict[Any, frozenset[Any]] = {p: frozenset({p}) for p in placeholders}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if _is_view_like(node) and node.args and isinstance(node.args[0], torch.fx.Node):
            roots[node] = roots.get(node.args[0], frozenset())
        mutated = _mutated_arg(node)
        hit = roots.get(mutated, frozenset()) if mutated is not None else frozenset()
        yield node, sorted(hit, key=lambda n: n.name)


def written_arguments(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """Positions of the placeholders ``gm`` writes in place (inputs or buffers), from the graph's structure alone.

    Unlike :func:`analyze`, it reads no example value, so it adds no guard when called on a graph with symbolic
    sizes inside a ``torch.compile`` backend.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return tuple(sorted({placeholders.index(r) for _, roots in _node_writes(gm, placeholders) for r in roots}))


def _training_flag(node: Any) -> str | None:
    """Return a description when ``node`` runs a training-mode op (dropout/batch norm in train mode)."""
    name = _target_name(node)
    args, kwargs = node.args, node.kwargs
    if node.op == "call_module":
        return None  # handled by the caller (needs the module)
    if node.op not in ("call_function", "call_method"):
        return None
    if name in _DROPOUT_NAMES:
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        training = kwargs.get("training", args[2] if len(args) > 2 else True)
        if training is True and p != 0:
            return f"{name}(p={p}, training=True)"
        return None
    if name in ("batch_norm", "_batch_norm_impl_index", "native_batch_norm", "_native_batch_norm_legit"):
        # F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
        # torch.batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn)
        idx = 5
        training = kwargs.get("training", args[idx] if len(args) > idx else False)
        if training is not True:
            return None
        import torch.nn.functional as F

        stats = (1, 2) if node.target is F.batch_norm else (3, 4)
        keys = ("running_mean", "running_var")
        if all(kwargs.get(k, args[i] if len(args) > i else None) is None for k, i in zip(keys, stats, strict=True)):
            # Without running statistics, training mode normalizes by the input's own statistics and updates
            # nothing: a pure function (BiT's weight standardization, a BatchNorm with track_running_stats=False).
            return None
        return f"{name}(training=True)"
    if name in ("instance_norm",):
        use_input_stats = kwargs.get("use_input_stats", args[5] if len(args) > 5 else True)
        running_mean = kwargs.get("running_mean", args[1] if len(args) > 1 else None)
        if use_input_stats is True and running_mean is not None:
            return f"{name}(use_input_stats=True) with running stats (they would be updated)"
    if name in ("rrelu",):
        training = kwargs.get("training", args[3] if len(args) > 3 else False)
        if training is True:
            return f"{name}(training=True)"
    return None


def _is_symbolic(value: Any) -> bool:
    import torch

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        try:
            return any(isinstance(s, torch.SymInt) for s in value.shape)
        except Exception:
            return False
    return False


def _input_problem(index: int, name: str, value: Any, *, param: bool = False) -> Problem | None:
    import torch

    if _is_symbolic(value):
        return Problem(
            kind="dynamic_shape",
            detail=f"Dynamo argument {index} ({name}) is symbolic ({type(value).__name__}); frozen ONNX needs "
            "static shapes: compile with dynamic=False or export per concrete shape.",
            node=name,
        )
    if not isinstance(value, torch.Tensor):
        return Problem(
            kind="unsupported_input",
            detail=f"Dynamo argument {index} ({name}) is a {type(value).__name__}, not a tensor; only tensor "
            "graph inputs can become ONNX inputs.",
            node=name,
        )
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, FakeTensor) or value.device.type == "meta":
        return Problem(
            kind="unsupported_input",
            detail=f"Dynamo argument {index} ({name}) is a fake/meta tensor; pass the real example inputs.",
            node=name,
        )
    # A complex parameter or buffer is frozen as its real pair (_complex.py); a complex user input is not.
    if value.layout != torch.strided or value.is_quantized or (value.is_complex() and not param) or value.is_nested:
        return Problem(
            kind="unsupported_input",
            detail=f"Dynamo argument {index} ({name}) has layout={value.layout}, dtype={value.dtype}; only dense "
            "real (non-quantized, non-complex) tensors are supported as inputs.",
            node=name,
        )
    if value.device.type != "cpu":
        return Problem(
            kind="unsupported_input",
            detail=f"Dynamo argument {index} ({name}) is on device {value.device}; qnnx exports CPU tensors "
            "only (move the model and inputs to 'cpu').",
            node=name,
        )
    return None


def _tensor_leaves(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensor_leaves(v)]
    return []


def _tensor_leaves_nodes(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensor_leaves_nodes(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensor_leaves_nodes(v)]
    return [value]


def _value_problems(gm: Any, example_inputs: Sequence[Any], *, inputs_refused: bool = False) -> list[Problem]:
    """Values QNN must never see: tensors with zero elements anywhere in the graph, and complex values.

    QNN HTP dies with SIGFPE on a zero-element tensor (onnxruntime-qnn 2.4-2.7: ``(x * y).sum(-1)`` on two
    empty vectors, and mm, var, repeat, reflect padding... with an empty input), taking the user's process with
    it; a graph with such a value is never sent to QNN. Complex values have no ONNX type that the exporters
    handle faithfully (they come back with the wrong shape or dtype): the export carries them as real pairs
    (``_complex.py``) when every op on them has a real-pair rewrite, and they stay in PyTorch otherwise (not
    looked for when an input is refused already: a complex user input is one).
    """
    graph = gm.graph
    empty: list[str] = []
    complex_nodes: list[str] = []
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    real = dict(zip(placeholders, example_inputs, strict=False))
    output = next((n for n in graph.nodes if n.op == "output"), None)
    returned = {a for a in _tensor_leaves_nodes(output.args) if isinstance(a, type(output))} if output else set()
    for node in graph.nodes:
        if node.op == "output":
            continue
        value = real.get(node, node.meta.get("example_value", node.meta.get("val")))
        for leaf in _tensor_leaves(value):
            # A complex parameter or buffer is carried as a pair too, so it counts.
            if leaf.is_complex() and node.name not in complex_nodes and not inputs_refused:
                complex_nodes.append(node.name)
            # Empty inputs and outputs are refused here; an empty value inside the graph may be rewritten away
            # (a zero-width slice concatenated back, as Phi-3's partial rotary writes it), and qnnx-opcheck
            # refuses any that reaches the ONNX graph.
            if node.op != "placeholder" and node not in returned:
                continue
            try:
                numel = int(leaf.numel())
            except Exception:  # a symbolic size: the dynamic_shape problem covers it
                continue
            if numel == 0 and node.name not in empty:
                empty.append(node.name)
    problems = []
    if empty:
        problems.append(
            Problem(
                kind="empty_tensor",
                detail=f"{len(empty)} value(s) of the graph have zero elements (first: {empty[0]}); QNN cannot "
                "compute on empty tensors (it stops the process), so this graph runs in PyTorch.",
                node=empty[0],
            )
        )
    if complex_nodes:
        from qnnx_export._complex import refusal

        why = refusal(gm, example_inputs)
        if why is not None:
            problems.append(
                Problem(
                    kind="unsupported_value",
                    detail=f"{len(complex_nodes)} value(s) of the graph are complex (first: {complex_nodes[0]}) and "
                    f"{why}; ONNX and QNN have no complex type, so this graph runs in PyTorch.",
                    node=complex_nodes[0],
                )
            )
    return problems


def analyze(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> GraphAnalysis:
    """Classify the placeholders of a Dynamo graph and find what prevents a faithful frozen export.

    Cheap: walks the graph once, runs nothing.

    Args:
        gm: The FX graph Dynamo passes to a backend (not modified).
        example_inputs: The real example arguments, in placeholder order (parameters included).

    Returns:
        A :class:`GraphAnalysis`. ``analysis.exportable`` is False when some problem was found; all
        problems are reported, not only the first.
    """
    import torch

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        from qnnx_export.errors import ExportError

        raise ExportError(
            f"the graph has {len(placeholders)} placeholders but {len(example_inputs)} example inputs were "
            "given; pass exactly the example_inputs Dynamo handed to the backend."
        )
    problems: list[Problem] = []
    param_idx: list[int] = []
    user_idx: list[int] = []
    kind_of: dict[Any, str] = {}
    for i, (node, value) in enumerate(zip(placeholders, example_inputs, strict=True)):
        # A complex tensor of the model's state is frozen (as its real pair) and watched like a buffer: the
        # export cannot take it as an input, and the watch recompiles when it is replaced or written.
        is_param = is_param_placeholder(node, value) or (
            isinstance(value, torch.Tensor) and value.is_complex() and _is_model_state(node)
        )
        (param_idx if is_param else user_idx).append(i)
        kind_of[node] = "param" if is_param else "user"
        problem = _input_problem(i, node.name, value, param=is_param)
        if problem is None and _is_symbolic(node.meta.get("example_value")):
            problem = Problem(
                kind="dynamic_shape",
                detail=f"placeholder {node.name} has a symbolic shape; compile with dynamic=False.",
                node=node.name,
            )
        if problem is not None:
            problems.append(problem)

    if torch.is_grad_enabled():
        needing = [
            placeholders[i].name
            for i, v in enumerate(example_inputs)
            if isinstance(v, torch.Tensor) and v.requires_grad
        ]
        if needing:
            problems.append(
                Problem(
                    kind="requires_grad",
                    detail=f"grad mode is enabled and {len(needing)} input(s) require grad (e.g. "
                    f"{', '.join(needing[:3])}); a frozen ONNX graph returns outputs without autograd "
                    "history. Call the model under torch.no_grad()/torch.inference_mode() or set "
                    "requires_grad_(False).",
                    node=needing[0],
                )
            )

    written: set[int] = set()
    for node, roots in _node_writes(gm, placeholders):
        for root in roots:
            written.add(placeholders.index(root))
            what = _target_name(node)
            if kind_of[root] == "user":
                problems.append(
                    Problem(
                        kind="input_mutation",
                        detail=f"node {node.name} ({what}) writes in place into user input {root.name}; "
                        "the exported graph cannot update the caller's tensor.",
                        node=node.name,
                    )
                )
            else:
                problems.append(
                    Problem(
                        kind="buffer_mutation",
                        detail=f"node {node.name} ({what}) writes in place into parameter/buffer "
                        f"{root.name}; a frozen copy would go stale after the first call.",
                        node=node.name,
                    )
                )
        flag = _training_flag(node)
        if node.op == "call_module":
            mod = gm.get_submodule(node.target)
            if mod.training and isinstance(
                mod,
                (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm),
            ):
                flag = f"{type(mod).__name__} module in training mode"
        if flag is not None:
            problems.append(
                Problem(
                    kind="training_op",
                    detail=f"node {node.name} runs {flag}; training-mode ops are random or update "
                    "statistics, which a frozen graph cannot reproduce. Call model.eval() first.",
                    node=node.name,
                )
            )
        if _is_symbolic(node.meta.get("example_value")) and not any(p.kind == "dynamic_shape" for p in problems):
            problems.append(
                Problem(
                    kind="dynamic_shape",
                    detail=f"node {node.name} has a symbolic shape; compile with dynamic=False.",
                    node=node.name,
                )
            )
    problems.extend(
        _value_problems(gm, example_inputs, inputs_refused=any(p.kind == "unsupported_input" for p in problems))
    )
    if problems:
        log.debug("analyze found %d problem(s): %s", len(problems), [p.kind for p in problems])
    return GraphAnalysis(
        param_indices=tuple(param_idx),
        user_indices=tuple(user_idx),
        problems=tuple(problems),
        placeholder_names=tuple(p.name for p in placeholders),
        mutated_indices=tuple(sorted(written)),
    )


MUTATION_KINDS: frozenset[str] = frozenset({"input_mutation", "buffer_mutation"})


def lift_mutations(analysis: GraphAnalysis) -> GraphAnalysis | None:
    """The analysis of the same graph with its in-place writes lifted, or None when something else stops it.

    A graph whose only problems are in-place updates of inputs or buffers can still be exported: the written
    tensors become runtime inputs (never frozen), the exported model returns their new values as extra outputs
    (:attr:`GraphSignature.writebacks`), and the caller writes those back after each run. Export such a graph with
    ``ExportOptions(lift_mutations=True)``: only the direct translator captures the writes (torch.onnx drops them),
    so the export fails rather than lose one.
    """
    if not analysis.problems or any(p.kind not in MUTATION_KINDS for p in analysis.problems):
        return None
    written = set(analysis.mutated_indices)
    if not written:
        return None
    return attrs.evolve(
        analysis,
        problems=(),
        param_indices=tuple(i for i in analysis.param_indices if i not in written),
        user_indices=tuple(sorted(set(analysis.user_indices) | written)),
        _memo={},  # the weight digest depends on which placeholders are weights
    )
