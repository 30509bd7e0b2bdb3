"""Names: fresh ONNX/attribute names that collide with nothing, and where a node comes from in the PyTorch model."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["UniqueNames", "identifier", "module_origin"]

_NOT_NAME = re.compile(r"[^0-9A-Za-z_]")
_DYNAMO_ROOT = re.compile(r"^L\['[^']*'\]\.?")
_MODULES_INDEX = re.compile(r"\._modules\['([^']*)'\]")


def identifier(text: str) -> str:
    """``text`` with every character that is not a letter, digit or underscore replaced by ``_``."""
    return _NOT_NAME.sub("_", text)


class UniqueNames:
    """Hands out names that are valid identifiers and unique among those already taken.

    ``names("fc.weight")`` gives ``fc_weight``, then ``fc_weight_1``, ``fc_weight_2``... for the same hint.
    """

    def __init__(self, taken: Iterable[str] = (), *, prefix: str = "", empty: str = "v") -> None:
        self.taken = set(taken)
        self._prefix = prefix
        self._empty = empty

    def __call__(self, hint: str) -> str:
        base = identifier(f"{self._prefix}{hint}") or self._empty
        name, k = base, 1
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name

    def take(self, name: str) -> None:
        """Mark ``name`` as used (a name chosen elsewhere, such as a graph input's)."""
        self.taken.add(name)


def module_origin(path: str, kind: str, op: str) -> str:
    """``"<module path> (<class>): <op>"`` from Dynamo's module path (``L['self'].layers._modules['0'].fc``), the
    module's class (a qualified name) and the op."""
    path = _DYNAMO_ROOT.sub("", path)
    path = _MODULES_INDEX.sub(r".\1", path) or "<root>"
    return f"{path} ({kind.rsplit('.', 1)[-1]}): {op}"
