"""The error names: former names still import, with a DeprecationWarning, for one minor release."""

from __future__ import annotations

import pytest

from qnnx_detection import errors
from qnnx_testkit import assert_errors_share_root, assert_renamed_error, assert_unknown_error_name_raises


@pytest.mark.parametrize(("old", "new"), [("InvalidOptionError", "InvalidOptionsError")])
def test_a_former_error_name_warns_and_is_the_new_class(old: str, new: str) -> None:
    assert_renamed_error(errors, old, new)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    assert_unknown_error_name_raises(errors)


def test_every_error_derives_from_the_package_root() -> None:
    assert_errors_share_root(errors, errors.QnnxDetectionError)
