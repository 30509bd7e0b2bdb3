"""The run stage's program: what a compiled static graph runs, a QNN session with the plan to call it, or nothing at
all (private).

Both kinds of program satisfy :class:`Program`, which is all the compiled callable, the AOT writer and the reports
read. Where a program runs is one frozen :class:`Target`; how its session was made, one :class:`SessionSource`, so
that a program can be recreated after a run-time failure of the EP, or saved.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np
import torch

from qnnx_backend import _session
from qnnx_backend._parts import PartedModel, part_infos
from qnnx_backend._report import ExportReport, PartReport
from qnnx_backend._untrusted import FP16_MAX, check_half_range, check_inputs, check_integer_inputs, integer_bounds

if TYPE_CHECKING:
    from qnnx_export import GraphSignature

logger = logging.getLogger(__name__)

# ORT type strings of session inputs -> numpy dtypes, for the few casts the call path may need.
_ORT_TO_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


@attrs.frozen
class Target:
    """Where a program runs, and which of the compiled function's arguments are its frozen weights."""

    device: str
    soc_model: int
    is_simulator: bool
    param_indices: tuple[int, ...] = attrs.field(converter=lambda v: tuple(int(i) for i in v))


@attrs.frozen
class SessionSource:
    """What a session was created from: the model (a staged ONNX model, or the path of a compiled context) and the
    arguments of ``_session.create_for_device``. A recreated session starts from the same two."""

    model: _session.StagedModel | PartedModel | str
    kwargs: Mapping[str, Any]


class Program(Protocol):
    """What the compiled callable needs of one compiled static graph."""

    @property
    def signature(self) -> GraphSignature: ...
    @property
    def target(self) -> Target: ...
    @property
    def cache(self) -> str: ...
    @property
    def onnx_nodes(self) -> int | None: ...
    @property
    def passes_applied(self) -> tuple[str, ...]: ...
    @property
    def placement(self) -> Mapping[str, int]: ...
    @property
    def cpu_nodes(self) -> Mapping[str, str]: ...
    @property
    def parts(self) -> tuple[PartReport, ...]: ...
    @property
    def weight_bytes(self) -> int | None: ...
    @property
    def context_bytes(self) -> int | None: ...
    @property
    def export(self) -> ExportReport | None: ...

    clip_inputs: bool

    @property
    def clipped(self) -> bool: ...

    def run(self, args: Sequence[object]) -> Any: ...

    def beyond_half_range(self, args: Sequence[object]) -> bool: ...

    def recreate(self) -> Program: ...


class NoSessionProgram:
    """A graph whose outputs are all inputs, constants or None: nothing to run on QNN."""

    cache = "bypass"
    onnx_nodes = 0
    passes_applied: tuple[str, ...] = ()
    parts: tuple[PartReport, ...] = ()
    weight_bytes: int | None = 0
    context_bytes: int | None = None
    clip_inputs = True
    clipped = False

    def __init__(self, signature: GraphSignature, target: Target, export: ExportReport | None = None) -> None:
        self.signature = signature
        self.target = target
        self.export = export
        self.placement: Mapping[str, int] = {}
        self.cpu_nodes: Mapping[str, str] = {}

    def run(self, args: Sequence[object]) -> Any:
        return self.signature.assemble([], args)

    def beyond_half_range(self, args: Sequence[object]) -> bool:
        return False  # nothing computed on the device

    def recreate(self) -> NoSessionProgram:
        return self


# One ONNX input fed as it is: (ORT input name, argument index, torch dtype, shape).
_DirectInput = tuple[str, int, torch.dtype, torch.Size]


