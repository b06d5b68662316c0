"""Fault scenarios of the fake NVML backend on a simulated node (`--scenario gpu-...`).

Each scenario scripts the fake: state faults are there from the start, faults that happen to a
running node (a GPU lost, a hang, XID events) start ONSET_S seconds after start so the first
scrape shows a healthy node. All of them hit GPU `FAULTY_GPU` so that the other GPUs show
that one sick GPU does not hide the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from exporter.nvml import backend as nv
from exporter.nvml.backend import FABRIC_INFO, NVML_ERROR_IN_USE, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN
from exporter.nvml.fake import FakeBackend
from exporter.tools.simulate import job
from exporter.tools.simulate.nvml_synth import TRAINING_LEVELS, TRAINING_UTIL, activity_levels, fabric_entry

ONSET_S = 3.0
FAULTY_GPU = 3

# nvmlClocksEventReason* bits
HW_SLOWDOWN, SW_THERMAL, HW_THERMAL = 0x8, 0x20, 0x40
XID_EVENTS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 149, 154)


def _lost(f: FakeBackend, p: Any) -> None:
    f.queue_event(FAULTY_GPU, 79, at_s=ONSET_S - 0.01)
    f.lose(FAULTY_GPU, at_s=ONSET_S)


def _sbe_storm(f: FakeBackend, p: Any) -> None:
    # 1 error/s at first, accelerating by 2/s^2: the accelerating SBE rate that precedes failures.
    for key in ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL"):
        f.grow(FAULTY_GPU, key, rate=1.0, accel=2.0)


SBE_KEYS = ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL")
SBE_STEP_S = 100.0  # gpu-ecc-sbe-step: when the rate steps up (past the time-compressed 7 h history of
                    # tests/test_alert_matrix.py)
SBE_BURST_S = 3.0


def _sbe_step(f: FakeBackend, p: Any) -> None:
    # 0.05 errors/s (above the rules' 0.01/s floor, under their 0.1/s young-GPU threshold), then x10.
    for key in SBE_KEYS:
        f.grow(FAULTY_GPU, key, rate=0.05, step=0.01)

    def step() -> None:
        for key in SBE_KEYS:
            f.grow(FAULTY_GPU, key, rate=0.5, start_s=SBE_STEP_S, step=0.01)  # the later growth wins
    f.at(SBE_STEP_S, step)


def _sbe_burst(f: FakeBackend, p: Any) -> None:
    # A new node's first seconds: 5 corrected errors/s for SBE_BURST_S seconds, then none.
    for key in SBE_KEYS:
        f.grow(FAULTY_GPU, key, rate=5.0, step=0.01)

    def stop() -> None:
        for key in SBE_KEYS:
            f.grow(FAULTY_GPU, key, rate=0.0, start_s=SBE_BURST_S, step=0.01)
    f.at(SBE_BURST_S, stop)


def _volatile_reset(f: FakeBackend, p: Any) -> None:
    # Corrected errors counted before (volatile 4,000 since the driver loaded, 9,000 in the GPU's
    # life), 0.05/s ongoing; at the onset the driver reloads: the volatile counters start over.
    vol, agg = SBE_KEYS
    f.set_value(FAULTY_GPU, vol, 4000)
    f.set_value(FAULTY_GPU, agg, 9000)
    for key in SBE_KEYS:
        f.grow(FAULTY_GPU, key, rate=0.05, step=0.01)

    def reload() -> None:
        f.set_value(FAULTY_GPU, vol, 0)
        f.set_value(FAULTY_GPU, "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 0)
        f.grow(FAULTY_GPU, vol, rate=0.05, start_s=ONSET_S, step=0.01)
    f.at(ONSET_S, reload)


def _remap_one_row(f: FakeBackend) -> None:
    """An uncorrectable error remaps a row, pending until reset: NVML counts it in the
    uncorrectable remapped rows at once and one bank has one spare row fewer."""
    key = "NVML_FI_DEV_REMAPPED_UNC"
    f.set_value(FAULTY_GPU, key, (f.get(FAULTY_GPU, key) or 0) + 1)
    f.set_value(FAULTY_GPU, "NVML_FI_DEV_REMAPPED_PENDING", 1)
    hist = f.get(FAULTY_GPU, "nvmlDeviceGetRowRemapperHistogram")
    hist.update(max=hist["max"] - 1, high=hist["high"] + 1)
    f.set_value(FAULTY_GPU, "nvmlDeviceGetRowRemapperHistogram", hist)


def _dbe(f: FakeBackend, p: Any) -> None:
    def hit() -> None:
        for key in ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL"):
            f.set_value(FAULTY_GPU, key, (f.get(FAULTY_GPU, key) or 0) + 1)
        _remap_one_row(f)
        f.set_value(FAULTY_GPU, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 1)
    f.at(ONSET_S, hit)
    f.queue_event(FAULTY_GPU, 48, at_s=ONSET_S)


def _remap_pending(f: FakeBackend, p: Any) -> None:
    _remap_one_row(f)
    f.queue_event(FAULTY_GPU, 63, at_s=ONSET_S)


def _remap_failure(f: FakeBackend, p: Any) -> None:
    f.set_value(FAULTY_GPU, "NVML_FI_DEV_REMAPPED_UNC", 8)
    f.set_value(FAULTY_GPU, "NVML_FI_DEV_REMAPPED_FAILURE", 1)
    hist = f.get(FAULTY_GPU, "nvmlDeviceGetRowRemapperHistogram")
    hist.update(max=hist["max"] - 2, low=hist["low"] + 1, none=hist["none"] + 1)
    f.set_value(FAULTY_GPU, "nvmlDeviceGetRowRemapperHistogram", hist)
    f.queue_event(FAULTY_GPU, 64, at_s=ONSET_S)


def _thermal(f: FakeBackend, p: Any) -> None:
    slowdown = f.get(FAULTY_GPU, "nvmlDeviceGetTemperatureThreshold/1") or 89
    f.set_value(FAULTY_GPU, "nvmlDeviceGetTemperature/0", slowdown + 1)
    f.set_value(FAULTY_GPU, "NVML_FI_DEV_MEMORY_TEMP", slowdown + 4)
    f.set_value(FAULTY_GPU, "nvmlDeviceGetCurrentClocksEventReasons", HW_SLOWDOWN | SW_THERMAL | HW_THERMAL)
    f.set_value(FAULTY_GPU, "nvmlDeviceGetClockInfo/1", 765)
    for key in ("NVML_FI_DEV_PERF_POLICY_THERMAL", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
                "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"):
        f.set_value(FAULTY_GPU, key, 0)
        f.grow(FAULTY_GPU, key, rate=0.8e9)  # throttled 80% of the time, in ns


def _pcie(f: FakeBackend, p: Any) -> None:
    f.set_value(FAULTY_GPU, "nvmlDeviceGetCurrPcieLinkWidth", 8)
    gen = f.get(FAULTY_GPU, "nvmlDeviceGetMaxPcieLinkGeneration") or 5
    f.set_value(FAULTY_GPU, "nvmlDeviceGetCurrPcieLinkGeneration", max(1, gen - 1))
    f.grow(FAULTY_GPU, "NVML_FI_DEV_PCIE_REPLAY_COUNTER", rate=5.0)
    f.grow(FAULTY_GPU, "NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS", rate=5.0)


def _nvlink(f: FakeBackend, p: Any) -> None:
    if p is None or p.nvlinks < 8:
        return
    f.grow(FAULTY_GPU, "nvmlDeviceGetNvLinkErrorCounter/5/2", rate=20.0)  # CRC flit
    f.grow(FAULTY_GPU, "nvmlDeviceGetNvLinkErrorCounter/5/0", rate=2.0)  # replay
    f.set_value(FAULTY_GPU, "nvmlDeviceGetNvLinkState/7", 0)
    f.queue_event(FAULTY_GPU, 74, at_s=ONSET_S)


def _recovery_reboot(f: FakeBackend, p: Any) -> None:
    f.set_value(FAULTY_GPU, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 2)
    f.queue_event(FAULTY_GPU, 154, at_s=ONSET_S)


def _has_fabric(f: FakeBackend, index: int) -> bool:
    return "ok" in f.devices[index].get(FABRIC_INFO, {})  # Not Supported on pre-Hopper parts


def _fabric_manager_down(f: FakeBackend, p: Any) -> None:
    for i in range(len(f.devices)):  # no Fabric Manager: no GPU ever finishes registering
        if _has_fabric(f, i):
            f.set_value(i, FABRIC_INFO, fabric_entry(2)["ok"])


def _fabric_status_error(f: FakeBackend, p: Any) -> None:
    if _has_fabric(f, FAULTY_GPU):
        f.set_value(FAULTY_GPU, FABRIC_INFO, fabric_entry(3, NVML_ERROR_UNKNOWN)["ok"])


IDLE_UTIL = 0.01


def _idle_allocation(f: FakeBackend, p: Any) -> None:
    # A job holds every GPU (its memory stays allocated) but barely runs a kernel: waiting on data,
    # a hung rank, a notebook left open.
    for i in range(len(f.devices)):
        f.set_value(i, "nvmlDeviceGetUtilizationRates", {"gpu": round(IDLE_UTIL * 100), "memory": 0})
        f.set_gpm_levels(i, activity_levels(IDLE_UTIL))


def _gpm_in_use(f: FakeBackend, p: Any) -> None:
    f.fail(FAULTY_GPU, "nvmlGpmSampleGet", NVML_ERROR_IN_USE)


def _mig_mode(f: FakeBackend, p: Any) -> None:
    f.set_value(FAULTY_GPU, "nvmlDeviceGetMigMode", [1, 1])
    f.fail(FAULTY_GPU, "nvmlGpmSampleGet", NVML_ERROR_NOT_SUPPORTED)


# Training-job scenarios (exporter/tools/simulate/job.py): GPM levels during the stall window.
NCCL_SPIN_LEVELS = {**activity_levels(0.0), nv.GPM_SM_UTIL: 20.0, nv.GPM_SM_OCCUPANCY: 3.0}
STRAGGLER_LEVELS = {**activity_levels(TRAINING_UTIL), nv.GPM_SM_UTIL: 97.0, nv.GPM_ANY_TENSOR_UTIL: 90.0}


MEMORY_BOUND_LEVELS = {**activity_levels(TRAINING_UTIL), nv.GPM_SM_UTIL: 40.0, nv.GPM_ANY_TENSOR_UTIL: 3.0,
                       nv.GPM_DRAM_BW_UTIL: 75.0}
STUCK_LEVELS = {**activity_levels(0.0), nv.GPM_SM_UTIL: 100.0, nv.GPM_SM_OCCUPANCY: 50.0}


def _job_window(f: FakeBackend, gpus: Sequence[int], levels: dict[int, float], util: int,
                recover: bool = True) -> None:
    """From job.STALL_AT_S (until job.RECOVER_AT_S when `recover`), GPUs `gpus` read `levels` and
    utilisation `util` %; then they train again."""
    def stall() -> None:
        for i in gpus:
            f.set_value(i, "nvmlDeviceGetUtilizationRates", {"gpu": util, "memory": 0})
            f.set_gpm_levels(i, levels)

    def recover_() -> None:
        for i in gpus:
            f.set_value(i, "nvmlDeviceGetUtilizationRates", {"gpu": round(TRAINING_UTIL * 100), "memory": 38})
            f.set_gpm_levels(i, activity_levels(TRAINING_UTIL))
    f.at(job.STALL_AT_S, stall)
    if recover:
        f.at(job.RECOVER_AT_S, recover_)


def _job_spin(f: FakeBackend, p: Any) -> None:
    # NCCL's wait: a kernel always resident on a few SMs, so NVML's utilisation reads 100%.
    _job_window(f, range(len(f.devices)), NCCL_SPIN_LEVELS, 100)


def _job_idle(f: FakeBackend, p: Any) -> None:
    _job_window(f, range(len(f.devices)), activity_levels(0.0), 0)


def _job_xid79(f: FakeBackend, p: Any) -> None:
    gpu = min(job.CULPRIT_GPU, len(f.devices) - 1)
    f.queue_event(gpu, 79, at_s=job.STALL_AT_S - 0.01)
    f.lose(gpu, at_s=job.STALL_AT_S)
    _job_window(f, range(len(f.devices)), NCCL_SPIN_LEVELS, 100, recover=False)


def _job_thermal(f: FakeBackend, p: Any) -> None:
    gpu = min(job.CULPRIT_GPU, len(f.devices) - 1)

    def throttle() -> None:
        f.set_value(gpu, "nvmlDeviceGetCurrentClocksEventReasons", SW_THERMAL | HW_THERMAL)
        f.set_value(gpu, "nvmlDeviceGetClockInfo/1", 1200)
        f.set_gpm_levels(gpu, STRAGGLER_LEVELS)
    f.at(job.STALL_AT_S, throttle)


def _job_memory_bound(f: FakeBackend, p: Any) -> None:
    _job_window(f, range(len(f.devices)), MEMORY_BOUND_LEVELS, 100)


def _job_stuck_rank(f: FakeBackend, p: Any) -> None:
    gpu = min(job.CULPRIT_GPU, len(f.devices) - 1)
    _job_window(f, [i for i in range(len(f.devices)) if i != gpu], NCCL_SPIN_LEVELS, 100, recover=False)
    _job_window(f, [gpu], STUCK_LEVELS, 100, recover=False)


def _memory_used(f: FakeBackend, index: int, share: float) -> None:
    mem = dict(f.devices[index]["nvmlDeviceGetMemoryInfo"]["ok"])
    mem["used"] = int(mem["total"] * share)
    mem["free"] = mem["total"] - mem["used"]
    f.set_value(index, "nvmlDeviceGetMemoryInfo", mem)


def _job_requeue(f: FakeBackend, p: Any) -> None:
    # Released: the processes are gone (memory freed, no kernel); back: start-up holds the memory
    # with the GPUs idle; then training again.
    def release() -> None:
        for i in range(len(f.devices)):
            _memory_used(f, i, 0.0)

    def back() -> None:
        for i in range(len(f.devices)):
            _memory_used(f, i, 0.75)
    _job_window(f, range(len(f.devices)), activity_levels(0.0), 0)
    f.at(job.STALL_AT_S, release)
    f.at(job.STALL_AT_S + job.REQUEUE_GAP_S, back)


def _job_pipeline_stage(f: FakeBackend, p: Any) -> None:
    for i in range(len(f.devices)):
        tensor = TRAINING_LEVELS[nv.GPM_ANY_TENSOR_UTIL] * (0.6 + 0.15 * (i % 4))
        f.set_gpm_levels(i, {**activity_levels(TRAINING_UTIL), nv.GPM_ANY_TENSOR_UTIL: tensor})


def _job_slow(f: FakeBackend, p: Any) -> None:
    _job_window(f, range(len(f.devices)), activity_levels(TRAINING_UTIL / 2), round(TRAINING_UTIL * 50))


def _hang(f: FakeBackend, p: Any) -> None:
    f.hang(FAULTY_GPU, seconds=600.0, at_s=ONSET_S)


HANG_ONCE_S = 2.0  # gpu-nvml-hang-once: one stall, longer than the 1 s read deadline
HANG_RECOVER_S = 90.0  # gpu-nvml-hang-recover: past health.unresponsive_seconds (60 s), then answers


def _hang_once(f: FakeBackend, p: Any) -> None:
    f.hang(FAULTY_GPU, seconds=HANG_ONCE_S, at_s=ONSET_S)


def _hang_recover(f: FakeBackend, p: Any) -> None:
    f.hang(FAULTY_GPU, seconds=HANG_RECOVER_S, at_s=ONSET_S)


def _slow(f: FakeBackend, p: Any) -> None:
    f.slow_down(FAULTY_GPU, 0.05, at_s=ONSET_S)


def _xid(xid: int) -> Callable[[FakeBackend, Any], None]:
    def apply(f: FakeBackend, p: Any) -> None:
        f.queue_event(FAULTY_GPU, xid, at_s=ONSET_S)
    return apply


SCENARIOS: dict[str, tuple[str, Callable[[FakeBackend, Any], None]]] = {
    "gpu-lost": (f"GPU {FAULTY_GPU} falls off the bus after {ONSET_S:g}s: NVML XID 79 event, then every "
                 "call on it raises GPU_IS_LOST", _lost),
    "gpu-ecc-sbe-storm": (f"GPU {FAULTY_GPU}'s corrected ECC errors grow at an accelerating rate",
                          _sbe_storm),
    "gpu-ecc-sbe-step": (f"GPU {FAULTY_GPU} corrects 0.05 single-bit ECC errors/s, x10 from {SBE_STEP_S:g}s "
                         "on (a step that persists)", _sbe_step),
    "gpu-ecc-sbe-burst": (f"GPU {FAULTY_GPU} corrects 5 single-bit ECC errors/s for its first "
                          f"{SBE_BURST_S:g}s, then none (a new node's burst)", _sbe_burst),
    "gpu-ecc-volatile-reset": (f"GPU {FAULTY_GPU}'s volatile ECC counters start over after {ONSET_S:g}s "
                               "(a driver reload; the aggregate ones keep counting)", _volatile_reset),
    "gpu-ecc-dbe": (f"GPU {FAULTY_GPU} gets an uncorrected ECC error after {ONSET_S:g}s (XID 48 event, "
                    "a row remapped pending reset, recovery action reset)", _dbe),
    "gpu-row-remap-pending": (f"GPU {FAULTY_GPU} has an uncorrectable remapped row pending a reset "
                              "(XID 63 event)", _remap_pending),
    "gpu-row-remap-failure": (f"GPU {FAULTY_GPU}'s row remapping failed (XID 64 event)", _remap_failure),
    "gpu-thermal-slowdown": (f"GPU {FAULTY_GPU} runs above its slowdown temperature with HW/SW thermal "
                             "slowdown active and throttle time growing", _thermal),
    "gpu-pcie-degraded": (f"GPU {FAULTY_GPU}'s PCIe link trained down (x8, one generation lower) with "
                          "replays growing", _pcie),
    "gpu-nvlink-errors": (f"GPU {FAULTY_GPU}: NVLink 5 CRC flit and replay errors grow, NVLink 7 is down "
                          "(SXM profiles; XID 74 event)", _nvlink),
    "gpu-recovery-action-reboot": (f"GPU {FAULTY_GPU}'s NVML recovery action (field 230) is 2, node reboot "
                                   "(XID 154 event)", _recovery_reboot),
    "gpu-fabric-manager-down": ("the Fabric Manager is not running: every GPU's fabric registration stays in "
                            "progress (SXM Hopper profiles; CUDA would fail with error 802)",
                            _fabric_manager_down),
    "gpu-fabric-status-error": (f"GPU {FAULTY_GPU}'s fabric registration completed with an error status "
                            "(SXM Hopper profiles)", _fabric_status_error),
    "gpu-idle-allocation": ("every GPU is held by a job (three quarters of its memory used) but nearly idle: "
                            f"utilisation {IDLE_UTIL:.0%}, SM and tensor activity near 0", _idle_allocation),
    "gpu-gpm-in-use": (f"GPU {FAULTY_GPU}'s performance counters are held by a profiler (DCGM profiling, "
                       "Nsight): GPM samples fail with In Use", _gpm_in_use),
    "gpu-mig-mode": (f"GPU {FAULTY_GPU} is in MIG mode: no GPM activity for it", _mig_mode),
    "gpu-nvml-hang": (f"every NVML call on GPU {FAULTY_GPU} blocks for 600s from {ONSET_S:g}s (hangs for "
                      "good: verdict unknown, then reboot_required after health.unresponsive_seconds)",
                      _hang),
    "gpu-nvml-hang-once": (f"NVML calls on GPU {FAULTY_GPU} block for {HANG_ONCE_S:g}s once, from "
                           f"{ONSET_S:g}s, then answer (verdict unknown for a scrape, then healthy)",
                           _hang_once),
    "gpu-nvml-hang-recover": (f"NVML calls on GPU {FAULTY_GPU} block for {HANG_RECOVER_S:g}s from "
                              f"{ONSET_S:g}s, then answer (unknown, reboot_required, then healthy again)",
                              _hang_recover),
    "gpu-nvml-slow": (f"every NVML call on GPU {FAULTY_GPU} takes 50 ms longer from {ONSET_S:g}s", _slow),
    **{f"gpu-xid-event-{x}": (f"NVML delivers an XID {x} event for GPU {FAULTY_GPU} after {ONSET_S:g}s "
                              "(no kernel-log line)", _xid(x)) for x in XID_EVENTS},
}


# The GPU side of the training-job scenarios (registered by exporter/tools/simulate/job.py).
JOB_SCENARIOS: dict[str, Callable[[FakeBackend, Any], None]] = {
    "job-wait": _job_spin, "job-nccl-hang": _job_spin, "job-storage-stall": _job_idle,
    "job-checkpoint": _job_idle, "job-xid79": _job_xid79, "job-thermal-straggler": _job_thermal,
    "job-memory-bound": _job_memory_bound, "job-stuck-rank": _job_stuck_rank, "job-requeue": _job_requeue,
    "job-pipeline-stage": _job_pipeline_stage, "job-slow": _job_slow, "job-storage-latency": _job_idle,
}


def apply_scenarios(fake: FakeBackend, names: Sequence[str], profile: Any = None) -> None:
    """Script `fake` for each known scenario in `names` (others belong to other sources)."""
    for name in names:
        entry = SCENARIOS.get(name)
        if entry is not None:
            entry[1](fake, profile)
        elif name in JOB_SCENARIOS:
            JOB_SCENARIOS[name](fake, profile)
