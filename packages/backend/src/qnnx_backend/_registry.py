"""Target of the ``qnn`` entry point in the ``torch_dynamo_backends`` group (private).

Only torch imports this module, when it first resolves ``backend="qnn"``; ``import qnnx_backend`` does not (importing
qnnx does no work and does not import torch).

It works around a race in torch's backend registry (torch 2.13 and 2.14, ``torch/_dynamo/backends/registry.py``):
``lookup_backend`` checks ``name not in _COMPILER_FNS``, loads the entry point, then calls ``register_backend``,
which asserts that the name is new. Threads making their first ``torch.compile(..., backend="qnn")`` at the same
time can all pass the check while the first one imports qnnx, and all but one then fail with
``AssertionError: duplicate name: qnn`` (in a fresh process, nearly every time). Patching ``register_backend`` would
not help: ``lookup_backend`` fetches that function before it loads the entry point. So the registry's table is
given a ``__contains__`` under which torch's own ``register_backend``, registering *this very function* under
*our* name while it is already there, finds the name free and stores the same function again: a no-op. Every other
question gets the true answer, and other names and functions are untouched. Nothing is changed unless the registry
has the expected shape, and the table is never asked that question once torch stops registering twice (fixed race).
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from qnnx_backend._backend import qnn_backend

__all__ = ["qnn_backend"]

_NAME = "qnn"


class _CompilerFns(dict):
    """torch's ``_COMPILER_FNS``, except that torch's ``register_backend`` re-registering our function as ``qnn``
    (a second thread of the race above) finds the name free."""

    __slots__ = ()
    _register_code: types.CodeType | None = None

    def __contains__(self, key: object) -> bool:
        found = dict.__contains__(self, key)
        if found and isinstance(key, str) and key == _NAME and dict.get(self, _NAME) is qnn_backend:
            caller = sys._getframe(1)
            if caller.f_code is self._register_code and caller.f_locals.get("compiler_fn") is qnn_backend:
                return False
        return found


def _make_registration_idempotent() -> bool:
    """Install :class:`_CompilerFns` as torch's table; True if it is (now) in place."""
    from torch._dynamo.backends import registry

    table: Any = getattr(registry, "_COMPILER_FNS", None)
    if isinstance(table, _CompilerFns):
        return True
    register = getattr(registry, "register_backend", None)
    lookup = getattr(registry, "lookup_backend", None)
    if not (
        type(table) is dict
        and inspect.isfunction(register)
        and inspect.isfunction(lookup)
        and "_COMPILER_FNS" in register.__code__.co_names
        and "compiler_fn" in register.__code__.co_varnames
        and {"_COMPILER_FNS", "register_backend"} <= set(lookup.__code__.co_names)
    ):
        return False  # not the registry this works around: leave it alone
    _CompilerFns._register_code = register.__code__
    fixed = _CompilerFns(table)
    registry._COMPILER_FNS = fixed
    fixed.update({k: v for k, v in table.items() if k not in fixed})  # a registration made while we swapped
    return True


_make_registration_idempotent()
