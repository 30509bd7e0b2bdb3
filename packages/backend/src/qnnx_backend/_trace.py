"""The trace stage: Dynamo's graph and example inputs as the compile takes them (private).

A graph with symbolic sizes is specialized into static copies; the example inputs are remembered weakly (saving a
never-called graph compiles it from them); and every compile step runs under the process-global guards below
(Dynamo's compile lock, Python's garbage collector held off).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from qnnx_backend.errors import SavedGraphError


def is_symbolic(value: object) -> bool:
    return isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool)


def size_positions(example_inputs: Sequence[object]) -> tuple[int, ...]:
    """The positions of Dynamo's size arguments (symbolic or plain ints) among a graph's example inputs."""
    return tuple(
        i for i, a in enumerate(example_inputs) if is_symbolic(a) or (isinstance(a, int) and not isinstance(a, bool))
    )


def symbolic_dims(gm: torch.fx.GraphModule, sym_positions: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``(argument position, dim)`` of every symbolic dim of a tensor placeholder, where Dynamo passes no size
    argument for it.

    Dynamo marks a dim dynamic when one frame meets two sizes (T5-style attention called for the encoder's and the
    decoder's lengths in one forward), and it lifts a size argument only where the graph reads the size: the
    tensor's own example value is then the only record of the dim. Such a graph compiles one static variant per
    concrete size, like one with size arguments. (A dim Dynamo specialized to a constant but still typed as symbolic
    varies with nothing: see :func:`typed_symbolic`.)"""
    found: list[tuple[int, int]] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    passed: set[Any] = set()  # the symbols the size arguments carry
    for i in sym_positions:
        size = placeholders[i].meta.get("example_value")
        if isinstance(size, torch.SymInt):
            passed |= size.node.expr.free_symbols
    for i, node in enumerate(placeholders):
        value = node.meta.get("example_value")
        if i in sym_positions or not isinstance(value, torch.Tensor):
            continue
        for d, size in enumerate(value.shape):
            symbols = size.node.expr.free_symbols if isinstance(size, torch.SymInt) else None
            if symbols and not symbols <= passed:
                found.append((i, d))
    return tuple(found)


def typed_symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether a tensor placeholder's example value has a dim typed as symbolic, one Dynamo specialized to a
    constant included: such a graph needs its static copy (:func:`specialize`) even when no size varies."""
    for node in gm.graph.nodes:
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and any(isinstance(size, torch.SymInt) for size in value.shape):
            return True
    return False


def dims_key(args: Sequence[object], sym_dims: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """The concrete sizes of ``sym_dims`` in a call's arguments."""
    return tuple(int(args[i].shape[d]) for i, d in sym_dims)  # type: ignore[attr-defined]


