"""Former public names kept for one minor release: a module ``__getattr__`` that gives each one with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["renamed_attributes"]


def renamed_attributes(module: str, renamed: Mapping[str, str], namespace: Mapping[str, Any]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for the former names of module ``module``: ``renamed`` maps each former name
    to its new one, looked up in ``namespace`` (the module's ``globals()``). A former name gives the new object with
    a DeprecationWarning naming it, at the caller's line; any other name is an AttributeError.

    Use: ``__getattr__ = renamed_attributes(__name__, {"OldError": "NewError"}, globals())``.
    """

    def __getattr__(name: str) -> Any:
        if name in renamed:
            new = renamed[name]
            warnings.warn(
                f"{module}.{name} is deprecated and will be removed in the next minor release; use {new}.",
                DeprecationWarning,
                stacklevel=2,
            )
            return namespace[new]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
