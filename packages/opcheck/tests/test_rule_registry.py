"""The table patterns' rules register where their matchers are defined; every pattern a table lists is judged."""

from __future__ import annotations

import inspect
import re

import pytest

from qnnx_opcheck import _conditions, _patterns, _rules, available_tables
from qnnx_opcheck._patterns import PATTERN_RULES, rule


def test_each_pattern_has_at_most_one_rule_and_a_second_is_refused() -> None:
    names = [r.pattern for r in PATTERN_RULES]
    assert len(names) == len(set(names))
    with pytest.raises(TypeError, match="already has a rule"):
        rule(names[0])(lambda patterns, index, node: False)
    assert tuple(_patterns.PATTERN_RULES) == PATTERN_RULES


@pytest.mark.parametrize("table", available_tables(), ids=lambda t: f"{t.backend}-{t.onnxruntime_qnn}")
def test_every_pattern_of_every_table_is_a_registered_rule_or_one_the_checker_reads(table: object) -> None:
    """A pattern added to the tables without a rule (nor a read in Checker._decide) would be silently ignored."""
    source = "".join(inspect.getsource(m) for m in (_rules, _patterns, _conditions))
    read_by_checker = set(re.findall(r'pattern\("([a-z0-9_]+)"\)', source))
    registered = {r.pattern for r in PATTERN_RULES}
    assert set(table.patterns) <= registered | read_by_checker  # type: ignore[attr-defined]
