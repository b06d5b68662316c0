"""The fake NVML backend replays captures faithfully, scripts faults, and the session on top."""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
import types

import pytest

from exporter.nvml import backend as b
from exporter.nvml.backend import NvmlError
from exporter.nvml.fake import SPEND_WHOLE_S, FakeBackend, call_key, field_ids, load_field_cost
from exporter.nvml.pynvml_backend import PynvmlBackend, plain
from exporter.nvml.session import NvmlSession, pci_key
from exporter.profiles import PROFILES
from exporter.tools.simulate.nvml import fake_backend
from exporter.tools.simulate.nvml_scenarios import FAULTY_GPU, ONSET_S, SCENARIOS
from tests.helpers import FIXTURES, START_HANG_GUARD_S, test_pool

CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_capture.json"


@pytest.fixture(scope="module")
def capture() -> dict:
    return json.loads(CAPTURE.read_text())


@pytest.fixture
def fake() -> FakeBackend:
    f = FakeBackend.from_file(CAPTURE)
    f.init()
    return f


def _args_of(key: str) -> tuple[str, tuple[int, ...]]:
    """A capture key back to (fn, args): the inverse of call_key."""
    fn, *rest = key.split("/")
    names = {"corrected": 0, "uncorrected": 1, "volatile": 0, "aggregate": 1, "multiple_sbe": 0, "dbe": 1}
    return fn, tuple(names[a] if a in names else int(a) for a in rest)


def test_every_captured_call_replays_its_value_or_error(fake, capture):
    dev = capture["devices"][0]
    checked = 0
    for key, entry in dev.items():
        if not isinstance(entry, dict) or key == "field_values":
            continue
        fn, args = _args_of(key)
        assert call_key(fn, args) == key
        if "ok" in entry:
            got = fake.call(0, fn, *args)
            assert got == entry["ok"] and type(got) is type(entry["ok"]), key
        else:
            with pytest.raises(NvmlError) as e:
                fake.call(0, fn, *args)
            if "code" in entry:
                assert e.value.code == entry["code"], key
            else:  # missing in the binding, or a binding TypeError
                assert e.value.code == b.NVML_ERROR_FUNCTION_NOT_FOUND
        checked += 1
    assert checked > 150


def test_field_values_by_id_with_return_codes(fake, capture):
    ids = field_ids()
    fv = capture["devices"][0]["field_values"]
    wanted = [(ids[n], item) for n, item in fv.items() if n in ids]
    got = fake.field_values(0, [fid for fid, _ in wanted])
    assert len(got) == len(wanted) > 200
    for (fid, item), v in zip(wanted, got, strict=True):
        assert v.field_id == fid and v.ret == item["ret"]
        if item["ret"] == 0:
            assert v.value == item["value"] and type(v.value) is type(item["value"])
        else:
            assert v.value is None
    # an alias resolves to the same id: SW power cap is field 74 (PERF_POLICY_POWER)
    assert fake.field_values(0, [74])[0].ret == 0


def test_system_calls_and_count(fake, capture):
    assert fake.system("nvmlSystemGetDriverVersion") == capture["system"]["nvmlSystemGetDriverVersion"]["ok"]
    assert fake.device_count() == len(capture["devices"]) == 1


def test_uninitialised_and_unknown_calls():
    f = FakeBackend.from_file(CAPTURE)
    with pytest.raises(NvmlError) as e:
        f.call(0, "nvmlDeviceGetName")
    assert e.value.code == b.NVML_ERROR_UNINITIALIZED
    f.init()
    with pytest.raises(NvmlError) as e:
        f.call(0, "nvmlDeviceGetSomethingNew")
    assert e.value.not_supported
    with pytest.raises(NvmlError) as e:
        f.call(0, "nvmlDeviceGetTemperatureThreshold", 99)  # an argument the capture never used
    assert e.value.code == b.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(NvmlError) as e:
        f.call(1, "nvmlDeviceGetName")
    assert e.value.code == b.NVML_ERROR_INVALID_ARGUMENT


def test_returned_values_are_copies(fake):
    fake.call(0, "nvmlDeviceGetMemoryInfo")["used"] = -1
    assert fake.call(0, "nvmlDeviceGetMemoryInfo")["used"] > 0


