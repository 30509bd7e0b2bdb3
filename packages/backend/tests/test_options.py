"""BackendOptions: everything torch.compile(..., options=...) can say is validated before any work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qnnx_backend import BackendOptions
from qnnx_backend.errors import InvalidOptionsError

VALID = BackendOptions.option_names()


def test_defaults_are_documented_values():
    """With no options the backend tries NPU -> GPU -> eager, not strict, no fp16 conversion, no cache."""
    opts = BackendOptions.from_mapping(None)
    assert (opts.device, opts.strict, opts.fp16, opts.cache, opts.cache_dir) == ("auto", False, False, False, None)
    assert opts.soc_model is None and opts.partition == "auto" and opts.verify is True


@given(st.text(min_size=1, max_size=12).filter(lambda k: k not in VALID))
def test_unknown_key_names_all_valid_keys(key):
    """Property: any unknown key is refused, and the message names it and lists every valid key."""
    with pytest.raises(InvalidOptionsError) as info:
        BackendOptions.from_mapping({key: 1})
    assert repr(key) in str(info.value)
    assert all(name in str(info.value) for name in VALID)


@given(st.sampled_from(["auto", "npu", "gpu", "cpu", "NPU", " htp "]))
def test_device_names_are_normalised(device):
    """Device names are case-insensitive and 'htp' means 'npu'."""
    assert BackendOptions.from_mapping({"device": device}).device in ("auto", "npu", "gpu", "cpu")


@pytest.mark.parametrize("device", ["tpu", "", 3, None])
def test_bad_device_lists_accepted_values(device):
    """A bad device names the value and the accepted devices."""
    with pytest.raises(InvalidOptionsError, match="'auto', 'npu', 'gpu', 'cpu'"):
        BackendOptions.from_mapping({"device": device})


@pytest.mark.parametrize("key", ["strict", "fp16", "cache", "verify"])
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_flags_take_only_booleans(key, value):
    """Flags refuse truthy non-bools (a typo like strict='false' must not mean True)."""
    with pytest.raises(InvalidOptionsError, match=key):
        BackendOptions.from_mapping({key: value})


def test_soc_model_accepts_numbers_and_chip_names():
    """soc_model takes a QNN SoC number or a chip name and stores the number."""
    assert BackendOptions.from_mapping({"soc_model": 60}).soc_model == 60
    assert BackendOptions.from_mapping({"soc_model": "SC8380XP"}).soc_model == 60
    assert BackendOptions.from_mapping({"soc_model": "sm8650"}).soc_model == 57


@pytest.mark.parametrize("value", ["snapdragon-9000", -1, 2.5, True])
def test_bad_soc_model_is_refused(value):
    """A bad soc_model names the value."""
    with pytest.raises(InvalidOptionsError, match="soc_model"):
        BackendOptions.from_mapping({"soc_model": value})


def test_cache_dir_requires_cache(tmp_path):
    """cache_dir without cache=True is refused with the fix, rather than silently not caching."""
    with pytest.raises(InvalidOptionsError, match="cache=True"):
        BackendOptions.from_mapping({"cache_dir": tmp_path})
    assert BackendOptions.from_mapping({"cache": True, "cache_dir": str(tmp_path)}).cache_dir == Path(tmp_path)


def test_provider_options_are_checked_by_name():
    """Pass-through QNN options are checked: unknown or qnnx-owned keys are refused, all at once."""
    opts = BackendOptions.from_mapping({"provider_options": {"htp_performance_mode": "burst", "vtcm_mb": 8}})
    assert opts.provider_options == (("htp_performance_mode", "burst"), ("vtcm_mb", "8"))
    with pytest.raises(InvalidOptionsError) as info:
        BackendOptions.from_mapping({"provider_options": {"bogus_option": "1", "backend_path": "/x"}})
    assert "bogus_option" in str(info.value) and "backend_path" in str(info.value) and "'device'" in str(info.value)


def test_options_are_frozen_and_hashable():
    """Options are immutable values (they feed cache keys)."""
    opts = BackendOptions.from_mapping({"device": "npu"})
    assert hash(opts) == hash(BackendOptions.from_mapping({"device": "npu"}))
    with pytest.raises(AttributeError):
        opts.device = "gpu"  # type: ignore[misc]


def test_mode_other_than_default_is_refused():
    """torch.compile's mode has no meaning for QNN: anything but None/'default' is refused with a hint."""
    from qnnx_backend import qnn_backend

    with pytest.raises(InvalidOptionsError, match="mode"):
        qnn_backend(None, [], mode="max-autotune")


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "device": st.sampled_from(["auto", "npu", "gpu", "cpu"]),
            "strict": st.booleans(),
            "fp16": st.booleans(),
            "verify": st.booleans(),
            "partition": st.sampled_from(["auto", "whole", "mixed"]),
            "verify_rtol": st.floats(1e-6, 1.0),
        },
    )
)
def test_valid_mappings_round_trip(raw):
    """Property: every valid mapping parses, and each given value is kept."""
    opts = BackendOptions.from_mapping(raw)
    for key, value in raw.items():
        assert getattr(opts, key) == value


