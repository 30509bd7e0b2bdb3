"""The errors-module checks pass on a well-formed module and fail on each kind of broken one."""

from __future__ import annotations

import types
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qnnx_testkit import assert_errors_share_root, assert_renamed_error, assert_unknown_error_name_raises


def _errors_module(*, warn: bool = True, alias_to_new: bool = True, stray: bool = False) -> types.ModuleType:
    module = types.ModuleType("fake_errors")

    class Root(Exception):
        pass

    class New(Root, ValueError):
        pass

    class Stray(Exception):
        pass

    module.Root, module.New, module.Stray = Root, New, Stray  # type: ignore[attr-defined]
    module.__all__ = ["Root", "New", *(["Stray"] if stray else [])]  # type: ignore[attr-defined]

    def __getattr__(name: str) -> type[Exception]:
        if name == "Old":
            if warn:
                warnings.warn("fake_errors.Old is deprecated; use New.", DeprecationWarning, stacklevel=2)
            return New if alias_to_new else Root
        raise AttributeError(name)

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return module


def test_a_well_formed_module_passes_every_check() -> None:
    """Alias that warns and is the new class, unknown names raising, every listed error under the root."""
    module = _errors_module()
    assert_renamed_error(module, "Old", "New")
    assert_unknown_error_name_raises(module)
    assert_errors_share_root(module, module.Root)


@given(warn=st.booleans(), alias_to_new=st.booleans())
def test_an_alias_that_does_not_warn_or_points_elsewhere_fails(warn: bool, alias_to_new: bool) -> None:
    """The renamed-error check fails unless the alias both warns and is the new class."""
    module = _errors_module(warn=warn, alias_to_new=alias_to_new)
    if warn and alias_to_new:
        assert_renamed_error(module, "Old", "New")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises((AssertionError, pytest.fail.Exception)):
                assert_renamed_error(module, "Old", "New")


def test_an_error_outside_the_root_fails() -> None:
    """A listed error that does not derive from the root is named in the failure."""
    module = _errors_module(stray=True)
    with pytest.raises(AssertionError, match="Stray"):
        assert_errors_share_root(module, module.Root)
