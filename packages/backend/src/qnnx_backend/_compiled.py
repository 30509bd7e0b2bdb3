"""The callable the ``qnn`` backend hands back to Dynamo, and the device chain behind it (private)."""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import operator
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from qnnx_backend import _aot, _buckets, _report
from qnnx_backend._build import CompileContext, analyze, build_program
from qnnx_backend._options import CHAIN, BackendOptions, effective_device
from qnnx_backend._program import Program, recreate_and_run
from qnnx_backend._session import DeviceRejected as _DeviceRejected
from qnnx_backend.errors import (
    QnnDeviceError,
    QnnFallbackWarning,
    QnnRuntimeError,
    UnsupportedGraphError,
)

logger = logging.getLogger(__name__)

_LIVE: list[weakref.ref[QnnGraph]] = []


def live_graphs() -> list[QnnGraph]:
    """The compiled graphs alive in this process, oldest first (a seam for failure-injection tests)."""
    alive = [g for g in (r() for r in _LIVE) if g is not None]
    _LIVE[:] = [weakref.ref(g) for g in alive]
    return alive


def _is_symbolic(value: object) -> bool:
    return isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool)


def specialize(gm: torch.fx.GraphModule, args: Sequence[object], sym_positions: Sequence[int]) -> torch.fx.GraphModule:
    """A copy of ``gm`` whose symbolic-size placeholders are replaced by the concrete values in ``args``.

    Dynamo passes sizes of dynamic dimensions as extra SymInt placeholders; the QNN path compiles one static
    graph per concrete shape, so each such placeholder becomes a Python constant. The original gm is not touched.
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
        node = placeholders[pos]
        value = args[pos]
        for user in list(node.users):
            # mypy cannot infer a lambda that binds loop variables through default arguments.
            user.args = torch.fx.node.map_arg(user.args, lambda a, n=node, v=value: v if a is n else a)  # type: ignore[misc]
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=node, v=value: v if a is n else a)  # type: ignore[misc]
        static.graph.erase_node(node)
    static.recompile()
    # Every node still carries Dynamo's symbolic example value; propagate fake tensors of the concrete inputs so
    # later stages (analysis, export) see a static graph with static metadata.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    concrete = [a for i, a in enumerate(args) if i not in set(sym_positions)]
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in concrete]
    FakeTensorProp(static, mode).propagate_dont_convert_inputs(*fakes)
    for node in static.graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]
    return static


def _writes_arguments(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph updates any of its arguments (inputs or buffers) in place (read from the graph alone: the
    backend call must not add guards on symbolic sizes)."""
    import qnnx_export

    return bool(qnnx_export.written_arguments(gm))


@attrs.frozen
class _Eager:
    """Runs the original graph with PyTorch."""

    gm: Callable[..., Any]
    report: _report.CompileReport

    def __call__(self, args: Sequence[object]) -> Any:
        return self.gm(*args)


