"""Properties of the shared strategies: every value drawn respects the bounds its strategy names."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qnnx_testkit.strategies import (
    QDQ_ACTIVATION_TYPES,
    QDQ_WEIGHT_TYPES,
    SEED_MAX,
    flipped_bytes,
    json_scalars,
    json_values,
    key_materials,
    pool_windows,
    qdq_settings,
    seeds,
    shapes,
    truncations,
)


@given(st.data(), st.integers(0, 4), st.integers(0, 4), st.integers(0, 3), st.integers(0, 6))
def test_shapes_respect_their_bounds(
    data: st.DataObject, min_rank: int, extra_rank: int, min_side: int, extra_side: int
) -> None:
    max_rank, max_side = min_rank + extra_rank, min_side + extra_side
    shape = data.draw(shapes(min_rank=min_rank, max_rank=max_rank, min_side=min_side, max_side=max_side))
    assert isinstance(shape, list)
    assert min_rank <= len(shape) <= max_rank
    assert all(min_side <= side <= max_side for side in shape)


@given(seeds(), seeds(9))
def test_seeds_are_in_range(seed: int, small: int) -> None:
    assert 0 <= seed <= SEED_MAX and 0 <= small <= 9


def _leaves(value: object) -> list[object]:
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        assert all(isinstance(k, str) for k in value)
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value]


@given(json_values(json_scalars(max_int=2**70, max_text=5), max_size=3, max_key=4))
def test_json_values_survive_a_json_round_trip(value: object) -> None:
    """A drawn value is plain JSON: dumped and loaded it is equal, and its leaves keep their bounds."""
    assert json.loads(json.dumps(value)) == value
    for leaf in _leaves(value):
        assert leaf is None or isinstance(leaf, bool | str) or abs(leaf) <= 2**70  # type: ignore[arg-type]
        assert not isinstance(leaf, str) or len(leaf) <= 5


@given(json_scalars(max_int=None, floats=True))
def test_json_scalars_never_draw_nan(value: object) -> None:
    assert not (isinstance(value, float) and math.isnan(value))


@given(key_materials(max_size=5, max_key=3))
def test_key_materials_are_flat_and_named(material: dict[str, object]) -> None:
    assert 1 <= len(material) <= 5
    assert all(1 <= len(name) <= 3 for name in material)
    assert not any(isinstance(v, list | dict) for v in material.values())


@given(st.binary(min_size=1, max_size=64), st.data())
def test_flipped_bytes_change_exactly_one_byte_in_range(payload: bytes, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(payload) - 1))
    stop = data.draw(st.integers(start + 1, len(payload)))
    flipped = data.draw(flipped_bytes(bytearray(payload), start=start, stop=stop))
    assert isinstance(flipped, bytes) and len(flipped) == len(payload)
    changed = [i for i, (a, b) in enumerate(zip(payload, flipped, strict=True)) if a != b]
    assert len(changed) == 1 and start <= changed[0] < stop


@given(st.binary(min_size=1, max_size=64), st.data())
def test_truncations_are_strict_prefixes(payload: bytes, data: st.DataObject) -> None:
    cut = data.draw(truncations(payload))
    assert len(cut) < len(payload) and payload.startswith(cut)


@pytest.mark.parametrize(
    ("payload", "start", "stop"), [(b"", 0, None), (b"abc", 2, 2), (b"abc", 0, 4), (b"abc", -1, 2)]
)
def test_flipped_bytes_refuses_an_empty_range(payload: bytes, start: int, stop: int | None) -> None:
    with pytest.raises(ValueError, match="no byte to flip"):
        flipped_bytes(payload, start=start, stop=stop)


def test_truncations_refuse_an_empty_payload() -> None:
    with pytest.raises(ValueError, match="no strict prefix"):
        truncations(b"")


@given(st.fixed_dictionaries(qdq_settings()))
def test_qdq_settings_draw_the_tooling_types(drawn: dict[str, object]) -> None:
    assert drawn["activation"] in QDQ_ACTIVATION_TYPES
    assert drawn["weight"] in QDQ_WEIGHT_TYPES
    assert isinstance(drawn["per_channel"], bool)


def test_qdq_settings_are_a_fresh_dict_each_time() -> None:
    """Callers extend the dict (``{**qdq_settings(), "seed": ...}``); one call never sees another's keys."""
    first = qdq_settings()
    first["seed"] = seeds()
    assert set(qdq_settings()) == {"activation", "weight", "per_channel"}


@given(pool_windows(max_spatial=3, max_kernel=4, max_stride=2, max_side=5, max_batch=2, max_channels=3))
def test_pool_windows_are_valid_onnx_pools(window: tuple[list[int], dict[str, list[int]]]) -> None:
    """Every drawn window is one ONNX Runtime accepts: pads below the kernel, each padded side at least the kernel."""
    shape, attrs = window
    spatial = len(shape) - 2
    kernel, strides, pads = attrs["kernel_shape"], attrs["strides"], attrs["pads"]
    assert 1 <= spatial <= 3 and 1 <= shape[0] <= 2 and 1 <= shape[1] <= 3
    assert len(kernel) == len(strides) == spatial and len(pads) == 2 * spatial
    assert all(1 <= k <= 4 for k in kernel) and all(1 <= s <= 2 for s in strides)
    for axis, k in enumerate(kernel):
        begin, end = pads[axis], pads[axis + spatial]
        assert 0 <= begin < k and 0 <= end < k
        assert shape[axis + 2] + begin + end >= k and 1 <= shape[axis + 2] <= max(5, k)
