"""Cache key tests: golden values, sensitivity, invariance, unhashable values, model digests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from ctxcache_helpers import TESTS_DIR, key_for, run_child
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import qnnx_ctxcache as cc
from qnnx_ctxcache.errors import InvalidKeyError, UnhashableKeyError
from qnnx_testkit import pythonpath_env
from qnnx_testkit.strategies import json_scalars, json_values, key_materials

# Golden keys: any change here means every user's cache is invalidated. Bump KEY_SCHEMA_VERSION on purpose.
GOLDEN_DEFAULT = "aa669bc30dc0f2972bf7d3c7a3d2c1702fd4276684f641fe7b55792448d04086"
GOLDEN_MINIMAL = "511c8324e8bfe28d208c379067aafb192d96796ddf3752199bbd6e8d09f600c9"


def minimal_key() -> cc.CacheKey:
    return cc.make_key(model_digest="sha256:0", ep_name="E", ep_options={}, versions={"ort": "1"})


@pytest.fixture
def linux_x86_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pin the host part of the key so golden values hold on every CI platform."""
    monkeypatch.setattr("qnnx_ctxcache._key.host_material", lambda: {"os": "linux", "machine": "x86_64"})


@pytest.mark.usefixtures("linux_x86_host")
def test_golden_keys() -> None:
    """Fixed key material hashes to fixed hex strings checked into the repo (no silent drift)."""
    assert cc.KEY_SCHEMA_VERSION == 1
    assert key_for().hex == GOLDEN_DEFAULT
    assert minimal_key().hex == GOLDEN_MINIMAL


def test_key_is_sha256_of_canonical_material() -> None:
    """The key is the SHA-256 of the canonical JSON of its material, and the material is stored as given."""
    import hashlib

    key = key_for()
    assert len(key.hex) == 64
    assert hashlib.sha256(cc.canonical_json(key.material)).hexdigest() == key.hex
    assert key.material["ep_options"] == {"backend_type": "htp", "soc_model": "60"}


def test_key_is_stable_across_processes_and_hash_seeds() -> None:
    """A new interpreter with another PYTHONHASHSEED computes the same key."""
    code = "from ctxcache_helpers import key_for; print(key_for().hex)"
    for seed in ("0", "12345"):
        done = run_child(code, env={"PYTHONHASHSEED": seed, **pythonpath_env(TESTS_DIR)})
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == key_for().hex


@pytest.mark.parametrize(
    "override",
    [
        {"model_digest": "sha256:other"},
        {"ep_name": "OtherExecutionProvider"},
        {"ep_options": {"backend_type": "htp", "soc_model": "69"}},
        {"ep_options": {"backend_type": "htp", "soc_model": "60", "vtcm_mb": "4"}},
        {"ep_options": {"backend_type": "htp", "soc_model": "60", "htp_graph_finalization_optimization_mode": "3"}},
        {"ep_options": {"backend_type": "htp", "soc_model": "60", "enable_htp_fp16_precision": "1"}},
        {"session_config": {"session.disable_cpu_ep_fallback": "0"}},
        {"session_config": {"session.disable_cpu_ep_fallback": "1", "ep.context_embed_mode": "1"}},
        {"versions": {"onnxruntime": "1.32.1", "onnxruntime-qnn": "2.7.0"}},
        {"versions": {"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.6.0"}},
        {"versions": {"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0", "qairt": "2.51.0"}},
        {"input_specs": [{"name": "x", "shape": [2, 4], "dtype": "float32"}]},
        {"input_specs": [{"name": "x", "shape": [1, 4], "dtype": "float16"}]},
        {"target": {"soc_model": 69}},
        {"target": {"soc_model": 60, "htp_arch": 73}},
        {"salt": "user-salt"},
    ],
)
def test_every_field_changes_the_key(override: dict[str, object]) -> None:
    """Changing any single compile-affecting field gives a different key."""
    assert key_for(**override).hex != key_for().hex