def test_captured_latency_is_spent(capture):
    """Every call costing a sleep's worth spends at least its captured latency, whatever the calls
    before it overshot (a loaded host's sleeps overshoot by milliseconds: that credit must not
    make a 3 ms field batch free). Only lower bounds: a loaded host may take longer, never less."""
    f = FakeBackend.from_file(CAPTURE, latencies=True)
    f.init()
    energy_s = capture["devices"][0]["nvmlDeviceGetTotalEnergyConsumption"]["us_median"] * 1e-6
    assert energy_s >= SPEND_WHOLE_S
    for _ in range(5):
        t = time.perf_counter()
        f.call(0, "nvmlDeviceGetTotalEnergyConsumption")
        assert time.perf_counter() - t >= energy_s
    field = field_ids()["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    batch_s = load_field_cost()["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] * 1e-6  # ~2,984 us
    t = time.perf_counter()
    f.field_values(0, [field])
    assert time.perf_counter() - t >= batch_s >= SPEND_WHOLE_S
    # cheap calls: paid through the balance, which starts at nothing (the costly calls' overshoot
    # is nobody's credit), so together they spend at least their captured latencies
    cheap = [k for k, v in capture["devices"][0].items() if "/" not in k and isinstance(v, dict)
             and "error" not in v and v.get("us_median", 0) < 50][:20]
    owed = sum(capture["devices"][0][k]["us_median"] * 1e-6 for k in cheap) * 10
    t = time.perf_counter()
    for _ in range(10):
        for k in cheap:
            f.call(0, k)
    assert time.perf_counter() - t >= owed


def test_scripted_growth_loss_and_slowdown(fake):
    fake.advance_to(0)
    fake.grow(0, "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", rate=10, accel=2)
    fake.advance_to(5)
    # 10*5 + 2*25/2 = 75; the call and the field agree
    assert fake.call(0, "nvmlDeviceGetTotalEccErrors", 0, 0) == 75
    assert fake.field_values(0, [3])[0].value == 75
    fake.set_value(0, "NVML_FI_DEV_REMAPPED_PENDING", 1)
    assert fake.call(0, "nvmlDeviceGetRemappedRows")[2] == 1
    fake.lose(0, at_s=6)
    fake.call(0, "nvmlDeviceGetName")
    fake.advance_to(6)
    for call in (lambda: fake.call(0, "nvmlDeviceGetName"), lambda: fake.field_values(0, [3])):
        with pytest.raises(NvmlError) as e:
            call()
        assert e.value.gpu_lost
    fake.restore(0)
    fake.slow_down(0, 0.05)
    t = time.perf_counter()
    fake.call(0, "nvmlDeviceGetName")
    assert time.perf_counter() - t >= 0.045


def test_hang_blocks_until_released(fake):
    fake.hang(0, "nvmlDeviceGetPowerUsage", seconds=30)
    fake.call(0, "nvmlDeviceGetName")  # other calls are not hung
    done = threading.Event()
    threading.Thread(target=lambda: (fake.call(0, "nvmlDeviceGetPowerUsage"), done.set()),
                     daemon=True).start()
    assert not done.wait(0.2)
    fake.release()
    assert done.wait(START_HANG_GUARD_S)


