"""The quantize option: presets and mappings validate, and every bad value raises a message naming it and the fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend import BackendOptions
from qnnx_backend._quantspec import (
    ACTIVATION_TYPES,
    BLOCK_SIZES,
    CALIBRATIONS,
    DEFAULT_MIN_SQNR,
    LLM_MODULE_WEIGHT_TYPES,
    PRESETS,
    WEIGHT_TYPES,
    module_weight_type,
)
from qnnx_backend.errors import InvalidOptionsError


def _quantize(value: object):
    return BackendOptions.from_mapping({"quantize": value}).quantize


def test_off_by_default():
    """Without the option no graph is quantized."""
    assert BackendOptions.from_mapping(None).quantize is None


@pytest.mark.parametrize(("name", "types"), [("a16w8", ("uint16", "uint8")), ("a8w8", ("uint8", "uint8"))])
def test_presets_name_their_types(name, types):
    """'a16w8' is uint16 activations with uint8 weights, 'a8w8' uint8 for both; both keep the default SQNR floor."""
    spec = _quantize(name)
    assert (spec.activation_type, spec.weight_type) == types
    assert spec.per_channel is True and spec.calibration == "minmax" and spec.min_sqnr == DEFAULT_MIN_SQNR
    assert spec.label == name


@given(scheme=st.sampled_from(sorted(PRESETS)), per_channel=st.one_of(st.none(), st.booleans()))
def test_weights_are_per_channel_unless_told(scheme, per_channel):
    """Every scheme, in its string and its dict form and with any weight type, gives one weight scale per output
    channel by default; an explicit per_channel wins, and only per-tensor weights are named in the label."""
    assert _quantize(scheme).per_channel is True
    for mapping in ({"scheme": scheme}, {"scheme": scheme, "weight_type": "int4"}):
        if per_channel is not None:
            mapping["per_channel"] = per_channel
        spec = _quantize(mapping)
        assert spec.per_channel is (per_channel is not False)
        assert ("per-tensor" in spec.label) is (per_channel is False)
    assert _quantize("a16w4").per_channel is True and _quantize("a16w4").weight_type == "int4"


def test_mapping_starts_from_its_scheme_and_overrides():
    """A mapping starts from its scheme (a16w8 by default) and sets the details, min_sqnr included."""
    spec = _quantize({"scheme": "a8w8", "calibration": "Percentile", "per_channel": False, "min_sqnr": None})
    assert (spec.activation_type, spec.weight_type, spec.calibration) == ("uint8", "uint8", "percentile")
    assert not spec.per_channel and spec.min_sqnr is None
    assert spec.label == "a8w8 (per-tensor, percentile)"
    assert _quantize({"keep_float_ops": ["Softmax", "LayerNormalization"]}).keep_float_ops == (
        "LayerNormalization",
        "Softmax",
    )


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("int8", r"quantize='int8' is not valid; accepted: 'a16w8', 'a8w8'"),
        (8, r"quantize: 8 is not valid; accepted: None, 'a16w8', 'a8w8', 'a16w4', 'llm-a16w4' or a dict"),
        ({"module_weight_types": ["lm_head"]}, r"module_weight_types=\['lm_head'\] is not valid; accepted: a dict"),
        ({"module_weight_types": {"lm_head": "int2"}}, r"module_weight_types\['lm_head'\]='int2' is not valid"),
        ({"module_weight_types": {"a..b": "int8"}}, r"module_weight_types has the key 'a..b'; accepted: a module"),
        ({"activation": "uint8"}, r"unknown key\(s\) 'activation' \(did you mean 'activation_type'\?\)"),
        ({"weight_type": "int2"}, r"weight_type='int2' is not valid; accepted: 'uint8', 'int8', 'uint16', 'int4'"),
        ({"calibration": "kl"}, r"calibration='kl' is not valid; accepted: 'minmax', 'entropy', 'percentile'"),
        ({"per_channel": "yes"}, r"per_channel='yes' is not valid; accepted: True or False"),
        ({"min_sqnr": "30"}, r"min_sqnr='30' is not valid; accepted: a finite number of dB"),
        ({"min_sqnr": float("nan")}, r"min_sqnr=nan is not valid"),
        ({"keep_float_ops": "Softmax"}, r"keep_float_ops='Softmax' is not valid; accepted: a list of names"),
        ({"keep_float_modules": [""]}, r"keep_float_modules holds \[''\]; accepted: non-empty strings"),
        ({"scheme": "a16w4", "block_size": 48}, r"block_size=48 is not valid; accepted: 16, 32, 64, 128"),
        ({"scheme": "a16w4", "block_size": "32"}, r"block_size='32' is not valid; accepted: 16, 32, 64, 128"),
        ({"block_size": 32}, r"block_size=32 applies to int4 weights and this scheme has none; use scheme 'a16w4'"),
    ],
)
def test_bad_values_name_the_value_the_accepted_ones_and_an_example(value, match):
    """Each bad value is named with what is accepted, and the message ends with a working example."""
    with pytest.raises(InvalidOptionsError, match=match) as info:
        _quantize(value)
    assert "Example: quantize='a16w8'" in str(info.value)


def test_llm_recipe_is_int4_in_the_blocks_8_bit_head_16_bit_activations():
    """'llm-a16w4': uint16 activations, int4 per-channel weights in the decoder blocks' layers, an int8 head, an
    8-bit embedding table, the scheme's uint8 for the rest (norm scales); a dict on top overrides name by name."""
    spec = _quantize("llm-a16w4")
    assert spec.activation_type == "uint16" and spec.per_channel and spec.label == "llm-a16w4"
    assert spec.weight_type_of("model.layers.3.self_attn.q_proj") == "int4"
    assert spec.weight_type_of("transformer.h.0.mlp.c_fc") == "int4"
    assert spec.weight_type_of("lm_head") == "int8" and spec.weight_type_of("model.embed_tokens") == "uint8"
    assert spec.weight_type_of("model.norm") == "uint8" and spec.weight_type_of("") == "uint8"
    wider = _quantize({"scheme": "llm-a16w4", "module_weight_types": {"layers.0.mlp": "int8"}})
    assert wider.weight_type_of("model.layers.0.mlp.down_proj") == "int8"
    assert wider.weight_type_of("model.layers.1.mlp.down_proj") == "int4"
    assert wider.label == "llm-a16w4 (9 module weight type(s))"
    assert dict(spec.module_weight_types) == dict(LLM_MODULE_WEIGHT_TYPES)
    assert spec.block_size == 32
    assert wider.cache_material() != spec.cache_material()


