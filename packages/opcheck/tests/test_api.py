"""The public contract the backend relies on: names, arguments, report behaviour, errors."""

from __future__ import annotations

import json

import attrs
import pytest
from opcheck_graphs import inp, model, node, unary

import qnnx_opcheck as oc
from qnnx_opcheck import errors


def _mixed() -> object:
    """Relu -> Erf -> Sigmoid -> Erf: two unsupported Erf nodes among supported ones."""
    return model(
        [
            node("Relu", ["x"], ["a"]),
            node("Erf", ["a"], ["b"], name="e1"),
            node("Sigmoid", ["b"], ["c"]),
            node("Erf", ["c"], ["y"], name="e2"),
        ],
        [inp("x", [2, 8])],
        ["y"],
    )


def test_public_names_are_sorted_and_present() -> None:
    """__all__ is sorted and exposes the contract names."""
    assert oc.__all__ == sorted(oc.__all__)
    for name in ("check_model", "OpCheckReport", "NodeVerdict", "errors"):
        assert name in oc.__all__


def test_supported_model_report_fields() -> None:
    """A model of supported ops gives supported=True, no unsupported, and the table version used."""
    rep = oc.check_model(unary("Relu"), "htp", onnxruntime_qnn="2.7.0", soc_model=60)
    assert rep.supported
    assert rep.unsupported == ()
    assert rep.backend == "htp"
    assert rep.onnxruntime_qnn == "2.7.0"
    assert rep.soc_model == 60
    assert [v.status for v in rep.verdicts] == ["supported"]
    assert rep.verdicts[0].evidence


def test_report_is_frozen() -> None:
    """Reports and verdicts are immutable."""
    rep = oc.check_model(unary("Relu"), onnxruntime_qnn="2.7.0")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rep.backend = "gpu"  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rep.verdicts[0].status = "unsupported"  # type: ignore[misc]


def test_npu_is_an_alias_of_htp() -> None:
    """backend='npu' checks against the HTP table."""
    rep = oc.check_model(unary("Relu"), "npu", onnxruntime_qnn="2.7.0")
    assert rep.backend == "htp"


@pytest.mark.parametrize("bad", ["cpu", "HTPX", "", None, 3])
def test_unknown_backend_raises_value_error_naming_choices(bad: object) -> None:
    """An unknown backend raises UnknownBackendError (a ValueError) naming the accepted values."""
    with pytest.raises(errors.UnknownBackendError) as info:
        oc.check_model(unary("Relu"), bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, errors.QnnxOpcheckError)
    assert "htp" in str(info.value) and "gpu" in str(info.value)


def test_bad_version_string_raises() -> None:
    """A version that is not MAJOR.MINOR raises InvalidVersionError listing the known tables."""
    with pytest.raises(errors.InvalidVersionError, match=r"2\.7\.0"):
        oc.check_model(unary("Relu"), onnxruntime_qnn="latest")


def test_unsupported_summary_and_lists() -> None:
    """summary() names the unsupported nodes; unsupported lists every blocking verdict in order."""
    rep = oc.check_model(_mixed(), onnxruntime_qnn="2.7.0")
    assert not rep.supported
    assert [v.node_name for v in rep.unsupported] == ["e1", "e2"]
    assert rep.summary().startswith("htp (onnxruntime-qnn 2.7.0): 2/4 nodes supported; unsupported: Erf (e1), Erf (e2)")


def test_raise_for_unsupported_lists_all_nodes() -> None:
    """raise_for_unsupported raises one error naming every unsupported node, op and reason."""
    rep = oc.check_model(_mixed(), onnxruntime_qnn="2.7.0")
    with pytest.raises(errors.UnsupportedOperatorsError) as info:
        rep.raise_for_unsupported()
    exc = info.value
    assert isinstance(exc, ValueError)
    assert [v.node_name for v in exc.verdicts] == ["e1", "e2"]
    text = str(exc)
    assert "e1 (Erf)" in text and "e2 (Erf)" in text
    assert "not supported by QNN EP" in text


def test_raise_for_unsupported_is_silent_when_supported() -> None:
    """A supported report does not raise."""
    oc.check_model(unary("Relu"), onnxruntime_qnn="2.7.0").raise_for_unsupported()


def test_to_dict_is_json_and_complete() -> None:
    """to_dict() survives json round-trip and carries counts and every verdict field."""
    rep = oc.check_model(_mixed(), onnxruntime_qnn="2.7.0")
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["supported"] is False
    assert d["counts"] == {"nodes": 4, "supported": 2, "unsupported": 2, "hazard": 0}
    assert set(d["verdicts"][0]) >= {"node_name", "op_type", "domain", "status", "reason", "evidence"}