def test_host_is_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A context compiled on another OS or CPU architecture has another key (onnxruntime #26686)."""
    base = key_for()
    assert base.material["host"] == cc.host_material()
    monkeypatch.setattr("qnnx_ctxcache._key.host_material", lambda: {"os": "linux", "machine": "aarch64"})
    assert key_for().hex != base.hex
    assert cc.diff_key_material(base, key_for()) == [f"host.machine: {base.material['host']['machine']!r} != 'aarch64'"]


def test_diff_key_material_names_every_difference() -> None:
    """diff_key_material lists each differing leaf, including added and removed options."""
    a = key_for(ep_options={"soc_model": "60", "vtcm_mb": "4"})
    b = key_for(ep_options={"soc_model": "69", "htp_arch": "73"})
    assert cc.diff_key_material(a, b) == [
        "ep_options.htp_arch: <absent> != '73'",
        "ep_options.soc_model: '60' != '69'",
        "ep_options.vtcm_mb: '4' != <absent>",
    ]
    assert cc.diff_key_material(a, a) == []


def test_env_salt_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """$QNNX_CTXCACHE_SALT is mixed into every key."""
    base = key_for().hex
    monkeypatch.setenv("QNNX_CTXCACHE_SALT", "team-a")
    assert key_for().hex != base
    assert key_for().material["env_salt"] == "team-a"


def test_option_order_and_spelling_do_not_change_the_key() -> None:
    """Dict order and the "1"/1/True spellings of an option value give the same key."""
    a = key_for(ep_options={"soc_model": "60", "backend_type": "htp", "enable_htp_fp16_precision": "1"})
    b = key_for(ep_options={"enable_htp_fp16_precision": True, "backend_type": "htp", "soc_model": 60})
    c = key_for(ep_options={"backend_type": "htp", "enable_htp_fp16_precision": 1, "soc_model": "60"})
    assert a.hex == b.hex == c.hex


@pytest.mark.parametrize("option", sorted(cc.RUNTIME_ONLY_EP_OPTIONS["QNNExecutionProvider"]))
def test_runtime_only_qnn_options_are_ignored(option: str) -> None:
    """QNN options that only affect running (power mode, RPC latency, profiling) do not change the key."""
    with_option = key_for(ep_options={"backend_type": "htp", "soc_model": "60", option: "burst"})
    assert with_option.hex == key_for().hex


def test_runtime_only_list_applies_only_to_its_ep() -> None:
    """htp_performance_mode is kept in the key of an EP that did not declare it runtime-only."""
    a = key_for(ep_name="OtherEP", ep_options={"htp_performance_mode": "burst"})
    b = key_for(ep_name="OtherEP", ep_options={"htp_performance_mode": "balanced"})
    assert a.hex != b.hex


def test_context_location_is_not_in_the_key() -> None:
    """ep.context_file_path and ep.context_enable name where a context is written, so they are dropped."""
    a = key_for(session_config={"session.disable_cpu_ep_fallback": "1", "ep.context_file_path": "/a/x.onnx"})
    b = key_for(session_config={"session.disable_cpu_ep_fallback": "1", "ep.context_enable": "1"})
    assert a.hex == b.hex == key_for().hex


def test_unicode_is_nfc_normalised() -> None:
    """Composed and decomposed spellings of a string give the same key."""
    assert key_for(salt="caf\u00e9").hex == key_for(salt="cafe\u0301").hex


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"ep_options": {"soc_model": lambda: 60}}, "ep_options.soc_model"),
        ({"ep_options": {"vtcm_mb": 4.0}}, "ep_options.vtcm_mb"),
        ({"input_specs": [{"shape": [1, float("nan")]}]}, "input_specs[0].shape[1]"),
        ({"input_specs": [{"shape": {1, 2}}]}, "input_specs[0].shape"),
        ({"target": {"soc": object()}}, "target.soc"),
        ({"target": {1: "x"}}, "target.1"),
        ({"session_config": {"x": None}}, "session_config.x"),
        ({"input_specs": "x:1x4"}, "input_specs"),
        ({"input_specs": 7}, "input_specs"),
    ],
)
def test_unhashable_values_raise_naming_the_field(override: dict[str, object], field: str) -> None:
    """A value with no canonical form raises UnhashableKeyError (a ValueError) naming the field."""
    with pytest.raises(UnhashableKeyError) as info:
        key_for(**override)
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert field in str(info.value)


def test_missing_required_fields_are_all_reported() -> None:
    """Empty digest, empty EP name and empty versions are reported together in one InvalidKeyError."""
    with pytest.raises(InvalidKeyError) as info:
        cc.make_key(model_digest="", ep_name="", ep_options={}, versions={})
    message = str(info.value)
    assert "model_digest" in message
    assert "ep_name" in message
    assert "versions" in message


_options = key_materials(st.one_of(st.text(max_size=6), st.integers(0, 9)), min_size=0, max_size=5, max_key=6)


@given(a=_options, b=_options)
def test_key_equality_matches_canonical_equality(a: dict[str, object], b: dict[str, object]) -> None:
    """For any option dicts, the keys are equal exactly when the canonical materials are equal."""
    ka, kb = key_for(ep_options=a), key_for(ep_options=b)
    assert (ka.hex == kb.hex) == (cc.canonical_json(ka.material) == cc.canonical_json(kb.material))


# Integers beyond 64 bits too: the canonical form must not depend on a fixed-width encoding.
@given(specs=json_values(json_scalars(max_int=2**70, max_text=8), max_size=3, max_key=4))
def test_json_specs_roundtrip_and_order_independence(specs: object) -> None:
    """Any JSON-able input spec hashes; its material survives a JSON round trip unchanged."""
    key = key_for(input_specs=[specs])
    assert json.loads(cc.canonical_json(key.material)) == json.loads(json.dumps(dict(key.material)))
    if isinstance(specs, dict):
        reordered = dict(reversed(list(specs.items())))
        assert key_for(input_specs=[reordered]).hex == key.hex


def _model_with_external_data(folder: Path, weight: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [numpy_helper.from_array(weight, "w")]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    onnx.save(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data", size_threshold=0
    )
    return path


def test_model_digest_covers_external_data_and_ignores_location(tmp_path: Path) -> None:
    """digest_model changes with one byte of external data, and is equal for copies in other folders."""
    weight = np.arange(64, dtype=np.float32).reshape(1, 64)
    a = _model_with_external_data(tmp_path / "a", weight)
    b = _model_with_external_data(tmp_path / "b", weight)
    assert (tmp_path / "a" / "m.data").is_file()
    assert cc.digest_model(a) == cc.digest_model(b)
    data = bytearray((tmp_path / "b" / "m.data").read_bytes())
    data[10] ^= 0x01
    (tmp_path / "b" / "m.data").write_bytes(bytes(data))
    assert cc.digest_model(a) != cc.digest_model(b)
    assert cc.digest_model(a.read_bytes()) != cc.digest_model(a)  # bytes form cannot see external data


def test_model_digest_changes_with_one_model_byte(tmp_path: Path) -> None:
    """Changing one byte of a self-contained model changes its digest."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [x],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
    )
    raw = model.SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(raw)
    changed = bytearray(raw)
    changed[-1] ^= 0x01
    assert cc.digest_model(path) == cc.digest_model(raw)
    assert cc.digest_model(bytes(changed)) != cc.digest_model(raw)
    assert os.path.getsize(path) == len(raw)
