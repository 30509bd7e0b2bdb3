"""Test support for the qnnx packages: the pytest plugin with the shared Hypothesis profiles, shared strategies."""

from qnnx_testkit import strategies
from qnnx_testkit._env import pythonpath_env
from qnnx_testkit._version import __version__

__all__ = ["__version__", "pythonpath_env", "strategies"]
