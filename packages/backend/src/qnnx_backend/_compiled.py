"""The callable the ``qnn`` backend hands back to Dynamo: one Dynamo graph, served by its static variants (private).

:class:`QnnGraph` keeps a variant per concrete size (or per length bucket), compiled on first use along the device
chain (:mod:`qnnx_backend._chain`), within the recompile budget ``max_graphs``; a graph compiled with ``quantize``
records its inputs under :func:`qnnx_backend.calibrate` and runs its quantized variants after it.
"""

from __future__ import annotations

import logging
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from qnnx_backend import _buckets, _chain, _report
from qnnx_backend._calibrate import HOW_TO, Calibration, active_session
from qnnx_backend._options import BackendOptions
from qnnx_backend._progress import compile_progress
from qnnx_backend._trace import (
    Examples,
    compiling,
    dims_key,
    gc_paused,
    op_counts,
    remember,
    scalar_positions,
    scalars_key,
    size_positions,
    specialize,
    symbolic_dims,
    typed_symbolic,
    writes_arguments,
)
from qnnx_backend._variant import PAST_BUDGET, Eager, QnnVariant, Specialized
from qnnx_backend.errors import QnnDeviceError, QnnFallbackWarning, QuantizationError, UnsupportedGraphError

logger = logging.getLogger(__name__)

_LIVE: list[weakref.ref[QnnGraph]] = []

_QnnVariant = QnnVariant  # the name tools/bench/generation.py times the decode step through

Variant = Eager | QnnVariant | Specialized


def live_graphs() -> list[QnnGraph]:
    """The compiled graphs alive in this process, oldest first (a seam for failure-injection tests)."""
    alive = [g for g in (r() for r in _LIVE) if g is not None]
    _LIVE[:] = [weakref.ref(g) for g in alive]
    return alive


