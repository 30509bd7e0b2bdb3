"""Save a model compiled for QNN to one file, and load it without the model (public as :func:`qnnx_backend.save`
and :func:`qnnx_backend.load`).

``save`` traces the model once with Dynamo (``fullgraph=True, dynamic=False``), compiles its graph for QNN and runs
it on the example inputs, as ``torch.compile(backend="qnn")`` would. The file is the saved-graph payload
(:mod:`qnnx_backend._payload`) with a ``call`` section in its header: which of the model's inputs feed which graph
argument, the structure of its outputs (a ``torch.utils._pytree`` spec, so Hugging Face ``ModelOutput`` classes come
back as such), and the dtype and shape of every input. The model's weights are frozen into the compiled contexts,
so loading needs neither the model object nor Dynamo: ``load`` creates the QNN sessions from the contexts, and the
returned callable checks each call's inputs against the saved ones.

Why not ``torch.compile(...).aot_compile(...)``: torch 2.13's saved function holds Dynamo's guards and bytecode, which
read the weights from the module argument (so the loader must build the module), and its default guard filter keeps
guards it then cannot serialize on Hugging Face models (``ID_MATCH guard cannot be serialized``); the filter is
chosen before a backend runs, so no backend can supply it.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from qnnx_backend import _payload, _report
from qnnx_backend.errors import InvalidOptionsError, SavedGraphError, SavedInputError

if TYPE_CHECKING:
    import torch
    from torch.utils._pytree import TreeSpec

    from qnnx_backend._options import BackendOptions

# torch is imported on first use: ``import qnnx_backend`` imports no torch (the package's torch-free loader of saved
# files lives beside this module).
logger = logging.getLogger(__name__)

CALL_FORMAT = 1
_CONSTANTS = (type(None), bool, int, float, str)
_FIX_SAVE = "save the model again with qnnx_backend.save"
_counter = itertools.count()


@attrs.frozen(eq=False)
class SaveReport:
    """What :func:`save` wrote.

    Attributes:
        path: the file.
        file_bytes: its size.
        outputs: the compiled model's outputs on the example inputs, in the model's own output structure (a loaded
            file returns the same values for the same inputs on the same machine).
        reports: the compile report of each saved graph.
    """

    path: Path
    file_bytes: int
    outputs: Any
    reports: tuple[_report.CompileReport, ...]


def _call(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return model(*args, **kwargs)


def _fresh_call() -> Any:
    """``_call`` with a code object of its own: Dynamo keeps compiled code (and counts recompiles) per code object,
    so each save traces afresh instead of filling one cache with every model a process saves."""
    n = next(_counter)
    code = _call.__code__.replace(co_name=f"qnnx_save_{n}")
    return types.FunctionType(code, _call.__globals__, f"qnnx_save_{n}")


class _Recorder:
    """The compiled graph as Dynamo calls it: keeps the arguments and outputs of the first call (to bind the model's
    inputs and outputs to the graph's by identity)."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.args: tuple[object, ...] | None = None
        self.out: Any = None

    def __call__(self, *args: object) -> Any:
        out = self.graph(*args)
        if self.args is None:
            self.args, self.out = args, out
        return out


def _label(path: Sequence[Any]) -> str:
    """``args[0]``, ``kwargs['attention_mask']``: where an input leaf sits in ``(args, kwargs)``."""
    import torch.utils._pytree as pytree

    head, *rest = path
    return ("args" if getattr(head, "idx", 0) == 0 else "kwargs") + pytree.keystr(tuple(rest))


def _output_name(path: Sequence[Any]) -> str:
    """``last_hidden_state``, ``0``, ``hidden_states.1``: a plain name of one output leaf."""
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts) or "output"


def _spec_modules(spec: TreeSpec) -> list[str]:
    """The modules that define the container types of ``spec`` (imported at load, so that their classes are
    registered with pytree before the spec is read back)."""
    found: set[str] = set()
    stack = [spec]
    while stack:
        node = stack.pop()
        if node.type is not None and node.type.__module__ != "builtins":
            found.add(node.type.__module__)
        stack.extend(node.children())
    return sorted(found)


