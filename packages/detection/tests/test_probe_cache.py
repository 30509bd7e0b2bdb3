"""The probe cache: a backend's initialization verdict reused by later probes only while nothing it depends on changed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import pytest
from detection_helpers import run_python
from hypothesis import given
from hypothesis import strategies as st

import qnnx_detection as qd
from qnnx_detection import _verdicts
from qnnx_detection._overrides import probe_cache_root
from qnnx_detection._verdicts import VerdictStore, key_material, verdict_key
from qnnx_detection.testing import FakeEnvironment, QnnDevice, use_environment
from qnnx_testkit.strategies import json_scalars, key_materials


@pytest.fixture
def init_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The devices a fake environment was asked to initialize, in order."""
    from qnnx_detection import testing

    calls: list[str] = []
    real = testing._FakeAdapter.try_init

    def counting(self: Any, device: str, index: int, soc_model: int) -> str | None:
        calls.append(device)
        return real(self, device, index, soc_model)

    monkeypatch.setattr(testing._FakeAdapter, "try_init", counting)
    return calls


def _probe(fake: FakeEnvironment, *, refresh: bool = False) -> qd.ProbeReport:
    with use_environment(fake):
        return qd.probe(refresh=refresh)


def _verdicts_of(report: qd.ProbeReport) -> list[tuple[str, bool, str | None]]:
    return [(b.device, b.available, b.reason) for b in report.backends]


def test_second_probe_reuses_the_verdicts(tmp_path: Path, init_calls: list[str]) -> None:
    """A second probe under identical conditions initializes nothing and reports the same verdicts, marked reused."""
    fake = FakeEnvironment(probe_cache=str(tmp_path))
    first = _probe(fake)
    assert init_calls == ["npu", "gpu"]
    assert not any(b.reused for b in first.backends)
    second = _probe(fake)
    assert init_calls == ["npu", "gpu"]
    assert all(b.reused for b in second.backends)
    assert _verdicts_of(second) == _verdicts_of(first)
    assert second.initialized and second.usable_devices == ("npu",)


def test_refresh_prepares_the_graphs_again(tmp_path: Path, init_calls: list[str]) -> None:
    """probe(refresh=True) ignores the recorded verdicts, initializes every backend and records them again."""
    fake = FakeEnvironment(probe_cache=str(tmp_path))
    _probe(fake)
    refreshed = _probe(fake, refresh=True)
    assert init_calls == ["npu", "gpu", "npu", "gpu"]
    assert not any(b.reused for b in refreshed.backends)
    assert all(b.reused for b in _probe(fake).backends)


def test_quick_probe_neither_reads_nor_writes_the_cache(tmp_path: Path, init_calls: list[str]) -> None:
    """probe(initialize=False) initializes nothing and leaves the cache folder alone."""
    with use_environment(FakeEnvironment(probe_cache=str(tmp_path))):
        report = qd.probe(initialize=False)
    assert not report.initialized and init_calls == []
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


# Each change that must make a recorded verdict useless, as a change of the fake environment.
_CHANGES = {
    "onnxruntime-qnn upgraded": {"onnxruntime_qnn": "2.8.0"},
    "QAIRT changed": {"qairt": "2.52.0"},
    "onnxruntime upgraded": {"onnxruntime": "1.33.0"},
    "libraries reinstalled": {"library_stamp": "2"},
    "rebooted (driver update)": {"boot_id": "fake-boot-2"},
    "kernel updated": {"release": "6.9.0"},
    "another SoC": {"environ": {"QNNX_SOC_MODEL": "57"}},
    "loader path changed": {"environ": {"LD_LIBRARY_PATH": "/opt/qnn/lib"}},
    "ADSP path changed": {"environ": {"ADSP_LIBRARY_PATH": "/opt/dsp"}},
    "another device": {"devices": (QnnDevice(hardware_type="CPU", vendor="AMD", vendor_id=0x1022),)},
    "python changed": {"python": "3.12.1"},
}


@pytest.mark.parametrize("change", sorted(_CHANGES))
def test_any_change_of_what_a_verdict_depends_on_probes_again(
    change: str, tmp_path: Path, init_calls: list[str]
) -> None:
    """After a change of versions, libraries, boot, kernel, SoC, loader path or device, the graphs are prepared again."""
    fake = FakeEnvironment(probe_cache=str(tmp_path))
    _probe(fake)
    init_calls.clear()
    report = _probe(attrs.evolve(fake, **_CHANGES[change]))
    assert "npu" in init_calls
    assert not report.backend("npu").reused


def test_a_stale_usable_verdict_is_not_reused_after_a_driver_reinstall(tmp_path: Path) -> None:
    """A GPU that was usable is not reported usable from the cache once its libraries changed and it fails."""
    good = attrs.evolve(FakeEnvironment.snapdragon(system="Linux"), probe_cache=str(tmp_path))
    assert _probe(good).backend("gpu").available
    broken = attrs.evolve(
        good, library_stamp="2", init_failures={"gpu": "QNN_BACKEND_ERROR_CANNOT_INITIALIZE: no driver"}
    )
    report = _probe(broken)
    assert not report.backend("gpu").available and not report.backend("gpu").reused


