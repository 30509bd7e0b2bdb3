"""The error names: former names still import, with a DeprecationWarning, for one minor release."""

from __future__ import annotations

import pytest

from qnnx_detection import errors


@pytest.mark.parametrize(("old", "new"), [("InvalidOptionError", "InvalidOptionsError")])
def test_a_former_error_name_warns_and_is_the_new_class(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=new):
        cls = getattr(errors, old)
    assert cls is getattr(errors, new)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        errors.NoSuchError  # noqa: B018


def test_every_error_derives_from_the_package_root() -> None:
    root = errors.QnnxDetectionError
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, root), name
