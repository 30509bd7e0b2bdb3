"""Test support for the qnnx packages: the pytest plugin with the shared Hypothesis profiles, shared strategies,
and the checks every package makes of its ``errors`` module."""

from qnnx_testkit import strategies
from qnnx_testkit._env import pythonpath_env
from qnnx_testkit._errors import assert_errors_share_root, assert_renamed_error, assert_unknown_error_name_raises
from qnnx_testkit._version import __version__

__all__ = [
    "__version__",
    "assert_errors_share_root",
    "assert_renamed_error",
    "assert_unknown_error_name_raises",
    "pythonpath_env",
    "strategies",
]