def _direct_inputs(
    signature: GraphSignature, names: Sequence[str], numpy_types: Sequence[type | None]
) -> tuple[_DirectInput, ...] | None:
    """What each argument must be for the call to hand it to ORT without a cast or copy (the usual case), or None
    when some input always needs a conversion (int64 fed as int32, a dtype numpy lacks)."""
    if len(names) != len(signature.inputs):
        return None
    plan: list[_DirectInput] = []
    for name, want, spec in zip(names, numpy_types, signature.inputs):
        if spec.onnx_dtype != spec.dtype or spec.onnx_shape is not None or want is None:
            return None
        dtype = getattr(torch, spec.dtype, None)
        if not isinstance(dtype, torch.dtype):
            return None
        try:
            same = torch.empty(0, dtype=dtype).numpy().dtype == want
        except TypeError:  # bfloat16 and friends have no numpy dtype
            return None
        if not same:
            return None
        plan.append((name, spec.arg_index, dtype, torch.Size(spec.shape)))
    return tuple(plan)


def _direct_feed(plan: Sequence[_DirectInput], args: Sequence[object]) -> dict[str, Any] | None:
    """ORT's feed when every argument matches ``plan`` exactly (numpy views, no copy); None sends the call down the
    general path, which converts or names the mismatch."""
    feed = {}
    for name, index, dtype, shape in plan:
        t = args[index]
        if not (
            isinstance(t, torch.Tensor)
            and t.dtype is dtype
            and t.shape == shape
            and not t.requires_grad
            and t.is_cpu
            and t.layout is torch.strided
            and t.is_contiguous()
        ):
            return None
        feed[name] = t.numpy()
    return feed


def _direct_outputs(
    signature: GraphSignature, out_dtypes: Sequence[torch.dtype | None]
) -> tuple[tuple[int, ...], str] | None:
    """(ONNX output index of each result, container) when the result is just the session's outputs: no argument or
    constant among them, no dtype to restore. None: assemble through the signature."""
    slots = signature.outputs
    if not slots or any(slot.kind != "onnx" for slot in slots):
        return None
    for k, slot in enumerate(slots):
        if slot.index is None or slot.shape is not None or slot.dtype != signature.onnx_output_dtypes[slot.index]:
            return None
        want = out_dtypes[k] if k < len(out_dtypes) else None
        if want is not None and str(want).removeprefix("torch.") != slot.dtype:
            return None
    return tuple(int(slot.index) for slot in slots), signature.output_container