def test_fail_and_set_error(fake):
    fake.fail(0, "nvmlDeviceGetPowerUsage", b.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(NvmlError) as e:
        fake.call(0, "nvmlDeviceGetPowerUsage")
    assert e.value.code == b.NVML_ERROR_NO_PERMISSION
    fake.set_error(0, "NVML_FI_DEV_MEMORY_TEMP", b.NVML_ERROR_UNKNOWN)
    assert fake.field_values(0, [82])[0].ret == b.NVML_ERROR_UNKNOWN
    fake.fail(0, "nvmlDeviceGetFieldValues", b.NVML_ERROR_TIMEOUT)
    with pytest.raises(NvmlError):
        fake.field_values(0, [3])


def test_events_deliver_time_out_and_report_lost_gpu(fake):
    es = fake.event_set_create()
    fake.queue_event(0, 31)  # before registration: lost, like real NVML
    fake.register_events(0, 8, es)
    with pytest.raises(NvmlError) as e:
        fake.event_wait(es, 50)
    assert e.value.code == b.NVML_ERROR_TIMEOUT
    fake.queue_event(0, 79)
    ev = fake.event_wait(es, 1000)
    assert (ev.index, ev.event_type, ev.data) == (0, 8, 79)
    assert ev.uuid == fake.call(0, "nvmlDeviceGetUUID")
    with pytest.raises(NvmlError) as e:
        fake.register_events(0, 1 << 30, es)
    assert e.value.not_supported
    fake.lose(0)
    t = time.perf_counter()
    with pytest.raises(NvmlError) as e:
        fake.event_wait(es, 120_000)
    # at once, not after the two minutes asked for (half of them is a margin no loaded host uses up)
    assert e.value.gpu_lost and time.perf_counter() - t < 60
    fake.event_set_free(es)


def test_event_wait_wakes_for_scheduled_event(fake):
    es = fake.event_set_create()
    fake.register_events(0, 8, es)
    fake.queue_event(0, 48, at_s=fake.now() + 0.2)
    ev = fake.event_wait(es, 3000)
    assert ev.data == 48


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p5e.48xlarge", "p4d.24xlarge"])
def test_profile_node(instance_type, capture):
    p = PROFILES[instance_type]
    f = fake_backend(p)
    f.init()
    assert f.device_count() == 8
    uuids = {f.call(i, "nvmlDeviceGetUUID") for i in range(8)}
    serials = {f.call(i, "nvmlDeviceGetSerial") for i in range(8)}
    buses = [f.call(i, "nvmlDeviceGetPciInfo")["busId"] for i in range(8)]
    assert len(uuids) == len(serials) == 8
    assert buses == [f"00000000:{x}:00.0" for x in ("53", "64", "75", "86", "97", "A8", "B9", "CA")]
    assert {f.call(i, "nvmlDeviceGetName") for i in range(8)} == {p.gpu_model}
    total = f.call(0, "nvmlDeviceGetMemoryInfo")["total"]
    assert 0.9 * p.gpu_memory_bytes <= total <= 1.1 * p.gpu_memory_bytes
    for link in range(p.nvlinks):
        assert f.call(0, "nvmlDeviceGetNvLinkState", link) == 1
        assert f.call(0, "nvmlDeviceGetNvLinkErrorCounter", link, 2) == 0
    with pytest.raises(NvmlError):
        f.call(0, "nvmlDeviceGetNvLinkState", p.nvlinks)
    # the rest is the capture: ECC counts, remapper histogram, thresholds
    dev = capture["devices"][0]
    assert f.call(5, "nvmlDeviceGetRowRemapperHistogram") == dev["nvmlDeviceGetRowRemapperHistogram"]["ok"]
    threshold = dev["nvmlDeviceGetTemperatureThreshold/1"]["ok"]
    assert f.call(5, "nvmlDeviceGetTemperatureThreshold", 1) == threshold


def test_scenarios_are_prefixed_and_apply():
    p = PROFILES["p5.48xlarge"]
    assert SCENARIOS and all(n.startswith("gpu-") for n in SCENARIOS)
    for name in SCENARIOS:
        f = fake_backend(p, [name])
        f.init()
        f.advance_to(ONSET_S + 1)
        healthy = f.call(0, "nvmlDeviceGetName")
        assert healthy == p.gpu_model  # GPU 0 is never the faulty one
    f = fake_backend(p, ["gpu-lost"])
    f.init()
    f.advance_to(ONSET_S + 1)
    with pytest.raises(NvmlError) as e:
        f.call(FAULTY_GPU, "nvmlDeviceGetName")
    assert e.value.gpu_lost


def test_scenarios_declared_to_the_simulation():
    from exporter.tools.simulate import all_scenarios

    assert set(SCENARIOS) <= set(all_scenarios())


# --- session ------------------------------------------------------------------------------------
@pytest.mark.parametrize("addr", ["0000:00:06", "PCI:0000:00:06", "00000000:00:06.0", "0000:00:06.0",
                                  "pci:0000:00:06", " 00:06.0 "])
def test_session_by_pci_accepts_kernel_and_nvml_forms(addr):
    s = NvmlSession(FakeBackend.from_file(CAPTURE), pool=test_pool())
    assert s.ensure()
    d = s.by_pci(addr)
    assert d is not None and d.index == 0 and d.pci_bus_id == "00000000:00:06.0"


def test_session_identity_and_lookups(capture):
    s = NvmlSession(fake_backend(PROFILES["p5.48xlarge"]), pool=test_pool())
    assert s.ensure() and s.error == ""
    assert len(s.devices) == 8
    d = s.devices[5]
    assert s.by_uuid(d.uuid.upper()) == d
    assert s.by_pci("PCI:0000:a8:00") == d
    assert s.by_pci("0000:ff:00.0") is None and s.by_pci("garbage") is None
    assert s.driver_version == capture["system"]["nvmlSystemGetDriverVersion"]["ok"]
    assert s.cuda_driver_version == "13.0"
    assert pci_key("00000000:CA:00.0") == (0, 0xCA, 0)


def test_session_init_failure_is_reported_and_retried_with_backoff():
    now = [0.0]
    f = FakeBackend.from_file(CAPTURE)
    f.fail_init(b.NVML_ERROR_DRIVER_NOT_LOADED)
    s = NvmlSession(f, clock=lambda: now[0], pool=test_pool())
    assert not s.ensure()
    assert "Driver Not Loaded" in s.error and "9" in s.error
    f._init_error = None  # the driver loads
    now[0] = 5.0
    assert not s.ensure()  # still backing off
    now[0] = 11.0
    assert s.ensure() and s.error == "" and len(s.devices) == 1


def test_session_gpu_lost_at_start_is_marked():
    f = fake_backend(PROFILES["p5.48xlarge"])
    f.lose(2)
    s = NvmlSession(f, pool=test_pool())
    assert s.ensure()
    assert s.lost == {2} and s.devices[2].uuid == "" and s.devices[3].uuid
    f.restore(2)
    assert s.refresh_identity(2).uuid.startswith("GPU-")


def test_the_context_s_nvml_session_loads_its_backend_on_first_use(tmp_path):
    from exporter.compose import compose
    from exporter.config import load

    ctx = compose(load(None), nvml=NvmlSession.for_capture(str(CAPTURE), False, test_pool()))
    s = ctx.nvml
    assert not isinstance(s.backend, FakeBackend)  # nothing loaded until someone uses NVML
    assert s.ensure() and isinstance(s.backend, FakeBackend) and ctx.nvml is s
    missing = str(tmp_path / "missing.json")
    bad = compose(load(None), nvml=NvmlSession.for_capture(missing, False, test_pool())).nvml
    assert not bad.ensure() and "missing.json" in bad.error


# --- the pynvml backend without a GPU -----------------------------------------------------------
def test_plain_converts_like_the_capture_tool():
    class Pci(ctypes.Structure):
        _fields_ = [("busId", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("ids", ctypes.c_uint * 2)]

    v = Pci(b"00000000:00:06.0", 0, (ctypes.c_uint * 2)(1, 2))
    assert plain(v) == {"busId": "00000000:00:06.0", "domain": 0, "ids": [1, 2]}
    assert plain((1, b"x", [2.5])) == [1, "x", [2.5]]


def test_pynvml_backend_without_the_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NvmlError) as e:
        PynvmlBackend().init()
    assert e.value.code == b.NVML_ERROR_LIBRARY_NOT_FOUND and "nvidia-ml-py" in str(e.value)


def _fake_pynvml(init_code: int | None = None, call_code: int | None = None) -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value
            super().__init__(b.ERROR_STRINGS.get(value, str(value)))

    def init() -> None:
        if init_code is not None:
            raise NVMLError(init_code)

    def get_power(handle: object) -> int:
        if call_code is not None:
            raise NVMLError(call_code)
        return 76498

    mod.NVMLError = NVMLError
    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetHandleByIndex = lambda i: ctypes.pointer(ctypes.c_int(i))
    mod.nvmlDeviceGetPowerUsage = get_power
    return mod


@pytest.mark.parametrize("code", [b.NVML_ERROR_LIBRARY_NOT_FOUND, b.NVML_ERROR_DRIVER_NOT_LOADED])
def test_pynvml_backend_maps_init_errors(monkeypatch, code):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_code=code))
    with pytest.raises(NvmlError) as e:
        PynvmlBackend().init()
    assert e.value.code == code