def test_no_boot_identity_keeps_no_verdict(tmp_path: Path, init_calls: list[str]) -> None:
    """A host without a boot identity records nothing and initializes every time."""
    fake = FakeEnvironment(probe_cache=str(tmp_path), boot_id=None)
    _probe(fake)
    _probe(fake)
    assert init_calls == ["npu", "gpu", "npu", "gpu"]
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_raising_initialization_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An initialization that raised is reported as a problem and the next probe tries again."""
    from qnnx_detection import testing

    def boom(self: Any, device: str, index: int, soc_model: int) -> str | None:
        raise RuntimeError("native crash stand-in")

    monkeypatch.setattr(testing._FakeAdapter, "try_init", boom)
    report = _probe(FakeEnvironment(probe_cache=str(tmp_path)))
    assert not report.any_available
    assert any("native crash stand-in" in p for p in report.problems)
    assert not tmp_path.exists() or not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize(
    "damage",
    [b"", b"{not json", b"\xff\xfe\x00", b'{"record": 1}', b"[]", b'{"record": 1, "key": "0", "created": 0}'],
)
def test_a_damaged_record_is_a_miss(damage: bytes, tmp_path: Path, init_calls: list[str]) -> None:
    """A record that is empty, not JSON, not UTF-8 or incomplete is ignored and rewritten; the probe never raises."""
    fake = FakeEnvironment(probe_cache=str(tmp_path))
    _probe(fake)
    for record in tmp_path.glob("*.json"):
        record.write_bytes(damage)
    init_calls.clear()
    report = _probe(fake)
    assert init_calls == ["npu", "gpu"] and not report.problems
    assert all(b.reused for b in _probe(fake).backends)


def test_a_record_renamed_to_another_key_is_not_reused(tmp_path: Path, init_calls: list[str]) -> None:
    """A "usable" record copied under the name of another key (here: another SoC) does not answer for that key."""
    fake = FakeEnvironment(probe_cache=str(tmp_path))
    _probe(fake)
    other = attrs.evolve(fake, environ={"QNNX_SOC_MODEL": "57"})
    _probe(other)
    names = sorted(tmp_path.glob("*.json"))
    usable = {p: json.loads(p.read_text()) for p in names}
    good = next(p for p, r in usable.items() if r["reason"] is None and r["material"]["soc_model"] == 60)
    target = next(p for p, r in usable.items() if r["material"]["soc_model"] == 57 and r["material"]["device"] == "npu")
    target.write_bytes(good.read_bytes())
    init_calls.clear()
    report = _probe(other)
    assert "npu" in init_calls and not report.backend("npu").reused


def test_an_unwritable_cache_folder_only_costs_time(tmp_path: Path, init_calls: list[str]) -> None:
    """When the cache folder cannot be created (a file is in the way) the probe works and keeps nothing."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    fake = FakeEnvironment(probe_cache=str(blocker / "probe"))
    first, second = _probe(fake), _probe(fake)
    assert first.usable_devices == second.usable_devices == ("npu",)
    assert init_calls == ["npu", "gpu", "npu", "gpu"] and not second.problems


def test_verdicts_expire(tmp_path: Path) -> None:
    """A usable verdict is reused for a day, an unusable one for an hour; a record from the future is not trusted."""
    store = VerdictStore(tmp_path)
    ok, bad = {"device": "npu"}, {"device": "gpu"}
    now = 1_000_000.0
    store.put(ok, None, now=now)
    store.put(bad, "cannot initialize", now=now)
    assert store.get(ok, now=now + 23 * 3600) is not None
    assert store.get(ok, now=now + 25 * 3600) is None
    assert store.get(bad, now=now + 0.5 * 3600) == _verdicts.Verdict("cannot initialize", 1800.0)
    assert store.get(bad, now=now + 2 * 3600) is None
    assert store.get(ok, now=now - 3600) is None


def test_probe_cache_variables() -> None:
    """QNNX_PROBE_CACHE=0 turns the cache off; QNNX_PROBE_CACHE_DIR moves it; the default is the user cache folder."""
    for off in ("0", "false", "No", " off "):
        assert probe_cache_root({"QNNX_PROBE_CACHE": off, "QNNX_PROBE_CACHE_DIR": "/x"}) is None
    assert probe_cache_root({"QNNX_PROBE_CACHE_DIR": "/tmp/pc"}) == Path("/tmp/pc")
    assert probe_cache_root({"QNNX_PROBE_CACHE": "1", "QNNX_PROBE_CACHE_DIR": "/tmp/pc"}) == Path("/tmp/pc")
    default = probe_cache_root({})
    assert default is not None and default.name == "probe" and "qnnx" in default.parts