@pytest.mark.parametrize("value", ["onnx", "", None, "FAST"])
def test_bad_exporter_lists_accepted_values(value):
    """exporter takes exactly 'auto', 'fast' or 'torch.onnx'; anything else names them."""
    with pytest.raises(InvalidOptionsError, match=r"'auto', 'fast', 'torch\.onnx'"):
        BackendOptions.from_mapping({"exporter": value})


@given(st.sampled_from(["auto", "fast", "torch.onnx"]), st.sampled_from(["auto", "fast", "torch.onnx"]))
def test_exporter_is_part_of_the_cache_key_material(a, b):
    """Property: two exporters give the same cache material only when they are the same exporter, so a context
    compiled from one exporter's ONNX is never loaded for the other."""
    ma = BackendOptions.from_mapping({"exporter": a}).cache_material()
    mb = BackendOptions.from_mapping({"exporter": b}).cache_material()
    assert (ma == mb) == (a == b)


@pytest.mark.parametrize("value", [0, -3, True, 1.5, "64", None])
def test_bad_max_dense_experts_names_what_is_accepted(value):
    """max_dense_experts takes an int >= 1; anything else is refused with the accepted values and the default."""
    with pytest.raises(InvalidOptionsError, match=r"max_dense_experts=.*accepted: an int >= 1.*default 32"):
        BackendOptions.from_mapping({"max_dense_experts": value})


def test_max_dense_experts_default_is_the_exports():
    """The backend's default bound on dense experts is qnnx-export's, so a direct export and a compile agree."""
    import qnnx_export

    assert BackendOptions().max_dense_experts == qnnx_export.ExportOptions().max_dense_experts == 32


@pytest.mark.parametrize("value", [-1, True, 1.5, "64", None])
def test_bad_max_gathered_expert_bytes_names_what_is_accepted(value):
    """max_gathered_expert_bytes takes an int >= 0; anything else is refused with the accepted values and the
    default."""
    with pytest.raises(InvalidOptionsError, match=r"max_gathered_expert_bytes=.*accepted: an int >= 0.*512 MiB"):
        BackendOptions.from_mapping({"max_gathered_expert_bytes": value})


def test_max_gathered_expert_bytes_default_is_the_exports():
    """The backend's bound on gathered expert weights is qnnx-export's, so a direct export and a compile agree."""
    import qnnx_export

    default = qnnx_export.ExportOptions().max_gathered_expert_bytes
    assert BackendOptions().max_gathered_expert_bytes == default == 512 << 20


