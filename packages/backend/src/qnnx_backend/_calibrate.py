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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from qnnx_backend._quantspec import QuantizeSpec
from qnnx_backend.errors import QuantizationError

if TYPE_CHECKING:
    import torch

HOW_TO = (
    "Calibrate it first: `with qnnx_backend.calibrate(compiled): compiled(x)` for a few representative inputs "
    "(each input shape that should run quantized)"
)
"""The fix to name when a quantizing graph was not calibrated."""


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
    samples: list[tuple[torch.Tensor, ...]] = attrs.field(factory=list)


class CalibrationSession:
    """The graphs called inside one :func:`calibrate` block, with their recorded inputs per input shape."""

    def __init__(self) -> None:
        self.graphs: dict[CalibratingGraph, tuple[QuantizeSpec, dict[tuple[object, ...], _Recording]]] = {}

    def record(
        self,
        graph: CalibratingGraph,
        key: tuple[object, ...],
        gm: Any,
        spec: QuantizeSpec,
        args: Sequence[object],
    ) -> Any:
        """Record a copy of the user inputs of one call of ``graph`` (sizes ``key``), and run ``gm`` in eager."""
        import torch

        per_key = self.graphs.setdefault(graph, (spec, {}))[1]
        rec = per_key.get(key)
        if rec is None:
            import qnnx_export

            user = qnnx_export.analyze(gm, args).user_indices
            positions = tuple(i for i in user if isinstance(args[i], torch.Tensor))
            template = [_copy(a) if i in positions else a for i, a in enumerate(args)]
            rec = per_key[key] = _Recording(template=template, positions=positions, grad=torch.is_grad_enabled())
        rec.samples.append(tuple(_copy(args[i]) for i in rec.positions))
        return gm(*args)


def _copy(value: Any) -> Any:
    import torch

    return value.detach().clone() if isinstance(value, torch.Tensor) else value


_ACTIVE: contextvars.ContextVar[CalibrationSession | None] = contextvars.ContextVar("qnnx_calibrating", default=None)


def active_session() -> CalibrationSession | None:
    """The :func:`calibrate` block open in this thread (or asyncio task), if any."""
    return _ACTIVE.get()


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
    session = CalibrationSession()
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
