"""The plugin: the 'dev' and 'ci' profiles take their values from the suite's configuration, and nothing else."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import settings

from qnnx_testkit.plugin import current_profile

# An inner test that writes what the loaded profile says, and how many examples a @given test really ran.
_PROBE = """
import json
from hypothesis import HealthCheck, given, settings, strategies as st
from qnnx_testkit.plugin import current_profile

RUNS = []


@given(st.integers())
def test_count(n):
    RUNS.append(n)


def test_report():
    profile = settings.default
    deadline = profile.deadline
    with open("profile.json", "w") as fh:
        json.dump(
            {
                "name": current_profile(),
                "max_examples": profile.max_examples,
                "deadline_ms": None if deadline is None else deadline.total_seconds() * 1000,
                "derandomize": profile.derandomize,
                "print_blob": profile.print_blob,
                "too_slow": HealthCheck.too_slow in profile.suppress_health_check,
                "runs": len(RUNS),
            },
            fh,
        )
"""


# What an inner run reports for a suite that sets nothing: Hypothesis' own defaults.
_DEFAULT_DEV = {
    "name": "dev",
    "max_examples": 100,
    "deadline_ms": 200,
    "derandomize": False,
    "print_blob": False,
    "too_slow": False,
    "runs": 100,
}


def _suite(pytester: pytest.Pytester, options: str = "") -> None:
    pytester.makepyprojecttoml(
        "[tool.pytest.ini_options]\n"
        'addopts = ["--strict-markers", "--strict-config"]\n'
        "xfail_strict = true\n" + textwrap.dedent(options)
    )
    pytester.makepyfile(test_probe=_PROBE)


def _run(pytester: pytest.Pytester, *args: str) -> dict[str, object]:
    import json

    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=2)
    return json.loads((pytester.path / "profile.json").read_text())


@pytest.fixture(autouse=True)
def _no_profile_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI runs these tests with HYPOTHESIS_PROFILE=ci: each test sets the variable it means."""
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)


def test_dev_is_the_default_and_takes_the_suite_values(pytester: pytest.Pytester) -> None:
    """Without $HYPOTHESIS_PROFILE, 'dev' is loaded with the suite's count, deadline and health checks; a @given
    test runs exactly that many examples."""
    _suite(
        pytester,
        """
        qnnx_hypothesis_max_examples = 7
        qnnx_hypothesis_deadline = "none"
        qnnx_hypothesis_suppress_too_slow = ["dev"]
        """,
    )
    assert _run(pytester) == {**_DEFAULT_DEV, "max_examples": 7, "deadline_ms": None, "too_slow": True, "runs": 7}


def test_ci_is_derandomized_prints_blobs_and_has_no_deadline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HYPOTHESIS_PROFILE=ci: the ci count (by default the dev one), derandomized, blobs printed, no deadline."""
    _suite(
        pytester,
        """
        qnnx_hypothesis_max_examples = 6
        qnnx_hypothesis_deadline = 500
        qnnx_hypothesis_suppress_too_slow = ["ci"]
        """,
    )
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    ci = {"name": "ci", "deadline_ms": None, "derandomize": True, "print_blob": True}
    assert _run(pytester) == {**_DEFAULT_DEV, **ci, "max_examples": 6, "too_slow": True, "runs": 6}


def test_ci_count_can_differ_from_dev(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _suite(pytester, "qnnx_hypothesis_max_examples = 9\nqnnx_hypothesis_ci_max_examples = 3\n")
    assert _run(pytester)["max_examples"] == 9
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    got = _run(pytester)
    assert (got["max_examples"], got["runs"], got["too_slow"]) == (3, 3, False)


def test_a_suite_that_sets_nothing_gets_hypothesis_defaults(pytester: pytest.Pytester) -> None:
    """The defaults are Hypothesis' own: 100 examples, a 200 ms deadline, every health check on."""
    _suite(pytester)
    assert _run(pytester) == _DEFAULT_DEV


def test_hypothesis_profile_option_wins_over_the_environment(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _suite(pytester, "qnnx_hypothesis_max_examples = 4\n")
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "dev")
    assert _run(pytester, "--hypothesis-profile=ci")["name"] == "ci"


def test_the_header_names_the_profile(pytester: pytest.Pytester) -> None:
    _suite(pytester, 'qnnx_hypothesis_max_examples = 4\nqnnx_hypothesis_deadline = "none"\n')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["qnnx-testkit: hypothesis profile 'dev', max_examples=4, deadline=none"])


def test_strict_config_still_refuses_unknown_options(pytester: pytest.Pytester) -> None:
    """The plugin declares its options; --strict-config still catches a misspelt one."""
    _suite(pytester, "qnnx_hypothesis_max_exmaples = 4\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*qnnx_hypothesis_max_exmaples*"])


@pytest.mark.parametrize(
    ("options", "environment", "message"),
    [
        ("qnnx_hypothesis_max_examples = 0\n", None, "*qnnx_hypothesis_max_examples must be a positive*'0'*"),
        ('qnnx_hypothesis_max_examples = "ten"\n', None, "*qnnx_hypothesis_max_examples must be a positive*"),
        ("qnnx_hypothesis_ci_max_examples = -2\n", None, "*qnnx_hypothesis_ci_max_examples must be*"),
        ("qnnx_hypothesis_deadline = -1\n", None, "*qnnx_hypothesis_deadline must be milliseconds*"),
        ('qnnx_hypothesis_deadline = "soon"\n', None, "*qnnx_hypothesis_deadline must be milliseconds*"),
        ('qnnx_hypothesis_suppress_too_slow = ["nightly"]\n', None, "*qnnx_hypothesis_suppress_too_slow*nightly*"),
        ("", "nightly", "*HYPOTHESIS_PROFILE='nightly' is not a Hypothesis profile*"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, options: str, environment: str | None, message: str
) -> None:
    _suite(pytester, options)
    if environment is not None:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", environment)
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_run_inside_a_run_leaves_the_outer_profiles_alone(pytester: pytest.Pytester) -> None:
    """The inner run registers its own 'dev' and 'ci'; once it is over, the outer run's are back and loaded."""

    def values(profile: settings) -> tuple[object, ...]:
        return (profile.max_examples, profile.deadline, profile.derandomize, profile.suppress_health_check)

    before = {name: values(settings.get_profile(name)) for name in ("dev", "ci")}
    current = current_profile()
    _suite(pytester, "qnnx_hypothesis_max_examples = 3\n")
    assert _run(pytester)["max_examples"] == 3
    assert {name: values(settings.get_profile(name)) for name in ("dev", "ci")} == before
    assert current_profile() == current
    assert values(settings.default) == before[current]