def test_linux_boot_id_reads_the_kernel_file(tmp_path: Path) -> None:
    """The Linux boot identity is the kernel's boot_id; an unreadable or empty file gives None."""
    f = tmp_path / "boot_id"
    f.write_text("bb088cb8-1326-4ad0-9d5b-a80055db2562\n")
    assert _verdicts.linux_boot_id(str(f)) == "bb088cb8-1326-4ad0-9d5b-a80055db2562"
    f.write_text("")
    assert _verdicts.linux_boot_id(str(f)) is None
    assert _verdicts.linux_boot_id(str(tmp_path / "missing")) is None


def test_folder_identity_changes_when_a_library_changes(tmp_path: Path) -> None:
    """Replacing a library with one of another size, or adding one, changes the folder's identity."""
    (tmp_path / "libQnnHtp.so").write_bytes(b"a" * 10)
    (tmp_path / "README.txt").write_text("not a library")
    before = _verdicts.folder_identity(str(tmp_path))
    assert len(before) == 1
    (tmp_path / "libQnnHtp.so").write_bytes(b"a" * 11)
    changed = _verdicts.folder_identity(str(tmp_path))
    (tmp_path / "libQnnHtpV73Skel.so").write_bytes(b"b")
    added = _verdicts.folder_identity(str(tmp_path))
    assert len({tuple(before), tuple(changed), tuple(added)}) == 3
    assert _verdicts.folder_identity(str(tmp_path / "gone")) == [f"{tmp_path / 'gone'}|missing"]


# -- properties --------------------------------------------------------------------------------------------------

_leaf = json_scalars(max_int=2**31)
_materials = key_materials(_leaf)
_reasons = st.one_of(st.none(), st.text(min_size=1, max_size=40))


@given(_materials, st.randoms())
def test_key_ignores_key_order(material: dict[str, Any], rnd: Any) -> None:
    """The key is the same for any insertion order of the material."""
    items = list(material.items())
    rnd.shuffle(items)
    assert verdict_key(dict(items)) == verdict_key(material)


@given(_materials, st.data())
def test_key_changes_when_any_part_changes(material: dict[str, Any], data: st.DataObject) -> None:
    """Changing the value of any one part of the material changes the key."""
    name = data.draw(st.sampled_from(sorted(material)))
    value = data.draw(_leaf.filter(lambda v: json.dumps(v) != json.dumps(material[name])))
    assert verdict_key({**material, name: value}) != verdict_key(material)


@given(st.lists(st.tuples(_materials, _reasons), min_size=1, max_size=6))
def test_store_answers_like_a_dict(entries: list[tuple[dict[str, Any], str | None]]) -> None:
    """After a series of puts, get() returns the last reason put for each material, and None for any other."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        store = VerdictStore(Path(folder))
        model: dict[str, str | None] = {}
        for material, reason in entries:
            assert store.put(material, reason)
            model[verdict_key(material)] = reason
        for material, _ in entries:
            got = store.get(material)
            assert got is not None and got.reason == model[verdict_key(material)]
        assert store.get({"never": "stored", "n": len(entries)}) is None


def test_key_material_names_every_dependency() -> None:
    """The material holds the versions, libraries, boot, loader variables, device and SoC it was given."""
    material = key_material(
        detection_version="9.9",
        platform_info={"system": "Linux", "release": "6.8", "machine": "aarch64"},
        versions={"onnxruntime": "1.32.0", "onnxruntime_qnn": "2.7.0", "qairt": "2.51.0", "python": "3.11"},
        boot="b",
        libraries=["/lib/libQnnHtp.so|1|2"],
        loader_env={"LD_LIBRARY_PATH": None},
        device="npu",
        ep_device={"hardware_type": "NPU", "vendor": "Qualcomm", "vendor_id": 0x5143, "device_id": 0},
        soc_model=57,
    )
    text = json.dumps(material)
    for part in ("9.9", "aarch64", "2.7.0", "2.51.0", "libQnnHtp.so|1|2", "LD_LIBRARY_PATH", "NPU", "57"):
        assert part in text


# -- the real host ---------------------------------------------------------------------------------------------------

_HOST_PROBE = (
    "import json, qnnx_detection as qd\n"
    "r = qd.probe()\n"
    "print(json.dumps([[b.device, b.available, b.reason, b.reused] for b in r.backends]))\n"
)


def test_host_probe_is_reused_by_the_next_process(tmp_path: Path) -> None:
    """On this machine a second process reuses the first one's verdicts; QNNX_PROBE_CACHE=0 never does."""
    env = {"QNNX_PROBE_CACHE_DIR": str(tmp_path)}
    runs = []
    for extra in ({}, {}, {"QNNX_PROBE_CACHE": "0"}):
        result = run_python(_HOST_PROBE, env={**env, **extra})
        assert result.returncode == 0, result.stderr
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    first, second, off = runs
    assert [b[:3] for b in second] == [b[:3] for b in first] == [b[:3] for b in off]
    assert [b[3] for b in first] == [False, False]
    assert [b[3] for b in second] == [True, True]
    assert [b[3] for b in off] == [False, False]
    assert len(list(tmp_path.glob("*.json"))) == 2
    assert os.environ.get("QNNX_PROBE_CACHE_DIR") != str(tmp_path)  # the test's own folder, not the session's