@pytest.mark.parametrize("code", [b.NVML_ERROR_GPU_IS_LOST, b.NVML_ERROR_NOT_SUPPORTED, b.NVML_ERROR_UNKNOWN])
def test_pynvml_backend_maps_call_errors(monkeypatch, code):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(call_code=code))
    be = PynvmlBackend()
    be.init()
    with pytest.raises(NvmlError) as e:
        be.call(0, "nvmlDeviceGetPowerUsage")
    assert e.value.code == code
    with pytest.raises(NvmlError) as e:
        be.call(0, "nvmlDeviceGetNoSuchThing")
    assert e.value.code == b.NVML_ERROR_FUNCTION_NOT_FOUND


def test_pynvml_backend_returns_plain_values(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    be = PynvmlBackend()
    be.init()
    assert be.call(0, "nvmlDeviceGetPowerUsage") == 76498


def test_pynvml_backend_converts_real_field_value_structs(monkeypatch):
    """field_values reads pynvml's own c_nvmlFieldValue_t array (the binding's ctypes types,
    no GPU needed): value by valueType, per-field return codes kept."""
    import pynvml as real_pynvml

    arr = (real_pynvml.c_nvmlFieldValue_t * 3)()
    arr[0].nvmlReturn, arr[0].valueType, arr[0].value.ullVal = 0, 3, 2421458  # unsigned long long
    arr[1].nvmlReturn, arr[1].valueType, arr[1].value.uiVal = 0, 1, 35  # unsigned int
    arr[2].nvmlReturn = b.NVML_ERROR_NOT_SUPPORTED
    mod = _fake_pynvml()
    mod.nvmlDeviceGetFieldValues = lambda handle, ids: arr
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    be = PynvmlBackend()
    be.init()
    got = be.field_values(0, [83, 82, 29])
    assert [(v.field_id, v.ret, v.value) for v in got] == [(83, 0, 2421458), (82, 0, 35), (29, 3, None)]
    assert all(type(v.value) is int for v in got[:2])
