"""Calibration of graphs compiled with the ``quantize`` option (private; public as :func:`qnnx_backend.calibrate`).

A graph compiled with ``quantize`` has no quantized form until it is calibrated: inside :func:`calibrate`, its calls
run the original graph in eager PyTorch and record copies of the user inputs (a :class:`CalibrationSession`). On
exit each recorded graph is handed its :class:`Calibration` per input shape, and compiles its quantized variants
(:mod:`qnnx_backend._quantize` makes the QDQ model, :mod:`qnnx_backend._build` checks it against float eager).

Importing this module imports no torch: ``import qnnx_backend`` stays light.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from qnnx_backend._quantspec import QuantizeSpec
from qnnx_backend.errors import InvalidOptionsError, QuantizationError

if TYPE_CHECKING:
    import torch

HOW_TO = (
    "Calibrate it first: `with qnnx_backend.calibrate(compiled): compiled(x)` for a few representative inputs "
    "(each input shape that should run quantized)"
)
"""The fix to name when a quantizing graph was not calibrated."""
DEFAULT_MAX_SAMPLES = 32
"""Calls recorded per graph and input shape; more calls are sampled uniformly down to it."""


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


class CalibratingGraph(Protocol):
    """What :func:`calibrate` needs of a compiled graph: to be handed the calibration of one input shape."""

    def install_calibration(
        self, key: tuple[object, ...], args: list[object], calibration: Calibration, grad: bool
    ) -> None: ...


@attrs.define
class _Recording:
    template: list[object]
    positions: tuple[int, ...]
    grad: bool
    limit: int
    samples: list[tuple[torch.Tensor, ...]] = attrs.field(factory=list)
    calls: int = 0
    """Calls seen; past ``limit`` the samples are a uniform random choice of them (reservoir sampling)."""
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def slot(self) -> int | None:
        """Where this call's copy goes in ``samples`` (``len(samples)`` appends), or None to skip it: every call
        seen so far has the same chance to be kept, whatever their number (a decode step is called once per token)."""
        self.calls += 1
        if len(self.samples) < self.limit:
            return len(self.samples)
        k = self.rng.randrange(self.calls)
        return k if k < self.limit else None


class CalibrationSession:
    """The graphs called inside one :func:`calibrate` block, with their recorded inputs per input shape."""

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self.graphs: dict[CalibratingGraph, tuple[QuantizeSpec, dict[tuple[object, ...], _Recording]]] = {}

    def record(
        self,
        graph: CalibratingGraph,
        key: tuple[object, ...],
        gm: Any,
        spec: QuantizeSpec,
        args: Sequence[object],
    ) -> Any:
        """Record a copy of the user inputs of one call of ``graph`` (sizes ``key``), and run ``gm`` in eager.

        The inputs the graph writes into (a static KV cache) are user inputs here, copied as the call finds them;
        the eager run then writes into the caller's tensors, as the compiled graph will."""
        import torch

        per_key = self.graphs.setdefault(graph, (spec, {}))[1]
        rec = per_key.get(key)
        if rec is None:
            import qnnx_export

            analysis = qnnx_export.analyze(gm, args)
            analysis = qnnx_export.lift_mutations(analysis) or analysis
            positions = tuple(i for i in analysis.user_indices if isinstance(args[i], torch.Tensor))
            template = [_copy(a) if i in positions else a for i, a in enumerate(args)]
            rec = _Recording(
                template=template, positions=positions, grad=torch.is_grad_enabled(), limit=self.max_samples
            )
            per_key[key] = rec
        slot = rec.slot()
        if slot is not None:
            sample = tuple(_copy(args[i]) for i in rec.positions)
            if slot == len(rec.samples):
                rec.samples.append(sample)
            else:
                rec.samples[slot] = sample
        return gm(*args)


def _copy(value: Any) -> Any:
    import torch

    return value.detach().clone() if isinstance(value, torch.Tensor) else value


_ACTIVE: contextvars.ContextVar[CalibrationSession | None] = contextvars.ContextVar("qnnx_calibrating", default=None)


