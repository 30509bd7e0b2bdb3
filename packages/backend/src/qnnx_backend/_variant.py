"""The run stage: what one static graph of a compiled function runs as (private).

:class:`Eager` runs the original graph in PyTorch; :class:`QnnVariant` runs a QNN program, guarded: its frozen
weights are watched (:class:`FrozenWeights`), its first call is compared with eager PyTorch, a run-time failure of
the EP recreates the session once, and a device that fails sends the graph on down the chain through the
``recompile`` callable its owner hands it. :class:`Specialized` drops the size arguments of a graph with symbolic
sizes before calling its static variant.
"""

from __future__ import annotations

import logging
import operator
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import attrs
import torch

from qnnx_backend import _report
from qnnx_backend._calibrate import Calibration
from qnnx_backend._compare import EagerReference, mismatch, run_eager
from qnnx_backend._options import BackendOptions
from qnnx_backend._program import Program, recreate_and_run
from qnnx_backend._trace import compiling
from qnnx_backend._untrusted import BeyondHalfRangeInput, UntrustedRun
from qnnx_backend.errors import QnnFallbackWarning, QnnRuntimeError

logger = logging.getLogger(__name__)

PAST_BUDGET = "max_graphs reached: this size runs in PyTorch"
"""The reason of the eager variant a new size gets past ``max_graphs``."""


@attrs.frozen
class Eager:
    """Runs the original graph with PyTorch."""

    gm: Callable[..., Any]
    report: _report.CompileReport

    def __call__(self, args: Sequence[object]) -> Any:
        return self.gm(*args)


class Recompile(Protocol):
    """How a variant compiles its graph again along the device chain (its owner's compile): with other weights, or
    without the devices it left."""

    def __call__(
        self,
        gm: torch.fx.GraphModule,
        args: list[object],
        exclude: frozenset[str] = ...,
        bucket: tuple[int, ...] | None = ...,
        calibration: Calibration | None = ...,
    ) -> Eager | QnnVariant: ...


@attrs.frozen
class Specialized:
    """A static variant of a graph with symbolic sizes: drops the size arguments before calling the variant."""

    inner: Any
    sym_positions: tuple[int, ...]

    @property
    def report(self) -> _report.CompileReport:
        return self.inner.report

    def __call__(self, args: Sequence[object]) -> Any:
        return self.inner([a for i, a in enumerate(args) if i not in self.sym_positions])


_version_of = operator.attrgetter("_version")


class FrozenWeights:
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

    @property
    def tensors(self) -> tuple[object, ...]:
        """The frozen tensors, in argument order."""
        return self._tensors