def scalar_positions(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The positions of the 0-d tensor arguments that the graph reads only through ``.item()``.

    Where Dynamo does not specialize Python floats (``torch.compile(dynamic=True)``, or a float that changed between
    calls), it passes each one as a 0-d tensor and reads it back with ``.item()`` inside the graph: a module's
    ``eps``, a dropout's ``p``, an attention's ``scaling``, a float argument. A static graph needs the number itself,
    so such an argument is specialized by its value, as a size argument is by its size (one variant per value: the
    value is part of the variant's key)."""
    found: list[int] = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        value = node.meta.get("example_value")
        if (
            isinstance(value, torch.Tensor)
            and value.dim() == 0
            and node.users
            and all(u.op == "call_method" and u.target == "item" and len(u.args) == 1 for u in node.users)
        ):
            found.append(i)
    return tuple(found)


def scalars_key(args: Sequence[object], positions: Sequence[int]) -> tuple[object, ...]:
    """The Python values of the scalar arguments at ``positions`` (see :func:`scalar_positions`)."""
    return tuple(args[i].item() for i in positions)  # type: ignore[attr-defined]


def static_variant(gm: torch.fx.GraphModule, args: Sequence[object]) -> tuple[torch.fx.GraphModule, list[object]]:
    """The static graph (and its arguments) that a call with ``args`` compiles, for a graph with dynamic sizes or
    scalar arguments; ``gm`` and ``args`` as they are for a static graph. Dynamo's symbolic example values count at
    their hints."""
    positions = size_positions(args)
    scalars = scalar_positions(gm)
    if not positions and not scalars and not typed_symbolic(gm):
        return gm, list(args)
    concrete = [int(a.node.hint) if isinstance(a, torch.SymInt) else a for a in args]
    dropped = set(positions) | set(scalars)
    return specialize(gm, concrete, positions, scalars), [a for i, a in enumerate(concrete) if i not in dropped]


def _substitute(gm: torch.fx.GraphModule, node: torch.fx.Node, value: object) -> None:
    """Replace every use of ``node`` by the constant ``value`` and erase it."""
    for user in list(node.users):
        # mypy cannot infer a lambda that binds loop variables through default arguments.
        user.args = torch.fx.node.map_arg(user.args, lambda a, n=node, v=value: v if a is n else a)  # type: ignore[misc]
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=node, v=value: v if a is n else a)  # type: ignore[misc]
    gm.graph.erase_node(node)


def specialize(
    gm: torch.fx.GraphModule,
    args: Sequence[object],
    sym_positions: Sequence[int],
    scalar_positions: Sequence[int] = (),
) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose symbolic-size placeholders are replaced by the concrete values in ``args``.

    Dynamo passes sizes of dynamic dimensions as extra SymInt placeholders; the QNN path compiles one static
    graph per concrete shape, so each such placeholder becomes a Python constant. Each scalar argument (at
    ``scalar_positions``, see :func:`scalar_positions`) becomes its value: its ``.item()`` reads are replaced by
    the number. The original gm is not touched.
    """
    static = copy.deepcopy(gm)
    placeholders = [n for n in static.graph.nodes if n.op == "placeholder"]
    # Dynamo's source of each argument (a parameter or buffer is frozen, a user input is not) lives in a node
    # attribute that a deep copy drops: without it the copy's weights would become runtime inputs.
    for mine, original in zip(placeholders, (n for n in gm.graph.nodes if n.op == "placeholder"), strict=True):
        source = getattr(original, "_dynamo_source", None)
        if source is not None and getattr(mine, "_dynamo_source", None) is None:
            mine._dynamo_source = source
    for pos in sym_positions:
        _substitute(static, placeholders[pos], args[pos])
    for pos in scalar_positions:
        node = placeholders[pos]
        number = args[pos].item()  # type: ignore[attr-defined]
        for read in list(node.users):  # the .item() reads
            _substitute(static, read, number)
        static.graph.erase_node(node)
    static.recompile()
    # Every node still carries Dynamo's symbolic example value; propagate fake tensors of the concrete inputs so
    # later stages (analysis, export) see a static graph with static metadata.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    dropped = set(sym_positions) | set(scalar_positions)
    concrete = [a for i, a in enumerate(args) if i not in dropped]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in concrete]
    FakeTensorProp(static, mode).propagate_dont_convert_inputs(*fakes)
    # Size arithmetic is now on constants: a node whose value is a plain number (a size, a product of sizes) is that
    # number, so that a graph returning one (Funnel's pooled length) returns a constant, not a value to translate.
    # A read of a tensor's data (.item(), .tolist()) is never a plain number here.
    for node in list(static.graph.nodes):
        if (
            node.op in ("call_function", "call_method")
            and type(node.meta.get("val")) in (int, float, bool)
            and node.target not in ("item", "tolist")
        ):
            _substitute(static, node, node.meta["val"])
    static.recompile()
    for node in static.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    return static


# The modules of FX targets, as a report names them: ``F.layer_norm`` rather than ``torch.nn.functional.layer_norm``.
_MODULE_ALIASES = {
    "torch.nn.functional": "F",
    "torch._C._nn": "F",
    "_operator": "operator",
    "torch._C._VariableFunctions": "torch",
}


def op_name(node: torch.fx.Node) -> str:
    """The operation of a ``call_function`` or ``call_method`` node, short: ``torch.tan``, ``F.avg_pool2d``,
    ``operator.add``, ``.sum`` (a Tensor method), ``aten.sort`` (an ATen op overload, ``.default`` dropped)."""
    target = node.target
    if node.op == "call_method":
        return f".{target}"
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", None)
    if name is None or type(target).__name__ == "OpOverload":
        return str(target).removesuffix(".default")
    module = _MODULE_ALIASES.get(getattr(target, "__module__", None) or "", getattr(target, "__module__", None) or "")
    if not module and type(target).__name__ == "builtin_function_or_method":
        module = "torch"  # torch.* functions defined in C report no module
    return f"{module}.{name}" if module else name


def op_counts(gm: torch.fx.GraphModule) -> dict[str, int]:
    """How many times the graph calls each operation (:func:`op_name`), by name."""
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method"):
            name = op_name(node)
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def writes_arguments(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph updates any of its arguments (inputs or buffers) in place (read from the graph alone: the
    backend call must not add guards on symbolic sizes)."""
    import qnnx_export

    return bool(qnnx_export.written_arguments(gm))


_gc_state = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Any:
    """Hold off Python's cyclic garbage collector while a graph compiles.

    Export and session building allocate many short-lived objects, and every few hundred allocations CPython
    scans the whole heap, which after ``import torch`` holds millions of objects: a noticeable share of a cold
    first call went to collections (docs/benchmarks.md). Reference counting still frees almost
    everything; the cycles left are collected at the next collection after the compile. The collector's state
    is restored exactly (it stays off if the caller had turned it off), also across threads compiling at once.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_state:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_state:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


_OWN_COMPILE_LOCK = threading.RLock()


@contextlib.contextmanager
def compiling() -> Any:
    """Run a qnnx compile step (specialize, analyze, export, session build) the way Dynamo runs a backend's compile.

    Our steps trace with process-global side effects: torch.fx's tracer (under ``make_fx``, torch.export, torch.onnx)
    patches ``torch.nn.Module.__call__``/``__getattr__`` for the whole process, keeps its patcher in a module global
    and sets a global "FX tracing" flag. We compile on a graph's first call, outside Dynamo, so without this another
    thread's Dynamo could trace a model through the patched ``Module.__call__`` and build its guards after the patch
    is undone (``InternalTorchDynamoError: TypeError: 'NoneType' object is not subscriptable``, torch 2.13), two of
    our compiles could undo each other's patches (``CURRENT_PATCHER is None in finally block``), and another thread
    calling a compiled function would be refused ("Detected that you are using FX to symbolically trace a
    dynamo-optimized function"). So we hold Dynamo's ``torch._dynamo.convert_frame.compile_lock`` (an RLock Dynamo
    holds while tracing a frame; our own RLock if a torch version has none) and mark a compile session as Dynamo
    does around its backends (``torch.compiler.is_compiling()`` is then true, which that check honours). Calls of
    compiled graphs never take the lock.
    """
    try:
        from torch._dynamo.convert_frame import compile_lock as lock
    except ImportError:
        lock = _OWN_COMPILE_LOCK
    session = getattr(torch.compiler, "_compile_session_context", contextlib.nullcontext)
    with lock, session():
        yield


@attrs.frozen
class Examples:
    """Dynamo's example inputs, tensors held weakly, and the grad mode the graph was traced in (saving a graph that
    was never called compiles it from them, in that mode: Dynamo's guards run it only in that mode)."""

    values: tuple[object, ...]
    grad_enabled: bool


def remember(example_inputs: Sequence[object]) -> Examples:
    """See :class:`Examples`."""
    values = tuple(weakref.ref(a) if isinstance(a, torch.Tensor) else a for a in example_inputs)
    return Examples(values, torch.is_grad_enabled())


def recall(examples: Examples) -> list[object]:
    values = [e() if isinstance(e, weakref.ref) else e for e in examples.values]
    if any(v is None and isinstance(e, weakref.ref) for v, e in zip(values, examples.values)):
        raise SavedGraphError(
            "the compiled function was never called and its example tensors (the model's weights among them) are "
            "gone, so its graph cannot be compiled for saving; call it once, or save while the model is alive"
        )
    return values