_gc_state = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _gc_paused() -> Any:
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
def _compiling() -> Any:
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
        self._sym_positions = tuple(
            i
            for i, a in enumerate(example_inputs)
            if _is_symbolic(a) or (isinstance(a, int) and not isinstance(a, bool))
        )
        self._variants: dict[tuple[object, ...], _Eager | _QnnVariant | _Specialized] = {}
        self._budget_warned = False
        self._examples = _aot.remember(example_inputs)  # weakly: saving compiles a never-called graph from them
        self._plan: _buckets.BucketPlan | str | None = None
        if self._sym_positions and options.buckets is not None:
            self._plan = _buckets.make_plan(gm, example_inputs, self._sym_positions)
            if not isinstance(self._plan, str) and _writes_arguments(gm):
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
        if self._options.quantize is not None:  # calibration, then quantized variants: see _quantize
            from qnnx_backend._quantize import call_quantizing

            return call_quantizing(self, args)
        key: tuple[object, ...] = ()
        if self._sym_positions:
            key = tuple(int(args[i]) for i in self._sym_positions)  # type: ignore[call-overload]
            if isinstance(self._plan, _buckets.BucketPlan):
                bucket = _buckets.choose(key, self._plan, self._options.buckets)  # type: ignore[arg-type]
                if bucket is not None:
                    served = self._call_bucket(args, key, bucket)  # type: ignore[arg-type]
                    if served is not _NOT_NEUTRAL:
                        return served
        variant = self._known_variant(key)
        if variant is None:
            variant = self._compile_variant(key, args)
        return variant(args)

    def _compile_variant(self, key: tuple[object, ...], args: Sequence[object]) -> Any:
        """The variant for the sizes ``key``, compiled from ``args`` unless another thread did it first."""
        with self._lock, _compiling(), _gc_paused():
            variant = self._variants.get(key)
            if variant is None:
                if self._sym_positions:
                    static = specialize(self._gm, args, self._sym_positions)
                    rest = [a for i, a in enumerate(args) if i not in self._sym_positions]
                    variant = _Specialized(self._compile(static, rest), self._sym_positions)
                else:
                    variant = self._compile(self._gm, list(args))
                self._variants[key] = variant
        return variant

    def _call_bucket(self, args: Sequence[object], sizes: tuple[int, ...], bucket: tuple[int, ...]) -> Any:
        """Run the static graph of ``bucket`` on padded arguments and slice the outputs back to ``sizes``."""
        plan = self._plan
        assert isinstance(plan, _buckets.BucketPlan)
        key = ("bucket", *bucket)
        variant = self._known_variant(key)
        if variant is None:
            with self._lock, _compiling(), _gc_paused():
                variant = self._variants.get(key)
                if variant is None:
                    problem = _buckets.neutral(self._gm, args, plan, bucket)
                    if problem is not None:
                        return self._not_neutral(sizes, bucket, problem)
                    padded = _buckets.pad(args, plan, bucket)
                    static = specialize(self._gm, padded, self._sym_positions)
                    rest = [a for i, a in enumerate(padded) if i not in self._sym_positions]
                    variant = _Specialized(self._compile(static, rest, bucket=bucket), self._sym_positions)
                    self._variants[key] = variant
        if isinstance(variant, _Eager):
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
        if variant is None and self._sym_positions and self._over_budget():
            with self._lock:
                variant = self._variants.get(key) or self._past_budget(key)
                self._variants[key] = variant
        return variant

    def _over_budget(self) -> bool:
        compiled = [v for v in self._variants.values() if not isinstance(v, _Eager) or v.report.reason != _BUDGET]
        return len(compiled) >= self._options.max_graphs

    def _past_budget(self, key: tuple[object, ...]) -> _Eager:
        """A new shape past ``max_graphs``: run it in PyTorch (one warning per graph), or raise under strict."""
        seen = [k for k, v in self._variants.items() if not (isinstance(v, _Eager) and v.report.reason == _BUDGET)]
        sizes = ", ".join(str(list(k)) for k in seen)
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
        rep = _report.CompileReport(
            graph_id=_report.next_graph_id(),
            device="eager",
            requested_device=self._options.device,
            strict=False,
            reason=_BUDGET,
        )
        _report.record(rep)
        return _Eager(self._gm, rep)

    # -- compilation ---------------------------------------------------------------------------------------------

    def _compile(
        self,
        gm: torch.fx.GraphModule,
        args: list[object],
        exclude: frozenset[str] = frozenset(),
        bucket: tuple[int, ...] | None = None,
        calibration: Any = None,
    ) -> _Eager | _QnnVariant:
        """Compile one static graph along the device chain; ``calibration`` (a ``_quantize.Calibration``) asks for
        the quantized graph."""
        from qnnx_backend._progress import compile_progress

        graph_id = _report.next_graph_id()
        timings: dict[str, float] = {}
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        with compile_progress(graph_id, timings, shapes):
            return self._compile_graph(gm, args, exclude, graph_id, timings, shapes, bucket, calibration)

    def _compile_graph(
        self,
        gm: torch.fx.GraphModule,
        args: list[object],
        exclude: frozenset[str],
        graph_id: int,
        timings: dict[str, float],
        shapes: tuple[tuple[int, ...], ...],
        bucket: tuple[int, ...] | None = None,
        calibration: Any = None,
    ) -> _Eager | _QnnVariant:
        import qnnx_detection

        opts = self._options
        start = time.perf_counter()
        base: dict[str, Any] = {
            "graph_id": graph_id,
            "requested_device": opts.device,
            "strict": opts.strict,
            "input_shapes": shapes,
            "bucket": bucket,
        }

        def eager(reason: str, attempts: Sequence[_report.Attempt] = (), *, warn: bool) -> _Eager:
            timings["total"] = time.perf_counter() - start
            rep = _report.CompileReport(
                device="eager", reason=reason, attempts=tuple(attempts), timings=timings, **base
            )
            _report.record(rep)
            if warn:
                warnings.warn(
                    f"qnn backend: {reason}; running the original PyTorch graph.", QnnFallbackWarning, stacklevel=3
                )
            logger.info("%s", rep.summary())
            return _Eager(gm, rep)

        # A quick probe (no backend initialized): the session built below is the real test of the device, and its
        # failure carries the true cause. Devices known to be unusable (QNN missing or disabled, no library, no
        # device enumerated) are still skipped without trying.
        probe = qnnx_detection.probe(initialize=False)
        device = effective_device(opts.device, probe.overrides.device)
        if device != opts.device:
            logger.info("QNNX_DEVICE=%s overrides device='auto'", device)
        if device == "cpu":
            return eager("device='cpu' was requested", warn=False)

        t = time.perf_counter()
        analysis = analyze(gm, args, opts)
        timings["analyze"] = time.perf_counter() - t
        if analysis.problems:
            details = [p.detail for p in analysis.problems]
            if opts.strict:
                raise UnsupportedGraphError(
                    details,
                    "With strict=True qnnx refuses to run such a graph on QNN, since the result would differ from "
                    "PyTorch. Fix: call the model under torch.no_grad() and model.eval(), avoid in-place updates of "
                    "inputs and buffers, or use strict=False to run these graphs in PyTorch.",
                )
            return eager("; ".join(details), warn=True)

        devices = [d for d in ([device] if device != "auto" else CHAIN) if d not in exclude]
        attempts: list[_report.Attempt] = []
        # One context for every device of the chain: the graph is exported (and quantized) once.
        ctx = CompileContext(
            gm=gm, args=args, options=opts, analysis=analysis, timings=timings, calibration=calibration
        )
        for pos, dev in enumerate(devices):
            nxt = devices[pos + 1] if pos + 1 < len(devices) else "eager PyTorch"
            t = time.perf_counter()
            status = probe.backend(dev)
            if not status.available:
                attempts.append(_report.Attempt(device=dev, ok=False, reason=f"skipped: {status.reason}"))
                if opts.strict and device != "auto":
                    raise QnnDeviceError(dev, f"the QNN backend is not usable here: {status.reason}")
                logger.info(
                    "qnn backend: graph %d: %s unavailable (%s); now trying %s", graph_id, dev, status.reason, nxt
                )
                continue
            try:
                quantization = None
                if ctx.calibration is not None:
                    from qnnx_backend import _quantize

                    program, quantization = _quantize.build_program(ctx, dev, graph_id)
                else:
                    program = build_program(ctx, dev)
            except _DeviceRejected as exc:
                attempts.append(
                    _report.Attempt(device=dev, ok=False, reason=exc.cause, seconds=time.perf_counter() - t)
                )
                if opts.strict and device != "auto":
                    raise QnnDeviceError(dev, exc.cause) from exc.__cause__
                logger.warning("qnn backend: graph %d failed on %s (%s); now trying %s", graph_id, dev, exc.cause, nxt)
                continue
            attempts.append(_report.Attempt(device=dev, ok=True, seconds=time.perf_counter() - t))
            timings["total"] = time.perf_counter() - start
            rep = _report.CompileReport(
                device=dev,
                attempts=tuple(attempts),
                is_simulator=program.target.is_simulator,
                soc_model=program.target.soc_model,
                soc_name=qnnx_detection.soc_name(program.target.soc_model),
                cache=program.cache,
                onnx_nodes=program.onnx_nodes,
                passes_applied=program.passes_applied,
                placement=dict(program.placement),
                cpu_nodes=dict(program.cpu_nodes),
                timings=timings,
                quantization=quantization,
                **base,
            )
            _report.record(rep)
            logger.info("%s", rep.summary())
            return _QnnVariant(self, gm, args, program, rep, exclude, calibration)
        reasons = "; ".join(f"{a.device}: {a.reason}" for a in attempts) or "no QNN device was tried"
        if opts.strict:  # device='auto' with strict: no device of the chain took the graph
            raise QnnDeviceError(device, f"no QNN device could take the graph ({reasons})")
        reason = f"no QNN device could take the graph ({reasons})"
        if not exclude and attempts and all(a.reason and a.reason.startswith("skipped") for a in attempts):
            _warn_no_device_once(reason)  # nothing was even tried: say so once, not per graph
        return eager(reason, attempts, warn=False)


