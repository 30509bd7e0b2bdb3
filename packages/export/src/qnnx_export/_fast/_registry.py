"""The op table: which handler translates each ATen overload, recorded where the handler is defined.

Each op-family module (``_ops_*.py``) records its handlers where it defines them::

    @handles(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode)
    def _div(t: Translator, node: Node, a: Operand, b: Operand, *, rounding_mode: str | None = None) -> ir.Value:
        ...

Those modules import torch (the decorator's arguments are ATen overloads), so importing qnnx_export does not
import them: the first call of :meth:`Registry.table` does (through :func:`import_op_modules`), under a lock, and
publishes the table once it is complete.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Concatenate, TypeAlias, TypeVar

import attrs

if TYPE_CHECKING:
    import torch
    import torch.fx
    from torch._ops import OpOverload

    from qnnx_export._fast._translator import Result, Translator

__all__ = ["OP_MODULES", "REGISTRY", "Handler", "OpTable", "Registry", "handles", "import_op_modules"]

Handler: TypeAlias = "Callable[Concatenate[Translator, torch.fx.Node, ...], Result]"
"""Called as ``handler(translator, node, *node.args, **node.kwargs)``; writes the ONNX nodes that compute ``node``
through the translator and returns its value(s), or raises :class:`~qnnx_export._fast._translator.Declined`."""

_H = TypeVar("_H", bound=Handler)

# The modules of this package whose handlers make the table (the test of the registry checks that no _ops_*.py
# module is missing here).
OP_MODULES = (
    "_ops_elementwise",
    "_ops_unary",
    "_ops_reduction",
    "_ops_scan",
    "_ops_pairwise",
    "_ops_reduce_into",
    "_ops_median",
    "_ops_extrema",
    "_ops_scatter",
    "_ops_histc",
    "_ops_ranges",
    "_ops_search",
    "_ops_segment",
    "_ops_rounding",
    "_ops_shape",
    "_ops_index",
    "_ops_linalg",
    "_ops_nn",
    "_ops_resample",
    "_ops_misc",
)


@attrs.frozen(kw_only=True)
class OpTable:
    """What the translator looks up by op or dtype; built once per process, on first use.

    Attributes:
        handlers: The handler of each ATen overload the fast path translates; any other op makes it decline.
        dtypes: The tensor dtypes it translates; any other, in an input or at any node, makes it decline.
        nondeterministic: Random and uninitialized-memory ops, never folded into constants even when all their
            inputs are (ops tagged ``nondeterministic_seeded`` are not folded either).
    """

    handlers: Mapping[OpOverload, Handler]
    dtypes: frozenset[torch.dtype]
    nondeterministic: frozenset[OpOverload]


class Registry:
    """Handlers recorded by :meth:`handles`, published once as an :class:`OpTable` by :meth:`table`.

    Thread safety: the handlers are recorded while their modules are imported, which :meth:`table` does under its
    lock (an import of one of them elsewhere is serialized by Python's import lock); the table is published by one
    assignment once complete, so a thread that reads it without the lock finds no table or the whole table, never
    part of one (with a half-filled table it would send its graph to torch.onnx for want of a handler).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recorded: dict[OpOverload, Handler] = {}
        self._table: OpTable | None = None

    def handles(self, *overloads: OpOverload) -> Callable[[_H], _H]:
        """Decorator: the decorated handler translates ``overloads``.

        Raises:
            RuntimeError: An overload already has a handler (which one won would depend on the import order).
        """

        def record(handler: _H) -> _H:
            for op in overloads:
                # The same function again is its module imported again, after an import that failed.
                if op in self._recorded and _qualified_name(self._recorded[op]) != _qualified_name(handler):
                    raise RuntimeError(f"{op} has two handlers: {self._recorded[op]} and {handler}")
                self._recorded[op] = handler
            return handler

        return record

    def table(self, load: Callable[[], None]) -> OpTable:
        """The op table; the first call runs ``load()`` (which imports the op modules) and builds it, once.

        Args:
            load: Called once, under the lock, before the recorded handlers are frozen into the table.
        """
        table = self._table
        if table is not None:
            return table
        with self._lock:
            if self._table is None:
                load()
                self._table = _freeze(self._recorded)
            return self._table


def _qualified_name(handler: Handler) -> tuple[str, str]:
    return getattr(handler, "__module__", ""), getattr(handler, "__qualname__", repr(handler))


def _freeze(recorded: Mapping[OpOverload, Handler]) -> OpTable:
    import torch

    aten = torch.ops.aten
    return OpTable(
        handlers=MappingProxyType(dict(recorded)),
        dtypes=frozenset({torch.float32, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8}),
        nondeterministic=frozenset(
            {
                aten.empty.memory_format,
                aten.empty_like.default,
                aten.empty_strided.default,
                aten.rand.default,
                aten.randn.default,
                aten.rand_like.default,
                aten.randn_like.default,
                aten.randint.low,
                aten.bernoulli.default,
                aten.bernoulli.p,
                aten.native_dropout.default,
                aten.normal.Tensor_float,
                aten.uniform.default,
            }
        ),
    )


def import_op_modules() -> None:
    """Import every op-family module, so that their ``@handles`` decorators record their handlers."""
    for name in OP_MODULES:
        importlib.import_module(f"qnnx_export._fast.{name}")


REGISTRY = Registry()
handles = REGISTRY.handles
