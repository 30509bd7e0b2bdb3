"""How calibrate() bounds what it records: a graph called more often than ``max_samples`` (a decode step runs once
per new token) keeps a uniform, repeatable choice of its calls."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend._calibrate import _Recording


def _kept(calls: int, limit: int) -> list[int]:
    """The call numbers a recording of ``limit`` samples keeps out of ``calls`` calls."""
    rec = _Recording(template=[], positions=(), grad=False, limit=limit)
    for call in range(calls):
        slot = rec.slot()
        if slot == len(rec.samples):
            rec.samples.append((call,))  # type: ignore[arg-type]
        elif slot is not None:
            rec.samples[slot] = (call,)  # type: ignore[call-overload]
    return [s[0] for s in rec.samples]  # type: ignore[misc]


@given(calls=st.integers(0, 400), limit=st.integers(1, 64))
def test_keeps_every_call_up_to_the_limit_then_exactly_the_limit(calls: int, limit: int) -> None:
    """Up to max_samples calls are all kept in order; past it exactly max_samples distinct calls are kept, and the
    same calls on every run."""
    kept = _kept(calls, limit)
    if calls <= limit:
        assert kept == list(range(calls))
    else:
        assert len(kept) == limit == len(set(kept)) and all(0 <= k < calls for k in kept)
    assert kept == _kept(calls, limit)


def test_the_kept_calls_spread_over_the_whole_run() -> None:
    """Out of 1000 decode steps, 32 kept ones come from the whole run (each quarter holds some), not only its
    start: late steps read a fuller cache than early ones."""
    kept = _kept(1000, 32)
    quarters = {k // 250 for k in kept}
    assert quarters == {0, 1, 2, 3}
    assert 6 <= sum(k >= 500 for k in kept) <= 26