@pytest.mark.parametrize(
    "name",
    [
        "enable_htp_shared_memory_allocator",
        "htp_graph_splitting_num_prepare_threads",
        "enable_htp_graph_splitting",
        "enable_htp_prepare_only",
    ],
)
def test_provider_options_of_the_installed_ep_are_accepted(name: str) -> None:
    """Options the installed onnxruntime-qnn knows (read from its EP library) pass, not only a fixed list; on a
    release that lacks one (these came with 2.6-2.7), it is refused by name."""
    import qnnx_detection

    if name in qnnx_detection.known_provider_options():
        opts = BackendOptions.from_mapping({"provider_options": {name: "1"}})
        assert opts.provider_options == ((name, "1"),)
    else:
        with pytest.raises(InvalidOptionsError, match=name):
            BackendOptions.from_mapping({"provider_options": {name: "1"}})


def test_known_provider_options_are_identifiers() -> None:
    """The option names read from the EP library are identifiers, never the library's file names."""
    import qnnx_detection

    known = qnnx_detection.known_provider_options()
    assert "htp_performance_mode" in known
    assert all(name.isidentifier() for name in known), sorted(n for n in known if not n.isidentifier())


def test_misspelt_provider_option_gets_a_suggestion() -> None:
    """A typo is refused with the closest real option name."""
    with pytest.raises(InvalidOptionsError, match="did you mean 'htp_performance_mode'"):
        BackendOptions.from_mapping({"provider_options": {"htp_performace_mode": "burst"}})


def test_qnnx_cache_env_turns_the_cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """QNNX_CACHE=1 makes cache=True the default; an explicit cache=False still wins; a bad value is named."""
    monkeypatch.setenv("QNNX_CACHE", "1")
    assert BackendOptions.from_mapping({}).cache is True
    assert BackendOptions.from_mapping({"cache": False}).cache is False
    monkeypatch.setenv("QNNX_CACHE", "maybe")
    with pytest.raises(InvalidOptionsError, match="QNNX_CACHE='maybe'"):
        BackendOptions.from_mapping({})
    monkeypatch.delenv("QNNX_CACHE")
    assert BackendOptions.from_mapping({}).cache is False


def test_cache_size_cap_from_option_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """cache_max_bytes sets the cache's cap (option or QNNX_CACHE_MAX_BYTES); a non-positive value is refused."""
    assert BackendOptions.from_mapping({"cache": True, "cache_max_bytes": 2**30}).cache_max_bytes == 2**30
    with pytest.raises(InvalidOptionsError, match="positive number of bytes"):
        BackendOptions.from_mapping({"cache": True, "cache_max_bytes": 0})
    with pytest.raises(InvalidOptionsError, match="cache=False"):
        BackendOptions.from_mapping({"cache_max_bytes": 2**30})
    monkeypatch.setenv("QNNX_CACHE_MAX_BYTES", "1048576")
    assert BackendOptions.from_mapping({"cache": True}).cache_max_bytes == 2**20


@given(partition=st.sampled_from(["auto", "whole", "mixed"]), strict=st.booleans())
def test_partition_auto_is_whole_under_strict_only(partition: str, strict: bool) -> None:
    """Property: partition='auto' splits unless strict (then it is 'whole'); 'whole' and 'mixed' mean themselves,
    and the resolved mode is what the context-cache key records."""
    opts = BackendOptions.from_mapping({"partition": partition, "strict": strict})
    expected = "whole" if partition == "auto" and strict else partition
    assert opts.resolved_partition == expected
    assert opts.cache_material()["partition"] == expected


def test_bad_partition_names_the_accepted_values() -> None:
    """partition='split' is refused with the three accepted values."""
    with pytest.raises(InvalidOptionsError, match="'auto', 'whole', 'mixed'"):
        BackendOptions.from_mapping({"partition": "split"})


def test_every_option_declares_its_cache_key_membership():
    """Each option field says how it enters the context-cache key, or why it does not: a new option cannot be left
    out of cache_material() by forgetting it."""
    import attrs

    from qnnx_backend._options import CACHE_KEY

    undeclared = [f.name for f in attrs.fields(BackendOptions) if CACHE_KEY not in f.metadata]
    assert undeclared == []
    reasons = [f.metadata[CACHE_KEY] for f in attrs.fields(BackendOptions) if not callable(f.metadata[CACHE_KEY])]
    assert all(isinstance(r, str) and r for r in reasons)


