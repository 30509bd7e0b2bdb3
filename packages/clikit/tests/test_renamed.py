"""Former public names: a module __getattr__ that warns and gives the new object; other names stay errors."""

from __future__ import annotations

import types

import pytest

import qnnx_clikit as clikit


def _module() -> types.ModuleType:
    module = types.ModuleType("pkg.errors")

    class NewError(Exception):
        pass

    module.NewError = NewError  # type: ignore[attr-defined]
    module.__getattr__ = clikit.renamed_attributes(module.__name__, {"OldError": "NewError"}, vars(module))  # type: ignore[method-assign]
    return module


def test_a_former_name_warns_at_the_callers_line_and_is_the_new_object() -> None:
    module = _module()
    with pytest.warns(DeprecationWarning, match=r"pkg\.errors\.OldError is deprecated .*; use NewError\.") as record:
        cls = module.OldError
    assert cls is module.NewError
    assert record[0].filename == __file__


def test_another_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"module 'pkg\.errors' has no attribute 'Missing'"):
        _module().Missing  # noqa: B018 (the access is the point)
