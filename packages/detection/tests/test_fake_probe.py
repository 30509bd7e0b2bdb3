"""probe() and is_available() driven by FakeEnvironment: the decision logic for machines this bench is not."""

from __future__ import annotations

import json
import threading

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import qnnx_detection as qd
from qnnx_detection.errors import InvalidDeviceError
from qnnx_detection.testing import CANNOT_INITIALIZE, FakeEnvironment, QnnDevice, use_environment


def test_host_simulator_fake_matches_this_bench() -> None:
    """The default fake reports an available HTP simulator at soc 60 and a GPU that cannot initialize."""
    with use_environment(FakeEnvironment.host_simulator()):
        report = qd.probe()
    npu, gpu = report.backend("npu"), report.backend("gpu")
    assert report.usable_devices == ("npu",)
    assert npu.available and npu.is_simulator and npu.hardware_type == "CPU"
    assert (npu.soc_model, npu.soc_name, npu.htp_arch, npu.soc_source) == (60, "SC8380XP", 73, "default")
    assert not gpu.available and not gpu.is_simulator
    assert "could not initialize" in (gpu.reason or "")
    assert "no Adreno GPU" in (gpu.reason or "")


def test_snapdragon_reports_silicon_npu_and_gpu() -> None:
    """A Windows on Snapdragon fake reports both backends on real silicon with the detected SoC."""
    with use_environment(FakeEnvironment.snapdragon(soc_model=88)):
        report = qd.probe()
        assert qd.is_available("gpu") and qd.is_available("htp") and qd.is_available()
    assert report.usable_devices == ("npu", "gpu")
    npu = report.backend("npu")
    assert not npu.is_simulator and npu.hardware_type == "NPU"
    assert (npu.soc_model, npu.soc_name, npu.htp_arch, npu.soc_source) == (88, "SC8480XP", 81, "detected")
    assert npu.library_path is not None and npu.library_path.endswith("QnnHtp.dll")
    assert report.backend("gpu").soc_name == "SC8480XP"


def test_snapdragon_without_gpu_driver() -> None:
    """Silicon whose GPU backend fails to initialize keeps the NPU and explains the GPU."""
    with use_environment(FakeEnvironment.snapdragon(gpu=False, system="Linux")):
        report = qd.probe()
    assert report.usable_devices == ("npu",)
    assert "could not initialize" in (report.backend("gpu").reason or "")


def test_no_qnn_installed_is_a_report_not_an_exception() -> None:
    """Without onnxruntime-qnn every backend is unavailable with an install hint, and versions say None."""
    with use_environment(FakeEnvironment.without_qnn()):
        report = qd.probe()
        assert not qd.is_available()
        assert not qd.is_available("npu")
    assert report.versions.onnxruntime_qnn is None
    assert report.versions.qairt is None
    for status in report.backends:
        assert not status.available
        assert "pip install" in (status.reason or "")


def test_broken_install_and_failed_registration_are_reported() -> None:
    """A broken import or a refused EP library becomes the reason of every backend."""
    with use_environment(FakeEnvironment(import_error="OSError: libc++.so.1: bad ELF")):
        report = qd.probe()
    assert all("bad ELF" in (b.reason or "") for b in report.backends)
    with use_environment(FakeEnvironment(registration_error="ort_version_supported=0")):
        report = qd.probe()
    assert all("could not be registered" in (b.reason or "") for b in report.backends)
    assert report.devices == ()


def test_missing_library_and_missing_device_are_explained() -> None:
    """A missing backend library and a missing NPU device each produce their own reason."""
    with use_environment(FakeEnvironment(libraries={"gpu"})):
        assert "not installed" in (qd.probe().backend("npu").reason or "")
    linux_arm = FakeEnvironment(machine="aarch64", devices=(), init_failures={})
    with use_environment(linux_arm):
        reason = qd.probe().backend("npu").reason or ""
    assert "enumerated no QNN NPU device" in reason


def test_forced_device_that_is_unavailable_is_a_problem() -> None:
    """QNNX_DEVICE=gpu on a machine without a usable GPU adds a problem line; the report stays truthful."""
    with use_environment(FakeEnvironment(environ={"QNNX_DEVICE": "gpu"})):
        report = qd.probe()
    assert report.overrides.device == "gpu"
    assert report.usable_devices == ("npu",)
    assert any("QNNX_DEVICE='gpu'" in p for p in report.problems)


def test_use_environment_restores_and_nests() -> None:
    """Nested fakes: the inner one wins, the outer one comes back, and afterwards the real host answers again."""
    outer, inner = FakeEnvironment.without_qnn(), FakeEnvironment.snapdragon()
    with use_environment(outer):
        with use_environment(inner):
            assert qd.probe().usable_devices == ("npu", "gpu")
        assert qd.probe().usable_devices == ()
    from qnnx_detection._probe import active_environment

    assert active_environment()[1] is False


def test_use_environment_applies_to_other_threads() -> None:
    """The fake is visible from threads started inside the block (backends probe from worker threads)."""
    seen: list[tuple[str, ...]] = []
    with use_environment(FakeEnvironment.snapdragon()):
        worker = threading.Thread(target=lambda: seen.append(qd.probe().usable_devices))
        worker.start()
        worker.join()
    assert seen == [("npu", "gpu")]


def test_use_environment_rejects_non_fakes() -> None:
    """Passing something else than a FakeEnvironment is a TypeError, before anything changes."""
    with pytest.raises(TypeError, match="FakeEnvironment"), use_environment({"machine": "x86_64"}):  # type: ignore[arg-type]
        pass