_KEYED_VALUES = {
    "fp16": st.booleans(),
    "partition": st.sampled_from(["auto", "whole", "mixed"]),
    "exporter": st.sampled_from(["auto", "fast", "torch.onnx"]),
    "provider_options": st.dictionaries(
        st.sampled_from(["htp_performance_mode", "vtcm_mb", "htp_arch"]), st.sampled_from(["1", "burst", "73"])
    ),
    "disable_passes": st.lists(st.sampled_from(["fuse_rmsnorm", "int64_to_int32", "fuse_erf_gelu"]), unique=True),
    "strict": st.booleans(),
    "verify": st.booleans(),
    "verify_rtol": st.floats(min_value=1e-4, max_value=1.0),
    "max_graphs": st.integers(min_value=1, max_value=64),
    "max_graph_bytes": st.sampled_from([1 << 20, 1 << 30]),
    "max_dense_experts": st.sampled_from([8, 64]),
    "max_gathered_expert_bytes": st.sampled_from([0, 1 << 20]),
    "buckets": st.sampled_from([None, "auto", (16, 64)]),
}


@given(st.fixed_dictionaries({}, optional=_KEYED_VALUES), st.fixed_dictionaries({}, optional=_KEYED_VALUES))
def test_cache_material_follows_exactly_the_keyed_options(a, b):
    """Property: two option sets give the same cache material exactly when every option declared as keyed has the
    same value (partition as resolved), whatever the options declared as not keyed say."""
    import attrs

    from qnnx_backend._options import CACHE_KEY

    oa, ob = BackendOptions.from_mapping(a), BackendOptions.from_mapping(b)
    keyed = [f.name for f in attrs.fields(BackendOptions) if callable(f.metadata[CACHE_KEY])]
    assert set(keyed) == {
        "fp16",
        "provider_options",
        "partition",
        "disable_passes",
        "exporter",
        "max_graph_bytes",
        "max_dense_experts",
        "max_gathered_expert_bytes",
    }
    same = all(getattr(oa, n) == getattr(ob, n) for n in keyed if n != "partition")
    same = same and oa.resolved_partition == ob.resolved_partition
    assert (oa.cache_material() == ob.cache_material()) == same


README = Path(__file__).resolve().parents[3] / "README.md"
_README_TABLE = re.compile(r"<!-- options-table:start [^\n]*-->\n\n(.*?)\n<!-- options-table:end -->", re.DOTALL)


@pytest.mark.skipif(not README.exists(), reason="the repository's README is not in a source distribution")
def test_readme_options_table_is_the_options_own():
    """The README's options table is the text options_table() writes from the fields (names, defaults, docstrings):
    a new or changed option fails here until `python tools/options_table.py` rewrites the table."""
    from qnnx_backend._options import options_table

    match = _README_TABLE.search(README.read_text(encoding="utf-8"))
    assert match, "README.md lost its options-table markers"
    expected = options_table()
    assert match.group(1) == expected, (
        "README.md's options table is not BackendOptions': run `python tools/options_table.py`, which writes\n"
        + expected
    )


def test_options_table_shows_each_default(monkeypatch: pytest.MonkeyPatch):
    """Every row of the table begins its default column with the literal of the option's default, the defaults read
    from the environment included (shown with no QNNX_ variable set), and gives each option a meaning."""
    from qnnx_backend._options import options_table, shown_default

    for name in ("QNNX_CACHE", "QNNX_CACHE_MAX_BYTES"):
        monkeypatch.delenv(name, raising=False)
    defaults = BackendOptions()
    rows = [line.split(" | ") for line in options_table().splitlines()[2:]]
    assert [row[0] for row in rows] == [f"| `{name}`" for name in VALID]
    for row, name in zip(rows, VALID, strict=True):
        assert row[1].startswith(shown_default(getattr(defaults, name))), (name, row[1])
        assert len(row) == 3 and row[2].endswith(". |"), (name, row[2])