@given(
    path=st.lists(st.sampled_from(["model", "layers", "0", "mlp", "lm_head", "h"]), max_size=5),
    table=st.dictionaries(
        st.lists(st.sampled_from(["model", "layers", "0", "mlp", "lm_head"]), min_size=1, max_size=3).map(".".join),
        st.sampled_from(WEIGHT_TYPES),
        max_size=4,
    ),
)
def test_module_weight_type_is_the_longest_name_found_in_the_path(path, table):
    """Property: a name applies when its segments appear in a row in the module path; of several, the longest
    decides; with none, the scheme's type applies (None here)."""
    module = ".".join(path)
    got = module_weight_type(module, tuple(sorted(table.items())))
    found = [n for n in table if any(path[k : k + len(n.split("."))] == n.split(".") for k in range(len(path)))]
    if not found:
        assert got is None
    else:
        longest = max(len(n.split(".")) for n in found)
        assert got in {table[n] for n in found if len(n.split(".")) == longest}


@given(
    value=st.integers(-512, 512) | st.sampled_from([None, True, 32.0, "32"]), scheme=st.sampled_from(sorted(PRESETS))
)
def test_block_size_is_one_of_the_measured_powers_of_two(value, scheme):
    """Property: block_size validates exactly when it is None or one of 16, 32, 64, 128 (ints) on a scheme with
    int4 weights; any other value raises an error naming it, the accepted sizes and the fix."""
    mapping = {"scheme": scheme, "weight_type": "int4", "block_size": value}
    valid = value is None or (type(value) is int and value in BLOCK_SIZES)
    if valid:
        assert _quantize(mapping).block_size == value
        return
    with pytest.raises(InvalidOptionsError, match=rf"block_size={value!r} is not valid; accepted: 16, 32, 64, 128"):
        _quantize(mapping)