_BUDGET = "max_graphs reached: this size runs in PyTorch"
_NOT_NEUTRAL = object()
_no_device_warned = threading.Event()


def _warn_no_device_once(reason: str) -> None:
    """One QnnFallbackWarning per process when auto mode runs graphs in PyTorch because no QNN device is usable
    (QNNX_DISABLE=1, onnxruntime-qnn missing, no device): otherwise the only trace is an INFO log line."""
    if _no_device_warned.is_set():
        return
    _no_device_warned.set()
    warnings.warn(
        f"qnn backend: {reason}; graphs run in PyTorch. This warning is shown once per process; "
        "qnnx_backend.compile_reports() lists every graph.",
        QnnFallbackWarning,
        stacklevel=4,
    )


@attrs.frozen
class _Specialized:
    """A static variant of a graph with symbolic sizes: drops the size arguments before calling the variant."""

    inner: Any
    sym_positions: tuple[int, ...]

    @property
    def report(self) -> _report.CompileReport:
        return self.inner.report

    def __call__(self, args: Sequence[object]) -> Any:
        return self.inner([a for i, a in enumerate(args) if i not in self.sym_positions])


_version_of = operator.attrgetter("_version")


class _FrozenWeights:
    """The parameter and buffer tensors frozen into a compiled graph, with their version counters at compile time.

    :meth:`changed` runs on every call, so it is three passes in C (pick the arguments, compare identities, read
    the version counters) over lists built once. Reading ``Tensor._version`` (about 0.1 µs) is most of its cost.
    """

    __slots__ = ("_pick", "_tensors", "_versions")

    def __init__(self, args: Sequence[object], param_indices: Sequence[int]) -> None:
        indices = [i for i in param_indices if isinstance(args[i], torch.Tensor)]
        self._tensors = tuple(args[i] for i in indices)
        self._versions = list(map(_version_of, self._tensors))
        # itemgetter returns a bare item for one index and cannot take none: normalize to a tuple either way.
        self._pick: Callable[[Sequence[object]], tuple[object, ...]]
        if len(indices) > 1:
            self._pick = operator.itemgetter(*indices)
        else:
            self._pick = lambda a, picked=tuple(indices): tuple(a[i] for i in picked)  # type: ignore[misc]  # default-arg lambda

    def changed(self, args: Sequence[object]) -> bool:
        """Whether an argument is another tensor than the one frozen, or was updated in place since (an optimizer
        step, ``load_state_dict``, ``fill_`` under ``no_grad``: each bumps the version counter)."""
        return any(map(operator.is_not, self._pick(args), self._tensors)) or not self.current()

    def current(self) -> bool:
        """Whether the frozen tensors still hold what was frozen (no in-place update since)."""
        return list(map(_version_of, self._tensors)) == self._versions


