"""The pytest plugin (entry point ``pytest11``, name ``qnnx``): the Hypothesis profiles of every qnnx test suite.

Two profiles are registered once per pytest run, and the one named by ``$HYPOTHESIS_PROFILE`` (default ``dev``) is
loaded before any test module is imported:

- ``dev``: local runs. ``max_examples`` and ``deadline`` come from the suite's configuration.
- ``ci``: what CI runs. ``derandomize=True`` (the same examples on every run), ``print_blob=True`` (a failure
  prints the blob that reproduces it), ``deadline=None`` (shared CI machines are slow and uneven).

What differs between suites is read from the suite's ``[tool.pytest.ini_options]``: the ``qnnx_hypothesis_*``
options this plugin declares (``pytest_addoption``), so ``--strict-config`` accepts them.
Hypothesis' own ``--hypothesis-profile`` still wins over ``$HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.errors import InvalidArgument

ENV_VAR = "HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "dev"
PROFILES = ("dev", "ci")

MAX_EXAMPLES = "qnnx_hypothesis_max_examples"
CI_MAX_EXAMPLES = "qnnx_hypothesis_ci_max_examples"
DEADLINE = "qnnx_hypothesis_deadline"
SUPPRESS_TOO_SLOW = "qnnx_hypothesis_suppress_too_slow"

_STATE = pytest.StashKey["_State"]()


@dataclass(frozen=True)
class ProfileOptions:
    """What one suite's configuration says about its profiles."""

    max_examples: int = 100
    ci_max_examples: int = 100
    deadline_ms: float | None = 200
    suppress_too_slow: frozenset[str] = frozenset()

    def profiles(self) -> dict[str, settings]:
        """The ``dev`` and ``ci`` settings, built on Hypothesis' defaults (not on whatever profile is loaded)."""
        base = settings.get_profile("default")

        def suppressed(profile: str) -> list[HealthCheck]:
            return [HealthCheck.too_slow] if profile in self.suppress_too_slow else []

        return {
            "dev": settings(
                base,
                max_examples=self.max_examples,
                deadline=self.deadline_ms,
                suppress_health_check=suppressed("dev"),
            ),
            "ci": settings(
                base,
                max_examples=self.ci_max_examples,
                deadline=None,
                derandomize=True,
                print_blob=True,
                suppress_health_check=suppressed("ci"),
            ),
        }


@dataclass(frozen=True)
class _State:
    previous_profile: str
    replaced: dict[str, settings | None]


def _count(config: pytest.Config, name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise pytest.UsageError(f"{config.inipath}: {name} must be a positive whole number, got {raw!r}")
    return value


def read_options(config: pytest.Config) -> ProfileOptions:
    """The suite's ``qnnx_hypothesis_*`` settings, checked; a bad value is a usage error naming the option."""
    max_examples = _count(config, MAX_EXAMPLES, str(config.getini(MAX_EXAMPLES)).strip())
    ci_raw = str(config.getini(CI_MAX_EXAMPLES)).strip()
    ci_max_examples = _count(config, CI_MAX_EXAMPLES, ci_raw) if ci_raw else max_examples
    suppress = frozenset(str(p).strip() for p in config.getini(SUPPRESS_TOO_SLOW) if str(p).strip())
    unknown = sorted(suppress - set(PROFILES))
    if unknown:
        raise pytest.UsageError(f"{config.inipath}: {SUPPRESS_TOO_SLOW} names profiles {PROFILES}, got {unknown}")
    return ProfileOptions(max_examples, ci_max_examples, _deadline_ms(config), suppress)


def _deadline_ms(config: pytest.Config) -> float | None:
    raw = str(config.getini(DEADLINE)).strip()
    if raw.lower() == "none":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise pytest.UsageError(f"{config.inipath}: {DEADLINE} must be milliseconds (> 0) or 'none', got {raw!r}")
    return value


def current_profile() -> str:
    """The loaded profile's name (``settings.get_current_profile_name`` is Hypothesis 6.139+; the floor is 6.100)."""
    getter = getattr(settings, "get_current_profile_name", None)
    return str(getter() if getter is not None else settings._current_profile)


def _registered(name: str) -> bool:
    try:
        settings.get_profile(name)
    except InvalidArgument:
        return False
    return True


def pytest_addoption(parser: pytest.Parser) -> None:
    # Strings, parsed by read_options: typed ini options ("int") need pytest 8.4, and the floor is pytest 8.
    # The defaults are Hypothesis' own, so a suite that sets nothing runs as it would without the plugin.
    parser.addini(MAX_EXAMPLES, "max_examples of the 'dev' Hypothesis profile (default: 100)", default="100")
    parser.addini(CI_MAX_EXAMPLES, "max_examples of the 'ci' Hypothesis profile (default: as 'dev')", default="")
    parser.addini(DEADLINE, "deadline of 'dev' in milliseconds, or 'none' (default: 200); 'ci' has none", default="200")
    parser.addini(
        SUPPRESS_TOO_SLOW, "the profiles (dev, ci) that suppress HealthCheck.too_slow", type="linelist", default=[]
    )


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' plugin, whose --hypothesis-profile then takes precedence
def pytest_configure(config: pytest.Config) -> None:
    options = read_options(config)
    wanted = os.environ.get(ENV_VAR) or DEFAULT_PROFILE
    if wanted not in PROFILES and not _registered(wanted):
        raise pytest.UsageError(f"{ENV_VAR}={wanted!r} is not a Hypothesis profile; qnnx suites have {PROFILES}")
    replaced = {name: settings.get_profile(name) if _registered(name) else None for name in PROFILES}
    for name, profile in options.profiles().items():
        settings.register_profile(name, profile)
    config.stash[_STATE] = _State(current_profile(), replaced)
    settings.load_profile(wanted)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put back the profiles this run replaced (matters when pytest runs inside pytest, as with ``pytester``)."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    for name, profile in state.replaced.items():
        if profile is not None:
            settings.register_profile(name, profile)
    settings.load_profile(state.previous_profile)


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return None
    current = current_profile()
    profile = settings.get_profile(current)
    deadline = "none" if profile.deadline is None else f"{profile.deadline.total_seconds() * 1000:g} ms"
    return f"qnnx-testkit: hypothesis profile {current!r}, max_examples={profile.max_examples}, deadline={deadline}"