def _dumps(spec: TreeSpec, what: str) -> str:
    import torch.utils._pytree as pytree

    try:
        return pytree.treespec_dumps(spec)
    except Exception as exc:  # pytree raises NotImplementedError/TypeError for a type it cannot name
        raise SavedGraphError(
            f"the model's {what} use a container type torch's pytree cannot write ({exc}); return tuples, lists, "
            "dicts or Hugging Face ModelOutput classes, or register the type with "
            "torch.utils._pytree.register_pytree_node(..., serialized_type_name=...)"
        ) from exc


def save(
    model: Any,
    example_args: Any,
    path: str | os.PathLike[str],
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> SaveReport:
    """Compile ``model`` for QNN on the example inputs and save it to ``path``, weights included.

    The file is loaded with :func:`load`, in any process, without the model object, Dynamo or ONNX export. It
    serves exactly the input shapes and dtypes of the examples (non-tensor arguments, such as ``use_cache=False``,
    are fixed to their example values).

    Args:
        model: an ``nn.Module`` (in eval mode) or any function of tensors that traces as one Dynamo graph.
        example_args: the positional inputs (a tuple, or one tensor).
        path: the file to write (replaced atomically if it exists).
        example_kwargs: the keyword inputs (e.g. ``attention_mask``).
        options: the ``qnn`` backend's options, as for ``torch.compile(..., options=...)``.

    Returns:
        A :class:`SaveReport`; its ``outputs`` are what the compiled model returned on the examples.

    Raises:
        InvalidOptionsError: ``options`` are not valid, or ``model`` is not callable.
        SavedGraphError: the model does not trace as one graph, its graph does not run wholly on QNN, or an input or
            output is of a kind a saved file cannot hold (named in the message).
    """
    from qnnx_backend._options import BackendOptions

    opts = BackendOptions.from_mapping(options)
    if not callable(model):
        raise InvalidOptionsError(f"save expects a module or function to compile, got {type(model).__name__}")
    args = tuple(example_args) if isinstance(example_args, tuple | list) else (example_args,)
    blobs: list[bytes] = []
    header, out, reports = save_header(model, args, dict(example_kwargs or {}), opts, blobs)
    data = _payload.pack_payload(header, blobs)
    target = write_atomically(path, data)
    logger.info("qnn backend: saved %s to %s (%d bytes)", header["call"]["model"], target, len(data))
    return SaveReport(path=target, file_bytes=len(data), outputs=out, reports=reports)


def write_atomically(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path``, replacing it atomically if it exists."""
    target = Path(path)
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        staging.write_bytes(data)
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def save_header(
    model: Any, args: tuple[Any, ...], example_kwargs: Mapping[str, Any], opts: BackendOptions, blobs: list[bytes]
) -> tuple[dict[str, Any], Any, tuple[_report.CompileReport, ...]]:
    """Trace ``model`` on the examples, compile its one graph for QNN and return the graph's header with its ``call``
    section, the compiled model's outputs and the compile reports; the graph's files are appended to ``blobs``.

    Raises:
        SavedGraphError: as :func:`save`.
    """
    import torch
    import torch.utils._pytree as pytree

    from qnnx_backend import _aot
    from qnnx_backend._backend import qnn_backend

    kwargs = dict(sorted(example_kwargs.items()))
    leaves, in_spec = pytree.tree_flatten_with_path((args, kwargs))
    inputs = [_input_record(_label(p), _flat_key(p), leaf) for p, leaf in leaves]
    recorders: list[_Recorder] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> Any:
        recorders.append(_Recorder(qnn_backend(gm, example_inputs, options=opts)))
        return recorders[-1]

    compiled = torch.compile(_fresh_call(), backend=backend, fullgraph=True, dynamic=False)
    try:
        with torch.no_grad():
            out = compiled(model, args, kwargs)
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as exc:
        raise SavedGraphError(
            f"the model does not trace as one graph, which a saved file needs ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); remove the graph break (torch._dynamo.explain shows "
            "where it is)"
        ) from exc
    if len(recorders) != 1 or recorders[0].args is None:
        raise SavedGraphError(
            f"the model compiled to {len(recorders)} graph(s) on the example inputs; a saved file holds exactly one "
            "(a model that computes nothing on its inputs has none)"
        )
    recorder = recorders[0]
    called = recorder.args
    assert called is not None  # checked above
    header, _ = _aot.header_and_blobs(recorder.graph, blobs)
    user = {id(leaf): k for k, (_, leaf) in enumerate(leaves) if isinstance(leaf, torch.Tensor)}
    graph_args = [user.get(id(a)) if isinstance(a, torch.Tensor) else None for a in called]
    for record in header["graph"]["variants"]:
        _check_reads(record, graph_args, called)
    outputs, out_spec = _output_records(out, recorder.out, user)
    header["call"] = {
        "format": CALL_FORMAT,
        "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "in_spec": _dumps(in_spec, "inputs"),
        "in_modules": _spec_modules(in_spec),
        "inputs": inputs,
        "graph_args": graph_args,
        "out_spec": _dumps(out_spec, "outputs"),
        "out_modules": _spec_modules(out_spec),
        "outputs": outputs,
        "producer": _producer_versions(),
    }
    return header, out, tuple(recorder.graph.reports)


def _flat_key(path: Sequence[Any]) -> list[Any] | None:
    """``["args", 0]`` or ``["kwargs", "attention_mask"]`` for a top-level input (the torch-free loader binds
    those), None for one nested in a container."""
    if len(path) != 2:
        return None
    head, key = path
    if getattr(head, "idx", None) == 0 and isinstance(getattr(key, "idx", None), int):
        return ["args", key.idx]
    if getattr(head, "idx", None) == 1 and isinstance(getattr(key, "key", None), str):
        return ["kwargs", key.key]
    return None


def _input_record(name: str, key: list[Any] | None, leaf: object) -> dict[str, Any]:
    import torch

    if isinstance(leaf, torch.Tensor):
        return {"name": name, "key": key, "tensor": True, "dtype": _dtype(leaf.dtype), "shape": list(leaf.shape)}
    if isinstance(leaf, _CONSTANTS) and not (isinstance(leaf, float) and leaf != leaf):
        return {"name": name, "key": key, "tensor": False, "value": leaf}
    raise SavedGraphError(
        f"input {name} is a {type(leaf).__name__}; a saved file takes tensors and plain constants (None, bool, int, "
        "float, str), nested in tuples, lists and dicts: pass its tensors instead, or wrap the model in a function "
        "that builds it"
    )


def _check_reads(record: Mapping[str, Any], graph_args: Sequence[int | None], args: Sequence[object]) -> None:
    """Every graph argument a run reads or writes must be one of the model's inputs: the others (weights) are frozen
    into the contexts and are not there at load."""
    sig = record["signature"]
    read = [(s["arg_index"], "reads") for s in sig["inputs"]]
    read += [(w[1], "writes into") for w in sig.get("writebacks", ())]
    read += [(w["arg_index"], "writes into") for w in sig.get("row_writebacks", ())]
    read += [(o["index"], "returns") for o in sig["outputs"] if o["kind"] == "arg"]
    bad = sorted({(i, verb) for i, verb in read if graph_args[i] is None})
    if bad:
        what = ", ".join(f"{verb} argument {i} ({_describe(args[i])})" for i, verb in bad)
        raise SavedGraphError(
            f"the compiled graph {what}, which is not one of the model's inputs (a buffer or attribute written in "
            "place, or a tensor outside the model): a saved file holds frozen weights only; pass that tensor as an "
            "input, or save a model that does not update its state"
        )


def _output_records(out: Any, graph_out: Any, user: Mapping[int, int]) -> tuple[list[dict[str, Any]], TreeSpec]:
    import torch
    import torch.utils._pytree as pytree

    leaves, spec = pytree.tree_flatten_with_path(out)
    produced = {id(t): k for k, t in enumerate(graph_out if isinstance(graph_out, tuple | list) else (graph_out,))}
    records = []
    for path, leaf in leaves:
        name = _output_name(path)
        if isinstance(leaf, torch.Tensor) and id(leaf) in produced:
            records.append({"name": name, "graph": produced[id(leaf)]})
        elif isinstance(leaf, torch.Tensor) and id(leaf) in user:
            records.append({"name": name, "input": user[id(leaf)]})
        elif isinstance(leaf, _CONSTANTS):
            records.append({"name": name, "value": leaf})
        else:
            raise SavedGraphError(
                f"output {name} is a {_describe(leaf)} that the compiled graph does not compute (a weight, or an "
                "object a saved file cannot hold); return only computed tensors and plain constants"
            )
    return records, spec


def _producer_versions() -> dict[str, str]:
    import sys

    found = {"python": ".".join(map(str, sys.version_info[:3]))}
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        found["transformers"] = str(getattr(transformers, "__version__", "?"))
    return found


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _describe(value: object) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"{_dtype(value.dtype)}{list(value.shape)}"
    if isinstance(value, _CONSTANTS):
        return repr(value)
    return type(value).__name__


# -- loading -----------------------------------------------------------------------------------------------------


def load(path: str | os.PathLike[str]) -> LoadedModel:
    """Load a file written by :func:`save`: QNN sessions from its compiled contexts, no model object, no Dynamo.

    Raises:
        SavedGraphError: the file is not a saved model (a ``save_compiled_function`` file is named as such), is
            damaged, truncated or of a newer format, or its output classes cannot be imported here.
        QnnDeviceError: the file cannot run here (saved with ``strict=True`` on another configuration, or no device).
    """
    data = Path(path).read_bytes()
    if data[:1] == b"\x80" or data[:2] == b"PK":
        raise SavedGraphError(
            f"{os.fspath(path)} is a pickle or zip file, as torch's save_compiled_function writes, not a file of "
            "qnnx_backend.save: load it with torch.compiler.load_compiled_function, or save the model with "
            "qnnx_backend.save"
        )
    header, blobs = _payload.unpack_payload(data)
    if isinstance(header.get("generation"), dict):
        raise SavedGraphError(
            f"{os.fspath(path)} is a generation file of qnnx_backend.hf.save_for_generation (several graphs and a "
            "KV cache), not a file of qnnx_backend.save: load it with qnnx_backend.hf.load_for_generation"
        )
    return loaded_model(header, blobs, os.fspath(path))


def loaded_model(header: Mapping[str, Any], blobs: Sequence[memoryview], where: str) -> LoadedModel:
    """The :class:`LoadedModel` of one graph's header (with its ``call`` section) over the file's blobs; ``where``
    names the file in messages."""
    from qnnx_backend._aot_load import deserialize_parts

    call = header.get("call")
    if not isinstance(call, dict):
        raise SavedGraphError(
            f"{where} holds a compiled graph without a model's inputs and outputs (it was not written by "
            f"qnnx_backend.save); {_FIX_SAVE}"
        )
    if call.get("format") != CALL_FORMAT:
        raise SavedGraphError(
            f"{where} has call format {call.get('format')!r}; this qnnx-backend reads {CALL_FORMAT}: "
            "upgrade qnnx-backend, or save the model again with this version"
        )
    try:
        model = LoadedModel(call)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SavedGraphError):
            raise
        raise SavedGraphError(f"the saved model's call section is malformed ({exc!r}); {_FIX_SAVE}") from exc
    model._graph = deserialize_parts(header, blobs)
    return model


class LoadedModel:
    """A model loaded by :func:`load`: call it with the same kinds of inputs as the examples it was saved with.

    Every call is checked against the saved inputs (their structure, and each tensor's dtype and shape; each
    constant's value), and all mismatches are named in one :class:`~qnnx_backend.errors.SavedInputError`.
    """

    def __init__(self, call: Mapping[str, Any]) -> None:
        import torch
        import torch.utils._pytree as pytree

        for module in {*call["in_modules"], *call["out_modules"]}:
            try:
                importlib.import_module(str(module))
            except ImportError as exc:
                raise SavedGraphError(
                    f"the saved model's inputs or outputs are of classes from {module}, which cannot be imported "
                    f"here ({exc}); install the package that provides it (the saving process had "
                    f"{dict(call.get('producer') or {})})"
                ) from exc
        self._in_spec = pytree.treespec_loads(str(call["in_spec"]))
        self._out_spec = pytree.treespec_loads(str(call["out_spec"]))
        self._inputs: list[dict[str, Any]] = [dict(r) for r in call["inputs"]]
        self._graph_args: list[int | None] = [None if a is None else int(a) for a in call["graph_args"]]
        self._outputs: list[dict[str, Any]] = [dict(r) for r in call["outputs"]]
        self._dtypes = {k: getattr(torch, r["dtype"]) for k, r in enumerate(self._inputs) if r["tensor"]}
        self.model_name = str(call["model"])
        """The class of the model that was saved (``module.QualName``), for messages."""
        self._graph: Any = None

    @property
    def reports(self) -> tuple[_report.CompileReport, ...]:
        """The report of each loaded graph (``cache="aot"`` when it came straight from its saved context)."""
        return tuple(self._graph.reports)

    @property
    def signature(self) -> str:
        """The inputs it takes, e.g. ``(args[0]: int64[1, 16], kwargs['attention_mask']: int64[1, 16])``."""
        return "(" + ", ".join(_expected(r) for r in self._inputs) + ")"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch.utils._pytree as pytree

        leaves, spec = pytree.tree_flatten((args, dict(sorted(kwargs.items()))))
        if spec != self._in_spec:
            flat = pytree.tree_flatten_with_path((args, dict(sorted(kwargs.items()))))[0]
            got = [f"{_label(p)}: {_describe(v)}" for p, v in flat[:8]] + (
                [f"... {len(flat)} in all"] * (len(flat) > 8)
            )
            raise SavedInputError(
                f"the loaded {self.model_name} takes {self.signature}; it was called with ({', '.join(got)}). "
                "Pass the same positional and keyword inputs as the examples it was saved with"
            )
        problems = []
        for k, (record, leaf) in enumerate(zip(self._inputs, leaves, strict=True)):
            problem = self._mismatch(k, record, leaf)
            if problem is not None:
                problems.append(problem)
        if problems:
            raise SavedInputError(
                f"the loaded {self.model_name} cannot take these inputs: {'; '.join(problems)}. It serves the shapes, "
                "dtypes and constants it was saved with: convert or pad the inputs, or save the model again with "
                "examples like these"
            )
        graph_args = [None if a is None else leaves[a] for a in self._graph_args]
        graph_out = self._graph(*graph_args)
        produced = graph_out if isinstance(graph_out, tuple | list) else (graph_out,)
        values = [
            produced[r["graph"]] if "graph" in r else leaves[r["input"]] if "input" in r else r["value"]
            for r in self._outputs
        ]
        return pytree.tree_unflatten(values, self._out_spec)

    def _mismatch(self, k: int, record: Mapping[str, Any], leaf: object) -> str | None:
        import torch

        if not record["tensor"]:
            if type(leaf) is type(record["value"]) and leaf == record["value"]:
                return None
            return f"{record['name']} is {_describe(leaf)}, saved as the constant {record['value']!r}"
        if not isinstance(leaf, torch.Tensor):
            return f"{record['name']} is {_describe(leaf)}, saved as a tensor {_expected(record, bare=True)}"
        if leaf.dtype is not self._dtypes[k] or list(leaf.shape) != record["shape"]:
            return f"{record['name']} is {_describe(leaf)}, saved as {_expected(record, bare=True)}"
        if leaf.device.type != "cpu":
            return f"{record['name']} is on {leaf.device}; a loaded model takes CPU tensors"
        return None


def _expected(record: Mapping[str, Any], *, bare: bool = False) -> str:
    value = f"{record['dtype']}{record['shape']}" if record["tensor"] else repr(record["value"])
    return value if bare else f"{record['name']}: {value}"