def test_report_accessors_and_dict() -> None:
    """backend() accepts 'htp', rejects unknown names; to_dict is JSON-able and carries schema_version 1."""
    with use_environment(FakeEnvironment.host_simulator()):
        report = qd.probe()
    assert report.backend("htp") is report.backend("npu")
    with pytest.raises(InvalidDeviceError):
        report.backend("cpu")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["schema_version"] == qd.SCHEMA_VERSION == 1
    assert data["usable_devices"] == ["npu"]
    assert [b["device"] for b in data["backends"]] == ["npu", "gpu"]


def test_is_available_rejects_unknown_devices() -> None:
    """is_available('tpu') is misuse and raises InvalidDeviceError (a ValueError)."""
    with use_environment(FakeEnvironment.host_simulator()), pytest.raises(ValueError, match="tpu"):
        qd.is_available("tpu")


# ---- properties --------------------------------------------------------------------------------------------------

_machines = st.sampled_from(["x86_64", "AMD64", "aarch64", "ARM64", "riscv64"])
_devices = st.lists(
    st.builds(
        QnnDevice,
        hardware_type=st.sampled_from(["CPU", "NPU", "GPU"]),
        vendor=st.sampled_from(["Qualcomm", "Intel", "AMD"]),
        vendor_id=st.sampled_from([0x5143, 0x8086, 0x1022]),
    ),
    max_size=3,
).map(tuple)
_env_values = st.dictionaries(
    st.sampled_from(["QNNX_DISABLE", "QNNX_DEVICE", "QNNX_SOC_MODEL"]),
    st.one_of(st.sampled_from(["1", "0", "npu", "gpu", "auto", "57", "SM8750", "x"]), st.text(max_size=6)),
)
fake_environments = st.builds(
    FakeEnvironment,
    system=st.sampled_from(["Linux", "Windows", "Darwin"]),
    machine=_machines,
    onnxruntime=st.one_of(st.none(), st.just("1.32.0")),
    onnxruntime_qnn=st.one_of(st.none(), st.sampled_from(["2.4.0", "2.7.0"])),
    import_error=st.one_of(st.none(), st.just("boom")),
    registration_error=st.one_of(st.none(), st.just("refused")),
    devices=_devices,
    libraries=st.frozensets(st.sampled_from(["npu", "gpu"])),
    init_failures=st.dictionaries(
        st.sampled_from(["npu", "gpu"]),
        st.sampled_from([CANNOT_INITIALIZE, "QNN_DEVICE_ERROR_INVALID_CONFIG", "weird native text"]),
    ),
    host_soc=st.one_of(st.none(), st.sampled_from([36, 57, 60, 69, 88, 999])),
    environ=_env_values,
)


@given(fake_environments)
def test_property_probe_is_total_and_truthful(env: FakeEnvironment) -> None:
    """For any fake: probe never raises, unavailable carries a reason, a simulator is never silicon,
    is_available agrees with the report, and the report is JSON-able."""
    with use_environment(env):
        report = qd.probe()
        assert qd.is_available() == bool(report.usable_devices)
        for status in report.backends:
            assert qd.is_available(status.device) == status.available
    assert [b.device for b in report.backends] == ["npu", "gpu"]
    for status in report.backends:
        if status.available:
            assert status.reason is None
        else:
            assert status.reason
        if status.is_simulator:
            # only the NPU on an x86 host is ever the simulator, and then never an NPU/GPU silicon device
            assert status.device == "npu"
            assert env.machine in ("x86_64", "AMD64")
            assert status.hardware_type in (None, "CPU")
    if env.machine in ("x86_64", "AMD64"):
        assert not any(b.hardware_type == "NPU" and b.is_simulator for b in report.backends)
        assert report.backend("npu").is_simulator or report.backend("npu").hardware_type == "NPU"
    if env.onnxruntime_qnn is None or env.onnxruntime is None or report.overrides.disabled:
        assert report.usable_devices == ()
    assert report.usable_devices == tuple(b.device for b in report.backends if b.available)
    json.dumps(report.to_dict())


@given(fake_environments)
def test_property_available_means_the_backend_initialized(env: FakeEnvironment) -> None:
    """A backend is available only if its library exists, a device serves it, and its init did not fail."""
    with use_environment(env):
        report = qd.probe()
    for status in report.backends:
        if status.available:
            assert status.device in env.libraries
            assert status.device not in env.init_failures
            assert env.devices
            assert env.registration_error is None and env.import_error is None


@given(fake_environments, st.sampled_from(["npu", "gpu"]))
def test_property_fake_is_deterministic(env: FakeEnvironment, device: str) -> None:
    """Probing the same fake twice gives equal reports (no hidden state leaks between probes)."""
    with use_environment(env):
        first, second = qd.probe(), qd.probe()
    assert first == second
    assert attrs.asdict(first.backend(device)) == attrs.asdict(second.backend(device))


def test_quick_probe_initializes_nothing_but_still_skips_what_is_known() -> None:
    """probe(initialize=False) does not try backends (an init failure stays unseen) but reports QNN missing."""
    import attrs

    from qnnx_detection.testing import CANNOT_INITIALIZE

    env = attrs.evolve(FakeEnvironment.snapdragon(), init_failures={"npu": CANNOT_INITIALIZE})
    with use_environment(env):
        quick = qd.probe(initialize=False)
        full = qd.probe()
    assert quick.initialized is False and full.initialized is True
    assert quick.backend("npu").available and not full.backend("npu").available
    with use_environment(FakeEnvironment.without_qnn()):
        assert not qd.probe(initialize=False).any_available