class QnnVariant:
    """One static graph compiled for a QNN device."""

    def __init__(
        self,
        options: BackendOptions,
        recompile: Recompile,
        gm: torch.fx.GraphModule,
        args: Sequence[object],
        program: Program,
        report: _report.CompileReport,
        exclude: frozenset[str],
        calibration: Calibration | None = None,
        *,
        reference: EagerReference | None = None,
    ) -> None:
        self._options = options
        self._recompile = recompile
        self._calibration = calibration  # a recompile (weights changed, device rejected) quantizes again
        self._gm = gm
        self._program = program
        self.report = report
        self._exclude = exclude
        self._fallback: Eager | QnnVariant | None = None
        self._verified = not options.verify
        # The compile's eager outputs on its arguments: the accuracy guard of a first call with those same arguments
        # reads them instead of running the graph again (dropped once the guard has run).
        self._reference = reference if options.verify else None
        if report.quantization is not None and report.quantization.used:
            # Checked against eager PyTorch at compile (SQNR, cosine); verify's fp16-level limits do not apply.
            self._verified = True
            self._reference = None
        # A float input beyond float16's range reaches HTP clipped to +-65504: exact for some graphs (an additive
        # attention mask of float32's minimum), wrong for others (x * 0.5, x == -inf). The first call with such an
        # input is compared with eager PyTorch like a first call; where it differs, later ones run in PyTorch.
        self._clip_state = "unchecked" if self._verified is False else "trusted"
        self._writes = bool(self._written())
        self.range_recomputed = 0
        """Calls computed in PyTorch because the device returned HTP's stand-in for NaN or an infinity."""
        self._lock = threading.Lock()
        # Frozen weights are snapshots: remember which tensors and which versions were frozen, so that an in-place
        # update after compile (optimizer step, load_state_dict, no_grad fill_) triggers a recompile instead of a
        # silently stale result.
        self._frozen = FrozenWeights(args, program.target.param_indices)
        # Programs compiled for other weights of the same graph, still current: Dynamo serves modules of the same
        # structure compiled apart (one per transformer layer) with one graph, passing each module's weights.
        self._others: list[tuple[FrozenWeights, Program, _report.CompileReport]] = []

    @property
    def program(self) -> Program:
        """The program that serves the current weights."""
        return self._program

    @property
    def gm(self) -> torch.fx.GraphModule:
        """The static graph this variant compiled."""
        return self._gm

    @property
    def frozen(self) -> FrozenWeights:
        """The weights frozen into :attr:`program`."""
        return self._frozen

    def settled(self) -> Eager | QnnVariant:
        """Where this graph runs now: itself, or the variant it fell back to when it left its device at run time."""
        here: Eager | QnnVariant = self
        while isinstance(here, QnnVariant) and here._fallback is not None:
            here = here._fallback
        return here

    def __call__(self, args: Sequence[object]) -> Any:
        if self._fallback is not None:
            return self._fallback(args)
        if self._frozen.changed(args):
            with self._lock, compiling():
                if self._frozen.changed(args) and not self._switch_weights(args):
                    logger.info(
                        "qnn backend: weights of graph %d changed since compile; recompiling", self.report.graph_id
                    )
                    fresh = self._recompile(self._gm, list(args), self._exclude, calibration=self._calibration)
                    if isinstance(fresh, QnnVariant):
                        self._keep_current()
                        self._program, self.report, self._frozen = fresh._program, fresh.report, fresh._frozen
                    else:
                        self._fallback = fresh
                        return fresh(args)
        checking = not self._verified
        if self._clip_state == "refused":
            self._program.clip_inputs = False  # also the program of other weights, or of a recompile
        # A graph that writes into its arguments needs them as they were for eager's reference, so its inputs are
        # looked at before the run; any other graph's run says whether it clipped.
        unchecked = self._clip_state == "unchecked"
        clip_check = unchecked and self._writes and self._program.beyond_half_range(args)
        if checking or clip_check:
            self._verified = True
            # The arguments the graph writes into, as they were before this call: eager PyTorch computes the
            # reference from a copy of them, and a rejected first call leaves them as the caller passed them.
            before = {i: cast(torch.Tensor, args[i]).clone() for i in self._written()}
        try:
            out = self._program.run(args)
        except UntrustedRun as untrusted:
            if checking:
                self._verified = False  # no trusted run yet: the guard checks the next call that runs on the device
            return self._untrusted(args, untrusted)
        except Exception as exc:  # a run-time failure of the EP (e.g. an NPU subsystem restart)
            out = self._recover(args, exc)
            if out is _FELL_BACK:
                return self._fallback(args)  # type: ignore[misc]
        if unchecked and not self._writes and self._program.clipped:
            clip_check, before = True, {}
        if checking or clip_check:
            problem = self._check_accuracy(args, out, before)
            if problem is not None:
                for i, value in before.items():
                    cast(torch.Tensor, args[i]).copy_(value)
                if clip_check:
                    # The clipped inputs may be the cause: such calls run in PyTorch from now on, and a call
                    # within float16's range still gets the first-call guard if this was the first call.
                    self._verified = not checking
                    return self._refuse_clipping(args, problem)
                return self._reject(args, problem)
            if clip_check:
                self._clip_state = "verified"
                logger.info(
                    "qnn backend: graph %d: inputs clipped to float16's range agree with eager PyTorch",
                    self.report.graph_id,
                )
        return out

    @property
    def clip_state(self) -> str:
        """Whether a float input beyond float16's range may be clipped for HTP: ``verified`` (a clipped call agreed
        with eager PyTorch), ``refused`` (one differed: such calls run in PyTorch), ``unchecked`` (no such call yet)
        or ``trusted`` (not checked: ``verify=False``, or a quantized graph)."""
        return self._clip_state

    def _refuse_clipping(self, args: Sequence[object], problem: str) -> Any:
        """After a clipped call that differed from eager PyTorch: calls with inputs beyond float16's range are
        computed in PyTorch (or raise under strict), this one first."""
        self._clip_state = "refused"
        self._program.clip_inputs = False
        return self._untrusted(args, BeyondHalfRangeInput(None, None, problem))

    def _untrusted(self, args: Sequence[object], untrusted: UntrustedRun) -> Any:
        """A call with a NaN input, an integer input beyond what the graph's int32 arithmetic takes, or whose QNN
        result holds HTP's stand-in for NaN or an infinity: this call is computed in PyTorch (the arguments are
        untouched: nothing was written), later calls run on the device again."""
        self.range_recomputed += 1
        cause = f"{untrusted}; {untrusted.why}"
        if self._options.strict:
            raise QnnRuntimeError(
                f"qnn backend: graph {self.report.graph_id} on {self.report.device}: {cause}. The arguments are "
                "unchanged. Fix: device='auto' (such calls are then computed in PyTorch), or keep the graph's "
                "values finite and within +-65504 and its integer inputs within the bound named."
            ) from untrusted
        if self.range_recomputed == 1:
            warnings.warn(
                f"qnn backend: graph {self.report.graph_id} on {self.report.device}: {cause}; this call, and any "
                "later call where it happens again, is computed in PyTorch",
                QnnFallbackWarning,
                stacklevel=4,
            )
        logger.info("qnn backend: graph %d: call computed in PyTorch: %s", self.report.graph_id, untrusted)
        with torch.no_grad():
            return self._gm(*args)

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
        del self._others[max(0, self._options.max_graphs - 1) :]

    def _recover(self, args: Sequence[object], exc: Exception) -> Any:
        opts = self._options
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
        reference, self._reference = self._reference, None
        eager_args: list[Any] = [before[i].clone() if i in before else a for i, a in enumerate(args)]
        if not before and reference is not None and reference.matches(args):
            ref = reference.outputs
        else:
            ref = run_eager(self._gm, eager_args)
        got_leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        ref_leaves = [t for t in torch.utils._pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
        pairs = [(f"output {k}", g, r) for k, (g, r) in enumerate(zip(got_leaves, ref_leaves))]
        pairs += [(f"the write into argument {i}", cast(torch.Tensor, args[i]), eager_args[i]) for i in before]
        opts = self._options
        for what, g, r in pairs:
            problem = mismatch(g, r, opts.verify_rtol, opts.verify_min_cosine)
            if problem is not None:
                return f"{what} differs from eager PyTorch: {problem}"
        return None

    def _reject(self, args: Sequence[object], problem: str) -> Any:
        if self._options.strict:
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
        with compiling():
            self._fallback = self._recompile(
                self._gm, list(args), self._exclude | {self.report.device}, calibration=self._calibration
            )


_FELL_BACK = object()