@given(block=st.sampled_from([None, *BLOCK_SIZES]))
def test_block_size_shows_in_the_label_and_the_cache_key(block):
    """Property: a16w4 with a block size says it in its label and compiles apart from per-channel a16w4; the recipe
    labels only a departure from its blocks of 32; a recipe without int4 weights left has no block size."""
    spec = _quantize({"scheme": "a16w4", "block_size": block})
    assert ("blocks of" in spec.label) is (block is not None)
    assert (spec.cache_material() == _quantize("a16w4").cache_material()) is (block is None)
    recipe = _quantize({"scheme": "llm-a16w4", "block_size": block})
    assert ("int4" in recipe.label) is (block != 32)
    no_int4 = {"layers": "int8", "h": "int8"}
    assert _quantize({"scheme": "llm-a16w4", "module_weight_types": no_int4}).block_size is None


def test_fp16_and_quantize_are_refused_together():
    """fp16 and quantize cannot be combined: the message says to drop one."""
    with pytest.raises(InvalidOptionsError, match="fp16=True cannot be combined"):
        BackendOptions.from_mapping({"quantize": "a16w8", "fp16": True})


def test_cache_material_changes_with_every_setting_but_the_floor():
    """The settings that change the quantized model are cache material; min_sqnr only decides whether it is used."""
    base = _quantize("a16w8").cache_material()
    assert _quantize({"min_sqnr": 40}).cache_material() == base
    for change in ({"per_channel": False}, {"calibration": "entropy"}, {"weight_type": "int8"}, {"scheme": "a8w8"}):
        assert _quantize(change).cache_material() != base


_VALID = {
    "scheme": st.sampled_from(sorted(PRESETS)),
    "activation_type": st.sampled_from(ACTIVATION_TYPES),
    "weight_type": st.sampled_from(WEIGHT_TYPES),
    "per_channel": st.booleans(),
    "calibration": st.sampled_from(CALIBRATIONS),
    "keep_float_ops": st.lists(st.sampled_from(["Softmax", "LayerNormalization", "Gelu"])),
    "keep_float_modules": st.lists(st.from_regex(r"[a-z]+(\.[a-z0-9]+){0,2}", fullmatch=True)),
    "min_sqnr": st.none() | st.floats(-10, 80),
    "module_weight_types": st.dictionaries(
        st.from_regex(r"[a-z_]+(\.[a-z0-9_]+){0,2}", fullmatch=True), st.sampled_from(WEIGHT_TYPES), max_size=3
    ),
}
_VALID_WITH_BLOCKS = {k: v for k, v in _VALID.items() if k != "weight_type"} | {
    "block_size": st.sampled_from([None, *BLOCK_SIZES])
}
_ANY = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.lists(st.integers())


@given(
    st.fixed_dictionaries({}, optional=_VALID)
    | st.fixed_dictionaries({"weight_type": st.just("int4")}, optional=_VALID_WITH_BLOCKS)
)
def test_valid_mappings_validate(mapping):
    """Property: a mapping of known keys with accepted values always validates, and keeps what it says."""
    spec = _quantize(mapping)
    for key in ("activation_type", "weight_type", "per_channel", "calibration", "min_sqnr", "block_size"):
        if key in mapping:
            assert getattr(spec, key) == mapping[key]


@given(st.dictionaries(st.sampled_from([*_VALID, "block_size", "bits", "dtype"]), _ANY, max_size=4))
def test_any_mapping_validates_or_raises_the_documented_error(mapping):
    """Property: any mapping either validates or raises InvalidOptionsError (never another exception), and an
    error message names the quantize option."""
    error = None
    try:
        _quantize(mapping)
    except InvalidOptionsError as exc:
        error = str(exc)
    assert error is None or error.startswith("quantize")
