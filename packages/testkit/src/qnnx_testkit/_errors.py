"""Checks of a package's ``errors`` module that every qnnx package's tests make the same way."""

from __future__ import annotations

from types import ModuleType

import pytest


def assert_renamed_error(errors: ModuleType, old: str, new: str) -> None:
    """A former error name still imports, with a DeprecationWarning naming the new one, as the same class."""
    with pytest.warns(DeprecationWarning, match=new):
        cls = getattr(errors, old)
    assert cls is getattr(errors, new)


def assert_unknown_error_name_raises(errors: ModuleType) -> None:
    """A name the module never had is still an AttributeError (the deprecation hook hides nothing)."""
    with pytest.raises(AttributeError):
        getattr(errors, "NoSuchError")  # noqa: B009 (the name is the point)


def assert_errors_share_root(errors: ModuleType, root: type[BaseException]) -> None:
    """Every error the module lists in ``__all__`` derives from the package's root error."""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert isinstance(cls, type) and issubclass(cls, root), name