class _QnnVariant:
    """One static graph compiled for a QNN device."""

    def __init__(
        self,
        owner: QnnGraph,
        gm: torch.fx.GraphModule,
        args: Sequence[object],
        program: Program,
        report: _report.CompileReport,
        exclude: frozenset[str],
        calibration: Any = None,
    ) -> None:
        self._owner = owner
        self._calibration = calibration  # a recompile (weights changed, device rejected) quantizes again
        self._gm = gm
        self._program = program
        self.report = report
        self._exclude = exclude
        self._fallback: _Eager | _QnnVariant | None = None
        self._verified = not owner._options.verify
        if report.quantization is not None and report.quantization.used:
            # Checked against eager PyTorch at compile (SQNR, cosine); verify's fp16-level limits do not apply.
            self._verified = True
        self._lock = threading.Lock()
        # Frozen weights are snapshots: remember which tensors and which versions were frozen, so that an in-place
        # update after compile (optimizer step, load_state_dict, no_grad fill_) triggers a recompile instead of a
        # silently stale result.
        self._frozen = _FrozenWeights(args, program.target.param_indices)
        # Programs compiled for other weights of the same graph, still current: Dynamo serves modules of the same
        # structure compiled apart (one per transformer layer) with one graph, passing each module's weights.
        self._others: list[tuple[_FrozenWeights, Program, _report.CompileReport]] = []

    def __call__(self, args: Sequence[object]) -> Any:
        if self._fallback is not None:
            return self._fallback(args)
        if self._frozen.changed(args):
            with self._lock, _compiling():
                if self._frozen.changed(args) and not self._switch_weights(args):
                    logger.info(
                        "qnn backend: weights of graph %d changed since compile; recompiling", self.report.graph_id
                    )
                    fresh = self._owner._compile(self._gm, list(args), self._exclude, calibration=self._calibration)
                    if isinstance(fresh, _QnnVariant):
                        self._keep_current()
                        self._program, self.report, self._frozen = fresh._program, fresh.report, fresh._frozen
                    else:
                        self._fallback = fresh
                        return fresh(args)
        checking = not self._verified
        if checking:
            self._verified = True
            # The arguments the graph writes into, as they were before this call: eager PyTorch computes the
            # reference from a copy of them, and a rejected first call leaves them as the caller passed them.
            before = {i: cast(torch.Tensor, args[i]).clone() for i in self._written()}
        try:
            out = self._program.run(args)
        except Exception as exc:  # a run-time failure of the EP (e.g. an NPU subsystem restart)
            out = self._recover(args, exc)
            if out is _FELL_BACK:
                return self._fallback(args)  # type: ignore[misc]
        if checking:
            problem = self._check_accuracy(args, out, before)
            if problem is not None:
                for i, value in before.items():
                    cast(torch.Tensor, args[i]).copy_(value)
                return self._reject(args, problem)
        return out

    def _written(self) -> list[int]:
        """The Dynamo arguments the graph writes into (a KV cache's tensors)."""
        sig = self._program.signature
        return sorted({i for _, i in sig.writebacks} | {w.arg_index for w in sig.row_writebacks})

    def _switch_weights(self, args: Sequence[object]) -> bool:
        """Make current the program compiled earlier for the weights in ``args``, if one is still current."""
        for k, (frozen, program, report) in enumerate(self._others):
            if not frozen.changed(args):
                del self._others[k]
                self._keep_current()
                self._program, self.report, self._frozen = program, report, frozen
                return True
        return False

    def _keep_current(self) -> None:
        """Keep the current program for its weights, unless they were updated in place (it is then stale for good);
        at most ``max_graphs`` programs per graph, the least recently used dropped first."""
        self._others = [o for o in self._others if o[0].current()]
        if self._frozen.current():
            self._others.insert(0, (self._frozen, self._program, self.report))
        del self._others[max(0, self._owner._options.max_graphs - 1) :]

    def _recover(self, args: Sequence[object], exc: Exception) -> Any:
        opts = self._owner._options
        try:
            label = f"graph {self.report.graph_id} on {self.report.device}"
            self._program, out = recreate_and_run(self._program, args, label, exc)
            return out
        except Exception as again:
            cause = f"run failed twice on {self.report.device}: {again}"
            if opts.strict:
                raise QnnRuntimeError(f"qnn backend: graph {self.report.graph_id}: {cause}") from again
            self._reject_device(args, cause)
            return _FELL_BACK

    def _check_accuracy(self, args: Sequence[object], out: Any, before: dict[int, torch.Tensor]) -> str | None:
        """Why the first QNN call disagrees with eager PyTorch on the same inputs, or None when it agrees. For a
        graph that writes into its arguments, eager runs on copies of them and the written values are compared
        too."""
        eager_args: list[Any] = [before[i].clone() if i in before else a for i, a in enumerate(args)]
        with torch.no_grad():
            ref = self._gm(*eager_args)
        got_leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        ref_leaves = [t for t in torch.utils._pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
        pairs = [(f"output {k}", g, r) for k, (g, r) in enumerate(zip(got_leaves, ref_leaves))]
        pairs += [(f"the write into argument {i}", cast(torch.Tensor, args[i]), eager_args[i]) for i in before]
        opts = self._owner._options
        for what, g, r in pairs:
            problem = mismatch(g, r, opts.verify_rtol, opts.verify_min_cosine)
            if problem is not None:
                return f"{what} differs from eager PyTorch: {problem}"
        return None

    def _reject(self, args: Sequence[object], problem: str) -> Any:
        if self._owner._options.strict:
            raise QnnRuntimeError(
                f"qnn backend: accuracy guard: graph {self.report.graph_id} on {self.report.device}: {problem}"
            )
        self._reject_device(args, f"accuracy guard: {problem}")
        return self._fallback(args)  # type: ignore[misc]

    def _reject_device(self, args: Sequence[object], cause: str) -> None:
        warnings.warn(
            f"qnn backend: graph {self.report.graph_id} leaves {self.report.device}: {cause}",
            QnnFallbackWarning,
            stacklevel=4,
        )
        with _compiling():
            self._fallback = self._owner._compile(
                self._gm, list(args), self._exclude | {self.report.device}, calibration=self._calibration
            )


_FELL_BACK = object()


def mismatch(got: torch.Tensor, ref: torch.Tensor, rtol: float, min_cosine: float) -> str | None:
    """Why ``got`` is not ``ref`` within fp16-level limits, or None. NaN and infinities must sit where eager has
    them (HTP has neither: a NaN in eager that comes back finite is a wrong result); the finite values must be
    within ``rtol`` of the reference's largest magnitude and have a cosine of at least ``min_cosine``."""
    if got.shape != ref.shape:
        return f"shape {tuple(got.shape)} where eager gives {tuple(ref.shape)}"
    if not (got.is_floating_point() and ref.is_floating_point()):
        return None if torch.equal(got, ref.to(got.dtype)) else "a non-float value differs"
    g64, r64 = got.detach().double().flatten(), ref.detach().double().flatten()
    same_special = (torch.isnan(g64) & torch.isnan(r64)) | (torch.isinf(r64) & (g64 == r64))
    finite = torch.isfinite(g64) & torch.isfinite(r64)
    odd = ~(same_special | finite)
    if bool(odd.any()):
        k = int(odd.nonzero()[0])
        return f"element {k} is {g64[k].item()} where eager gives {r64[k].item()}"
    g64, r64 = g64[finite], r64[finite]
    if not g64.numel():
        return None
    scale = r64.abs().max().item()
    err = (g64 - r64).abs().max().item()
    rel = err / scale if scale > 0 else err
    denom = (g64.norm() * r64.norm()).item()
    cos = (g64 @ r64).item() / denom if denom > 0 else (1.0 if err == 0 else 0.0)
    if rel <= rtol and cos >= min_cosine:
        return None
    return f"max|err|/max|ref| = {rel:.3g} (limit {rtol:g}), cosine = {cos:.6f} (limit {min_cosine:g})"