def active_session() -> CalibrationSession | None:
    """The :func:`calibrate` block open in this thread (or asyncio task), if any."""
    return _ACTIVE.get()


def _is_compiled(target: Any) -> bool:
    """What torch.compile returned, or a model prepared by ``hf.compile_for_generation`` (whose ``forward`` wraps
    the compiled one to collect its graphs' reports)."""
    return hasattr(target, "_torchdynamo_orig_callable") or hasattr(target, "_qnnx_eager_forward")


@contextlib.contextmanager
def calibrate(compiled: Any, *, max_samples: int = DEFAULT_MAX_SAMPLES) -> Iterator[None]:
    """Calibrate a model compiled with ``options={"quantize": ...}`` on the inputs it is called with in the block.

    Inside the block, each Dynamo graph compiled with ``quantize`` runs the original PyTorch graph and records a
    copy of its inputs; graph breaks are fine, and every input shape seen is calibrated. On a normal exit each
    recorded graph is quantized with onnxruntime's QNN tooling, compiled for QNN and compared with eager PyTorch on
    the recorded inputs (the figures are in :func:`qnnx_backend.compile_reports`); later calls run the quantized
    graphs. Calibrating again replaces the quantized graphs of the shapes seen.

    ``compiled`` is what ``torch.compile`` returned, or a module whose ``forward`` was compiled (a Hugging Face
    model prepared by :func:`qnnx_backend.hf.compile_for_generation`): then ``model.generate(...)`` inside the block
    calibrates every graph generation runs (each prefill bucket and the decode step) on the tensors generation
    really passes, the static KV cache included. Graphs that write into their inputs (the cache) do so during the
    block as in eager PyTorch, so generation inside it gives eager's tokens.

    The block records the quantizing graphs called in the current thread (or asyncio task), which are those of
    ``compiled`` when only it is called inside the block.

    Example::

        compiled = torch.compile(model.eval(), backend="qnn", options={"quantize": "a16w8"})
        with torch.no_grad():
            with qnnx_backend.calibrate(compiled):
                for x in samples:
                    compiled(x)
            y = compiled(x)  # quantized, on the NPU

    Args:
        compiled: the compiled model or function, or a module whose ``forward`` is compiled.
        max_samples: calls recorded per graph and input shape; a graph called more often (a decode step runs once
            per new token) keeps a uniform random choice of that many of its calls (the choice is the same on
            every run). Each sample is a copy of the graph's inputs, the KV cache included.

    Raises:
        TypeError: ``compiled`` is neither what ``torch.compile`` returns nor a module with a compiled ``forward``.
        InvalidOptionsError: ``max_samples`` is not a positive int.
        QuantizationError: the block is nested in another one, or no graph compiled with ``quantize`` ran inside
            it; under ``strict=True``, a graph that cannot run quantized (see :class:`QuantizationError`).
    """
    if not _is_compiled(compiled) and not _is_compiled(getattr(compiled, "forward", None)):
        raise TypeError(
            f"calibrate() takes what torch.compile returns (a compiled module or function), or a model whose forward "
            f"was compiled (qnnx_backend.hf.compile_for_generation), not {type(compiled).__name__}: compiled = "
            "torch.compile(model, backend='qnn', options={'quantize': 'a16w8'}), then `with "
            "qnnx_backend.calibrate(compiled): compiled(x)`; or compile_for_generation(model, options={'quantize': "
            "'a16w8'}), then `with qnnx_backend.calibrate(model): model.generate(...)`."
        )
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1:
        raise InvalidOptionsError(
            f"calibrate(max_samples={max_samples!r}) is not valid; accepted: a positive int (calls recorded per graph "
            f"and input shape, {DEFAULT_MAX_SAMPLES} by default)"
        )
    if _ACTIVE.get() is not None:
        raise QuantizationError("calibrate() blocks cannot be nested; close the first block before opening another")
    session = CalibrationSession(max_samples)
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
    for graph, (spec, per_key) in session.graphs.items():
        for key, rec in per_key.items():
            calibration = Calibration(spec=spec, positions=rec.positions, samples=tuple(rec.samples))
            graph.install_calibration(key, rec.template, calibration, rec.grad)