def test_unnamed_nodes_get_index_names() -> None:
    """A node without a name is reported as n<index>."""
    m = model([node("Relu", ["x"], ["a"], name=""), node("Erf", ["a"], ["y"], name="")], [inp("x", [2])], ["y"])
    m.graph.node[0].name = ""
    m.graph.node[1].name = ""
    rep = oc.check_model(m, onnxruntime_qnn="2.7.0")
    assert [v.node_name for v in rep.verdicts] == ["n0", "n1"]
    assert "Erf (n1)" in rep.summary()


def test_bytes_and_path_inputs(tmp_path: object) -> None:
    """check_model accepts serialized bytes and a path, with the same verdicts as the proto."""
    m = _mixed()
    path = tmp_path / "m.onnx"  # type: ignore[operator]
    path.write_bytes(m.SerializeToString())
    by_proto = oc.check_model(m, onnxruntime_qnn="2.7.0").verdicts
    assert oc.check_model(m.SerializeToString(), onnxruntime_qnn="2.7.0").verdicts == by_proto
    assert oc.check_model(path, onnxruntime_qnn="2.7.0").verdicts == by_proto
    assert oc.check_model(str(path), onnxruntime_qnn="2.7.0").verdicts == by_proto


def test_input_proto_not_modified() -> None:
    """check_model does not change the caller's ModelProto (no inferred value_info added)."""
    m = _mixed()
    before = m.SerializeToString()
    oc.check_model(m, onnxruntime_qnn="2.7.0")
    assert m.SerializeToString() == before


def test_default_version_follows_installed_onnxruntime_qnn() -> None:
    """Without onnxruntime_qnn, the installed release (package metadata) is the requested version."""
    rep = oc.check_model(unary("Relu"))
    installed = oc.installed_onnxruntime_qnn()
    assert rep.requested_onnxruntime_qnn == installed
    if installed is not None:
        assert rep.onnxruntime_qnn == installed or rep.notes


def test_unprobed_version_falls_back_to_nearest_with_note() -> None:
    """A release without a table uses the nearest table and says so in notes."""
    rep = oc.check_model(unary("Relu"), onnxruntime_qnn="2.9.1")
    assert rep.onnxruntime_qnn == "2.7.0"
    assert any("nearest" in n for n in rep.notes)


def test_unprobed_soc_falls_back_with_note() -> None:
    """An HTP soc_model without a table uses soc 60 and says so."""
    rep = oc.check_model(unary("Relu"), onnxruntime_qnn="2.7.0", soc_model=69)
    assert rep.soc_model == 60
    assert any("soc_model 69" in n for n in rep.notes)


def test_derived_table_for_unprobed_release() -> None:
    """onnxruntime-qnn 2.5.0 (not probed) gets a table derived from the 2.4.0 and 2.6.0 probes that says so."""
    rep = oc.check_model(unary("Relu"), onnxruntime_qnn="2.5.0")
    assert rep.table_source == "derived"
    assert rep.onnxruntime_qnn == "2.5.0"
    assert rep.supported
    assert "not probed" in (rep.verdicts[0].evidence or "")


def test_release_differences_follow_the_probes() -> None:
    """Attention (added in 2.6.0) is unsupported for 2.4.0 and 2.5.0 and supported for 2.6.0 and 2.7.0."""
    qkv = [inp(n, [1, 2, 4, 8]) for n in ("q", "k", "v")]
    m = model([node("Attention", ["q", "k", "v"], ["y"])], qkv, ["y"], opset=23)
    got = {v: oc.check_model(m, onnxruntime_qnn=v).supported for v in ("2.4.0", "2.5.0", "2.6.0", "2.7.0")}
    assert got == {"2.4.0": False, "2.5.0": False, "2.6.0": True, "2.7.0": True}


def test_gpu_backend_uses_documented_table() -> None:
    """The GPU table is documented (not probed) and says so in the report and the evidence."""
    rep = oc.check_model(unary("Relu"), "gpu", onnxruntime_qnn="2.7.0")
    assert rep.backend == "gpu"
    assert rep.soc_model is None
    assert rep.table_source == "documented"
    assert rep.supported
    assert "not probed" in (rep.verdicts[0].evidence or "").lower() or "Not probed" in (rep.verdicts[0].evidence or "")


def test_testing_fake_report_behaves_like_a_real_one() -> None:
    """testing.fake_report builds a report whose properties and errors work like check_model's."""
    from qnnx_opcheck.testing import fake_report

    rep = fake_report(supported=("Conv", "Relu"), unsupported=("Erf",), hazards=("Add",))
    assert not rep.supported
    assert [v.node_name for v in rep.unsupported] == ["n2"]
    assert [v.op_type for v in rep.hazards] == ["Add"]
    assert rep.summary() == "htp (onnxruntime-qnn 2.7.0): 3/4 nodes supported; unsupported: Erf (n2); 1 hazard(s)"
    with pytest.raises(errors.UnsupportedOperatorsError, match="n2 \\(Erf\\)"):
        rep.raise_for_unsupported()
    assert fake_report().supported