def output_dtypes(gm: torch.fx.GraphModule) -> tuple[torch.dtype | None, ...]:
    """The dtype of each element of the graph's output tuple, as eager PyTorch would return it."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], tuple | list) else (out.args[0],)
    dtypes: list[torch.dtype | None] = []
    for v in values:
        ex = v.meta.get("example_value", v.meta.get("val")) if isinstance(v, torch.fx.Node) else None
        dtypes.append(ex.dtype if isinstance(ex, torch.Tensor) else None)
    return tuple(dtypes)


class QnnProgram:
    """An ORT session on a QNN device plus what is needed to call it with Dynamo's arguments.

    :meth:`run` raises :class:`NaNInput` before running a call whose float input holds NaN, and
    :class:`BeyondHalfRange` when the device returns a float no float16 computation can give (HTP's stand-in for NaN
    and infinities), before writing into any argument.
    """

    checks_half_range = True

    def __init__(
        self,
        *,
        session: Any,
        signature: GraphSignature,
        target: Target,
        source: SessionSource,
        cache: str,
        onnx_nodes: int | None,
        passes_applied: Sequence[str],
        out_dtypes: Sequence[torch.dtype | None],
        fp16: bool = False,
        cpu_nodes: Mapping[str, str] | None = None,
        source_model: _session.StagedModel | None = None,
        weight_bytes: int | None = None,
        context_bytes: int | None = None,
        export: ExportReport | None = None,
        clip_inputs: bool = True,
    ) -> None:
        self.session = session
        self.signature = signature
        self.target = target
        self.source = source
        self.cache = cache
        self.onnx_nodes = onnx_nodes
        self.passes_applied = tuple(passes_applied)
        self.out_dtypes = tuple(out_dtypes)
        self.fp16 = fp16
        self.cpu_nodes: Mapping[str, str] = dict(cpu_nodes or {})
        """The nodes pinned to ONNX Runtime's CPU EP, with qnnx-opcheck's reason (empty: wholly on QNN)."""
        self.source_model = source_model
        """The ONNX model the session was compiled from, when this process exported it (saving a compiled function
        stores it); None on a context-cache hit."""
        self.weight_bytes = weight_bytes
        """The graph's weight bytes as the device holds them (None when unknown)."""
        self.context_bytes = context_bytes
        """The bytes on disk of the compiled context(s) it runs from (None when none was written or loaded)."""
        self.export = export
        """How the graph was exported (None when unknown: a loaded saved function, an older cache entry)."""
        self.clip_inputs = clip_inputs
        """Whether a float input beyond float16's range is clipped to +-65504 for HTP (False: such a call raises
        :class:`BeyondHalfRangeInput`); the variant turns it off for a graph whose clipped call differed from eager."""
        self.clipped = False
        """Whether the last :meth:`run` clipped a float input to float16's range."""
        self._input_names = [i.name for i in session.get_inputs()]
        self._input_types = [_ORT_TO_NUMPY.get(i.type) for i in session.get_inputs()]
        self._output_names = [o.name for o in session.get_outputs()]
        self.placement: Mapping[str, int] = _session.placement_counts(session)
        self.parts = part_infos(session)
        """The parts a graph too large for one context runs as (empty: one context)."""
        # The graph was exported with float16 inputs (fp16=True) or float32 ones for the caller's bfloat16 (QNN has no
        # bfloat16): cast the caller's float inputs at the boundary.
        self._float_inputs = tuple(
            (spec.arg_index, getattr(torch, spec.dtype))
            for spec in signature.inputs
            if spec.dtype in ("float16", "float32")
        )
        self._direct_in = _direct_inputs(signature, self._input_names, self._input_types)
        self._direct_out = None if fp16 else _direct_outputs(signature, self.out_dtypes)
        self._writebacks = tuple(signature.writebacks)
        self._row_writebacks = tuple(signature.row_writebacks)
        if signature.writes:  # the general call path, then the writes: never the shortcuts below
            self._direct_in = None
        # The float inputs checked for NaN on each call. Not the state the graph writes into (a KV cache): its
        # values are this graph's own outputs, which the output check has seen, and it is the largest input.
        written = {arg for _, arg in self._writebacks} | {row.arg_index for row in self._row_writebacks}
        floats = {name for name, want in zip(self._input_names, self._input_types) if want in (np.float32, np.float16)}
        self._nan_checked = tuple(
            spec.name for spec in signature.inputs if spec.name in floats and spec.arg_index not in written
        )
        # Integer inputs beyond which the graph's int32 arithmetic may saturate on HTP (qnnx-export bounds them).
        self._int_bounds = integer_bounds(signature.inputs)

    def run(self, args: Sequence[object]) -> Any:
        """Run on QNN; torch tensors in, torch tensors out, in the graph's output structure."""
        feed = _direct_feed(self._direct_in, args) if self._direct_in is not None else None
        if feed is None:
            return self._run_converting(args)
        if self.checks_half_range:
            self.clipped = check_inputs(self._nan_checked, feed, clip=self.clip_inputs)
            if self._int_bounds:
                check_integer_inputs(self._int_bounds, feed)
        outs = self.session.run(self._output_names, feed)
        if self.checks_half_range:
            check_half_range(self._output_names, outs)
        if self._direct_out is None:
            result = self.signature.assemble([torch.from_numpy(o) for o in outs], args)
            return self._restore_dtypes(result)
        order, container = self._direct_out
        tensors = list(map(torch.from_numpy, outs))
        if container == "single":
            return tensors[order[0]]
        picked = [tensors[i] for i in order]
        return tuple(picked) if container == "tuple" else picked

    def beyond_half_range(self, args: Sequence[object]) -> bool:
        """Whether a float input that :meth:`run` checks holds a finite value beyond float16's range, or an infinity
        (one pass over each; before a run, so that the caller can keep what the run writes over)."""
        if not self.checks_half_range:
            return False
        checked = set(self._nan_checked)
        for spec in self.signature.inputs:
            tensor = args[spec.arg_index] if spec.name in checked and spec.arg_index < len(args) else None
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel():
                low, high = torch.aminmax(tensor.detach())
                if float(high) > FP16_MAX or float(low) < -FP16_MAX:
                    return True
        return False

    def _run_converting(self, args: Sequence[object]) -> Any:
        """The general call: casts, copies of non-contiguous inputs, and errors that name a mismatched argument."""
        callers = args  # the caller's own tensors: writes go there, not into converted copies
        cast = {}
        for i, dtype in self._float_inputs:
            value = args[i] if i < len(args) else None
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
                cast[i] = value.detach().to(dtype)
        if cast:
            args = [cast.get(i, a) for i, a in enumerate(args)]
        feed = {}
        for name, want, tensor in zip(self._input_names, self._input_types, self.signature.onnx_inputs(args)):
            array = tensor.detach().numpy()  # shares memory with the contiguous CPU tensor: no copy
            if want is not None and array.dtype != want:
                array = array.astype(want)
            feed[name] = array
        if self.checks_half_range:
            self.clipped = check_inputs(self._nan_checked, feed, clip=self.clip_inputs)
            if self._int_bounds:
                check_integer_inputs(self._int_bounds, feed)
        outs = self.session.run(self._output_names, feed)
        if self.checks_half_range:
            check_half_range(self._output_names, outs)
        # The graph wrote inputs or buffers in place: the caller's tensors end as eager leaves them. Written before
        # the outputs are assembled, since an output may be that same argument; rows first, since their positions
        # may be an argument that a whole-tensor write then updates.
        for row in self._row_writebacks:
            target = callers[row.arg_index]
            assert isinstance(target, torch.Tensor)
            row.apply(target, outs, callers)
        for out_index, arg_index in self._writebacks:
            # copy_ casts back, e.g. an int64 counter that ran as int32.
            target = callers[arg_index]
            assert isinstance(target, torch.Tensor)
            target.copy_(torch.from_numpy(outs[out_index]))
        result = self.signature.assemble([torch.from_numpy(o) for o in outs], args)
        return self._restore_dtypes(result)

    def _restore_dtypes(self, result: Any) -> Any:
        if not isinstance(result, tuple | list):
            return result
        fixed = [
            r.to(d) if isinstance(r, torch.Tensor) and d is not None and r.dtype != d else r
            for r, d in zip(result, self.out_dtypes)
        ]
        return type(result)(fixed) if isinstance(result, tuple) else fixed

    def recreate(self) -> QnnProgram:
        """A new session from the same source (after a run-time failure of the EP); the same split, pinned again."""
        return self._with_session(_session.create_for_device(self.source.model, self.target.device, self.source.kwargs))

    def _with_session(self, session: Any) -> Any:
        """This program with another session of the same model: every other argument it was made with, each kept as
        the attribute of its name."""
        kept = [name for name in inspect.signature(QnnProgram.__init__).parameters if name not in ("self", "session")]
        return type(self)(session=session, **{name: getattr(self, name) for name in kept})


class CpuEpProgram(QnnProgram):
    """A saved graph run from its saved ONNX model on ONNX Runtime's CPU EP, where its QNN device is not usable."""

    checks_half_range = False  # the CPU EP computes in float32, with NaN and infinities

    def recreate(self) -> CpuEpProgram:
        assert isinstance(self.source.model, str)
        fresh: CpuEpProgram = self._with_session(_session.create_on_cpu_ep(self.source.model))
        return fresh


def recreate_and_run(program: Program, args: Sequence[object], label: str, exc: Exception) -> tuple[Program, Any]:
    """After a run-time failure of the EP (e.g. an NPU subsystem restart): one new session and one more run.

    Returns (the new program, its outputs); raises whatever the second attempt raises.
    """
    logger.warning("qnn backend: %s failed at run time (%s); recreating the session once", label, exc)
    fresh = program.recreate()
    return fresh, fresh.run(args)
