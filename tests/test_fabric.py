"""GPU fabric state: decoding NVML's answer, the real backend's versioned call (against the real
pynvml binding's structs, the C function replaced), and what the GPU reader exports from the
fake backend for every state and status."""

import pynvml
import pytest

from exporter.gpu.fabric import decode
from exporter.gpu.reader import GpuReader
from exporter.nvml.backend import FABRIC_INFO, NvmlError
from exporter.nvml.fake import FakeBackend, load_capture
from exporter.nvml.pynvml_backend import PynvmlBackend
from exporter.profiles import PROFILES
from exporter.tools.simulate.nvml import fake_backend
from exporter.tools.simulate.nvml_scenarios import FAULTY_GPU
from exporter.tools.simulate.nvml_synth import fabric_entry

# What a single passthrough H200 (no NVSwitch, driver 580.159.04) answered to the v3 call: success
# with state 0 (project reference notes, "Measured on a real host").
PASSTHROUGH = {"api": "v3", "state": 0, "status": 0, "cliqueId": 0, "clusterUuid": "00" * 16,
               "healthMask": 0, "healthSummary": 0}


def test_decode_states_status_and_health_mask():
    assert not decode(PASSTHROUGH).supported
    assert decode({**PASSTHROUGH, "state": 2}).state == "in_progress"
    assert decode({**PASSTHROUGH, "state": 2, "status": 7}).status is None  # meaningful once completed
    f = decode({**PASSTHROUGH, "state": 3})
    assert f.completed and f.status == 0 and f.health == {} and f.cluster_uuid == "" and f.summary == ""
    assert decode({**PASSTHROUGH, "state": 0x7F03}).state == "completed"  # padding bytes after the C byte
    # degraded bandwidth TRUE, route recovery FALSE, route unhealthy n/s, access timeout TRUE,
    # incorrect configuration 5 (insufficient NVLinks)
    mask = 1 | (2 << 2) | (0 << 4) | (1 << 6) | (5 << 8)
    f = decode({**PASSTHROUGH, "state": 3, "healthMask": mask, "healthSummary": 3, "cliqueId": 7,
                "clusterUuid": "ab" * 16})
    assert f.health == {"degraded_bandwidth": True, "route_recovery": False, "access_timeout_recovery": True,
                        "incorrect_configuration": True}
    assert (f.summary, f.clique_id, f.cluster_uuid) == ("limited_capacity", 7, "ab" * 16)
    f = decode({**PASSTHROUGH, "state": 3, "healthMask": 1 << 8})  # 1: NONE
    assert f.health == {"incorrect_configuration": False}


def fill(**values):
    """A stand-in for the C entry point: writes `values` into the struct it is given by pointer."""
    seen = []

    def fn(handle, ptr):
        info = ptr._obj  # a pointer, as the C function needs (a bare struct would go by value)
        seen.append(hex(info.version))
        if info.version != values.get("accept", info.version):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        for k, v in values.items():
            if k != "accept":
                setattr(info, k, v)
        return pynvml.NVML_SUCCESS
    fn.seen = seen
    return fn


def test_real_backend_uses_the_newest_struct_the_driver_accepts(monkeypatch):
    b = PynvmlBackend()
    fn = fill(state=3, status=0, cliqueId=4, healthMask=2, accept=0x02000024)  # a driver without v3
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", fn)
    got = b._fabric_info(pynvml, object())
    assert fn.seen == ["0x3000028", "0x2000024"]
    assert got == {"api": "v2", "state": 3, "status": 0, "cliqueId": 4, "clusterUuid": "00" * 16,
                   "healthMask": 2, "healthSummary": 0}


def test_real_backend_falls_back_to_v1_and_surfaces_not_supported(monkeypatch):
    b = PynvmlBackend()

    def missing(handle, ptr):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # a pre-550 driver

    def v1(handle, ptr):
        ptr._obj.state = 2
        return pynvml.NVML_SUCCESS

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", missing)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfo", v1)
    assert b._fabric_info(pynvml, object())["api"] == "v1"
    assert b._fabric_info(pynvml, object())["state"] == 2

    def unsupported(handle, ptr):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetGpuFabricInfoV", unsupported)
    with pytest.raises(NvmlError) as e:
        b._fabric_info(pynvml, object())
    assert e.value.not_supported


def fabric_samples(fake, index):
    fake.init()
    r = GpuReader(fake, index).read_fast()
    assert r.ok, r.errors
    return r, {(spec.name, tuple(sorted(extra.items()))): v for spec, v, extra in r.samples
               if spec.name.startswith("gpu_fabric")}


def test_p5_gpus_report_a_completed_fabric():
    r, s = fabric_samples(fake_backend(PROFILES["p5.48xlarge"]), 0)
    assert s == {("gpu_fabric_state", (("state", "completed"),)): 1, ("gpu_fabric_status", ()): 0}
    assert r.fabric.completed


def test_fabric_manager_down_leaves_every_gpu_in_progress():
    fake = fake_backend(PROFILES["p5en.48xlarge"], ["gpu-fabric-manager-down"])
    for i in range(8):
        r, s = fabric_samples(fake, i)
        assert s[("gpu_fabric_state", (("state", "in_progress"),))] == 1
        assert ("gpu_fabric_status", ()) not in s and r.fabric.state == "in_progress"


def test_status_error_on_one_gpu():
    fake = fake_backend(PROFILES["p5.48xlarge"], ["gpu-fabric-status-error"])
    _, s = fabric_samples(fake, FAULTY_GPU)
    assert s[("gpu_fabric_status", ())] == 999 and s[("gpu_fabric_state", (("state", "completed"),))] == 1
    assert fabric_samples(fake, 0)[1][("gpu_fabric_status", ())] == 0


@pytest.mark.parametrize("how", ["p4d", "capture", "passthrough"])
def test_not_supported_is_absent_not_a_fault(how):
    if how == "p4d":  # A100: no fabric registration (NVML: Hopper or newer)
        fake = fake_backend(PROFILES["p4d.24xlarge"], ["gpu-fabric-manager-down"])
    elif how == "capture":  # the real H200 capture: the call never succeeded there
        fake = FakeBackend(load_capture())
    else:
        capture = load_capture()
        capture["devices"][0][FABRIC_INFO] = {"ok": PASSTHROUGH, "us_median": 8.7}
        fake = FakeBackend(capture)
    r, s = fabric_samples(fake, 0)
    assert s == {} and r.fabric is None


def test_fabric_entry_is_what_the_real_backend_returns():
    assert set(fabric_entry(3)["ok"]) == set(PASSTHROUGH)


def test_multi_node_nvlink_answer_exports_clique_and_health():
    """What a GB200-class GPU reports (clique, cluster, health mask): the info and health series."""
    capture = load_capture()
    mask = 1 | (2 << 2) | (2 << 4) | (2 << 6) | (1 << 8)  # bandwidth degraded, the rest fine
    capture["devices"][0][FABRIC_INFO] = {"ok": {**PASSTHROUGH, "state": 3, "cliqueId": 7,
                                                 "clusterUuid": "ab" * 16, "healthMask": mask}}
    r, s = fabric_samples(FakeBackend(capture), 0)
    assert s[("gpu_fabric_info", (("clique_id", "7"), ("cluster_uuid", "ab" * 16)))] == 1
    assert {k[1][0][1]: v for k, v in s.items() if k[0] == "gpu_fabric_health_problem"} == {
        "degraded_bandwidth": 1, "route_recovery": 0, "route_unhealthy": 0, "access_timeout_recovery": 0,
        "incorrect_configuration": 0}
    assert r.fabric.health["degraded_bandwidth"]