class QnnGraph(SerializableCallable):
    """The compiled function of one Dynamo graph.

    Dynamo calls it with every graph argument (lifted parameters and buffers included). Static graphs are compiled
    when the backend is called; graphs with symbolic sizes compile one static variant per concrete shape on first use.
    It is serializable (``aot_compile`` and ``save_compiled_function``; see :mod:`qnnx_backend._aot`).
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[object], options: BackendOptions) -> None:
        self._gm = gm
        self._options = options
        self._lock = threading.Lock()
        self._sym_positions = size_positions(example_inputs)
        self._sym_dims = symbolic_dims(gm, self._sym_positions)
        self._scalar_positions = scalar_positions(gm)
        # The arguments a static variant does not take: sizes and scalars, which it holds as constants.
        self._dropped = tuple(sorted({*self._sym_positions, *self._scalar_positions}))
        self._dynamic = bool(self._dropped or self._sym_dims) or typed_symbolic(gm)
        self._variants: dict[tuple[object, ...], Variant] = {}
        self._budget_warned = False
        self._examples = remember(example_inputs)  # weakly: saving compiles a never-called graph from them
        self._plan: _buckets.BucketPlan | str | None = None
        if self._sym_positions and options.buckets is not None:
            self._plan = (
                "a tensor has dynamic dims without size arguments"
                if self._sym_dims
                else _buckets.make_plan(gm, example_inputs, self._sym_positions)
            )
            if not isinstance(self._plan, str) and writes_arguments(gm):
                # Padded copies would take the writes, and the eager neutrality check would apply them to the
                # caller's tensors: such a graph compiles exact sizes.
                self._plan = "the graph writes in place into its arguments"
            if isinstance(self._plan, str):
                logger.info("qnn backend: dynamic sizes compile exactly (no buckets): %s", self._plan)
        _LIVE.append(weakref.ref(self))
        if len(_LIVE) > 256:
            live_graphs()  # prune dead references

    @property
    def reports(self) -> tuple[_report.CompileReport, ...]:
        """The report of each static variant compiled so far."""
        return tuple(v.report for v in self._variants.values())

    @classmethod
    def serialize_compile_artifacts(cls, fn: QnnGraph) -> bytes:
        """The saved form of ``fn`` (``save_compiled_function``): compiled contexts, frozen model, call plan."""
        from qnnx_backend import _aot  # saving only: a compile does not import it

        return _aot.serialize(fn)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        """The callable saved by :meth:`serialize_compile_artifacts`, loaded without Dynamo, export or opcheck."""
        from qnnx_backend import _aot_load

        return _aot_load.deserialize(data)

    def __call__(self, *args: object) -> Any:
        # Compilation happens on the first call of each concrete shape, not inside Dynamo's backend call: Dynamo
        # wraps any exception a backend raises into BackendCompilerFailed (dropping its type), while an exception
        # raised here reaches the user as the QnnDeviceError / UnsupportedGraphError it is.
        if self._options.quantize is not None:  # calibration, then quantized variants
            return self._call_quantizing(args)
        key: tuple[object, ...] = ()
        if self._sym_positions:
            key = tuple(int(args[i]) for i in self._sym_positions)  # type: ignore[call-overload]
            if isinstance(self._plan, _buckets.BucketPlan):
                bucket = _buckets.choose(key, self._plan, self._options.buckets)  # type: ignore[arg-type]
                if bucket is not None:
                    served = self._call_bucket(args, key, bucket)  # type: ignore[arg-type]
                    if served is not _NOT_NEUTRAL:
                        return served
        if self._sym_dims or self._scalar_positions:
            key = self._size_key(args)
        variant = self._known_variant(key)
        if variant is None:
            variant = self.compile_variant(key, args)
        return variant(args)

    def compile_variant(self, key: tuple[object, ...], args: Sequence[object]) -> Any:
        """The variant for the sizes ``key``, compiled from ``args`` unless another thread did it first."""
        with self._lock, compiling(), gc_paused():
            variant = self._variants.get(key)
            if variant is None:
                variant = self._compile_specialized(args) if self._dynamic else self._compile(self._gm, list(args))
                self._variants[key] = variant
        return variant

    def _call_bucket(self, args: Sequence[object], sizes: tuple[int, ...], bucket: tuple[int, ...]) -> Any:
        """Run the static graph of ``bucket`` on padded arguments and slice the outputs back to ``sizes``."""
        plan = self._plan
        assert isinstance(plan, _buckets.BucketPlan)
        key = ("bucket", *bucket, *scalars_key(args, self._scalar_positions))
        variant = self._known_variant(key)
        if variant is None:
            with self._lock, compiling(), gc_paused():
                variant = self._variants.get(key)
                if variant is None:
                    problem = _buckets.neutral(self._gm, args, plan, bucket)
                    if problem is not None:
                        return self._not_neutral(sizes, bucket, problem)
                    variant = self._compile_specialized(_buckets.pad(args, plan, bucket), bucket=bucket)
                    self._variants[key] = variant
        if isinstance(variant, Eager):
            return variant(args)
        return _buckets.slice_outputs(variant(_buckets.pad(args, plan, bucket)), plan, sizes)

    def _not_neutral(self, sizes: tuple[int, ...], bucket: tuple[int, ...], problem: str) -> Any:
        cause = (
            f"padding the dynamic sizes {list(sizes)} to the bucket {list(bucket)} changes the outputs in eager "
            f"PyTorch ({problem}): the graph depends on the padding (a mean over the sequence, or no attention mask)"
        )
        if self._options.strict:
            raise UnsupportedGraphError(
                [cause], "Pass buckets=None to compile every size exactly, or give the model an attention mask."
            )
        logger.info("qnn backend: %s; compiling exact sizes for this graph", cause)
        self._plan = cause
        return _NOT_NEUTRAL

    def _known_variant(self, key: tuple[object, ...]) -> Any:
        """The variant compiled for ``key``; past the recompile budget a new dynamic size gets the PyTorch one;
        None when ``key`` is still to be compiled."""
        variant = self._variants.get(key)
        if variant is None and self._dynamic and self._over_budget():
            with self._lock:
                variant = self._variants.get(key) or self._past_budget(key)
                self._variants[key] = variant
        return variant

    def _over_budget(self) -> bool:
        compiled = [v for v in self._variants.values() if not isinstance(v, Eager) or v.report.reason != PAST_BUDGET]
        return len(compiled) >= self._options.max_graphs

    def _past_budget(self, key: tuple[object, ...]) -> Eager:
        """A new shape past ``max_graphs``: run it in PyTorch (one warning per graph), or raise under strict."""
        seen = [k for k, v in self._variants.items() if not (isinstance(v, Eager) and v.report.reason == PAST_BUDGET)]
        sizes = ", ".join(str(list(k)) for k in seen)
        if self._scalar_positions:
            sizes += (
                f" (each key ends with the values of {len(self._scalar_positions)} Python number(s) passed as tensors)"
            )
        cause = (
            f"{len(seen)} static QNN graphs were compiled for the dynamic sizes {sizes} (max_graphs="
            f"{self._options.max_graphs}); size {list(key)} is not compiled. Raise max_graphs, or mark the dimension "
            "static (torch.compile(dynamic=False)) or pad inputs to a few lengths"
        )
        if self._options.strict:
            raise QnnDeviceError(self._options.device, cause)
        if not self._budget_warned:
            self._budget_warned = True
            warnings.warn(f"qnn backend: {cause}; new sizes run in PyTorch.", QnnFallbackWarning, stacklevel=3)
        return self._eager(PAST_BUDGET)

    def _eager(self, reason: str) -> Eager:
        """The whole graph in PyTorch, decided before any compile, with its recorded report."""
        rep = _report.CompileReport(
            graph_id=_report.next_graph_id(),
            device="eager",
            requested_device=self._options.device,
            strict=False,
            reason=reason,
            fx_ops=op_counts(self._gm),
        )
        _report.record(rep)
        return Eager(self._gm, rep)

    # -- compilation ---------------------------------------------------------------------------------------------

    def _compile_specialized(
        self,
        args: Sequence[object],
        *,
        bucket: tuple[int, ...] | None = None,
        calibration: Calibration | None = None,
    ) -> Variant:
        """Compile the static copy of the graph for ``args``: its sizes and scalar arguments become constants."""
        try:
            static = specialize(self._gm, args, self._sym_positions, self._scalar_positions)
        except Exception as exc:  # a data-dependent read Dynamo kept in the graph, and the like
            return self._unspecializable(exc)
        rest = [a for i, a in enumerate(args) if i not in self._dropped]
        inner = self._compile(
            static, rest, bucket=bucket, calibration=calibration.without(self._dropped) if calibration else None
        )
        return Specialized(inner, self._dropped)

    def _unspecializable(self, exc: Exception) -> Eager:
        """The graph runs in PyTorch (or raises under strict): its static copy could not be made."""
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        cause = (
            f"the graph's static copy for these sizes could not be made ({type(exc).__name__}: {detail[:200]}); "
            "it reads a value from a tensor's data (an .item() Dynamo kept in the graph)"
        )
        if self._options.strict:
            raise UnsupportedGraphError(
                [cause], "Compile with dynamic=False, or keep the value a Python number outside the compiled code."
            ) from exc
        warnings.warn(f"qnn backend: {cause}; running the original PyTorch graph.", QnnFallbackWarning, stacklevel=4)
        return self._eager(cause)

    def _compile(
        self,
        gm: torch.fx.GraphModule,
        args: list[object],
        exclude: frozenset[str] = frozenset(),
        bucket: tuple[int, ...] | None = None,
        calibration: Calibration | None = None,
    ) -> Eager | QnnVariant:
        """Compile one static graph along the device chain; ``calibration`` asks for the quantized graph."""

        graph_id = _report.next_graph_id()
        timings: dict[str, float] = {}
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        with compile_progress(graph_id, timings, shapes):
            program, report, reference = _chain.place(
                gm,
                args,
                self._options,
                exclude=exclude,
                graph_id=graph_id,
                timings=timings,
                shapes=shapes,
                bucket=bucket,
                calibration=calibration,
            )
            if program is None:
                return Eager(gm, report)
            return QnnVariant(
                self._options, self._compile, gm, args, program, report, exclude, calibration, reference=reference
            )

    # -- quantized graphs --------------------------------------------------------------------------------------

    def _size_key(self, args: Sequence[object]) -> tuple[object, ...]:
        """The key of a call's variant: its sizes, then its scalar arguments' values."""
        key = tuple(int(args[i]) for i in self._sym_positions)  # type: ignore[call-overload]
        return key + dims_key(args, self._sym_dims) + scalars_key(args, self._scalar_positions)

    def _call_quantizing(self, args: Sequence[object]) -> Any:
        """A call of a graph compiled with ``quantize``: record under :func:`qnnx_backend.calibrate`, else run the
        quantized variant of this shape (a shape never calibrated runs in float with a warning, or raises under
        strict)."""
        spec = self._options.quantize
        assert spec is not None
        key = self._size_key(args)
        session = active_session()
        if session is not None:
            return session.record(self, key, self._gm, spec, args)
        variant = self._known_variant(key)
        if variant is None:
            with self._lock, compiling(), gc_paused():
                variant = self._variants.get(key)
                if variant is None:
                    if self._options.strict:
                        sizes = f" for the input sizes {list(key)}" if key else ""
                        raise QuantizationError(
                            f"qnn backend: a graph compiled with quantize={spec.scheme!r} was called before it was "
                            f"calibrated{sizes}. {HOW_TO}."
                        )
                    # No samples: compiled in float, with the warning and report of a graph that is not quantized.
                    empty = Calibration(spec=spec, positions=(), samples=())
                    variant = self._compile_calibrated(args, empty)
                    self._variants[key] = variant
        return variant(args)

    def install_calibration(
        self, key: tuple[object, ...], args: list[object], calibration: Calibration, grad: bool
    ) -> None:
        """Compile the quantized variant of the sizes ``key`` from a :func:`qnnx_backend.calibrate` block's
        recording (``args`` is the recorded call, ``grad`` its grad mode); it replaces the variant of those sizes."""
        with torch.set_grad_enabled(grad), self._lock, compiling(), gc_paused():
            self._variants[key] = self._compile_calibrated(args, calibration)

    def _compile_calibrated(self, args: Sequence[object], calibration: Calibration) -> Variant:
        if self._dynamic:
            return self._compile_specialized(args, calibration=calibration)
        return self._compile(self._gm, list(args), calibration=calibration)

    # -- what saving reads (see _aot) ------------------------------------------------------------------------

    @property
    def options(self) -> BackendOptions:
        return self._options

    @property
    def sym_positions(self) -> tuple[int, ...]:
        """Positions of the size arguments Dynamo passes (empty for a static graph)."""
        return self._sym_positions

    @property
    def scalar_positions(self) -> tuple[int, ...]:
        """Positions of the scalar arguments Dynamo passes as 0-d tensors (empty usually; see _trace)."""
        return self._scalar_positions

    @property
    def sym_dims(self) -> tuple[tuple[int, int], ...]:
        """``(argument position, dim)`` of the dynamic dims Dynamo passes no size argument for (empty usually)."""
        return self._sym_dims

    @property
    def plan(self) -> _buckets.BucketPlan | str | None:
        """The bucket plan of a graph with dynamic sizes, or why it has none."""
        return self._plan

    @property
    def examples(self) -> Examples:
        return self._examples

    @property
    def variants(self) -> Mapping[tuple[object, ...], Variant]:
        """The variants compiled so far, by size key (a copy)."""
        return dict(self._variants)


_NOT_NEUTRAL = object()
