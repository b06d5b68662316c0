"""Synthesise a whole node's NVML capture from one real GPU's capture and an instance profile.

Every GPU starts as a copy of the captured H200 (same calls, same errors for what Hopper does
not support, same latencies) and then gets the profile's identity: model name, memory, power
limit and clocks of that part, distinct UUIDs and serials, the PCI bus ids of a real p5
(53:00 ... ca:00), and, on SXM parts, NVLink links that are up with zero error counters (the
capture has none: it came from a PCIe VM). Hopper SXM GPUs (behind NVSwitches) report a completed
fabric registration with success and no health mask, as H100 does (docs/fabric.md); other parts
answer Not Supported.

The node is training: every GPU busy (utilisation TRAINING_UTIL, three quarters of its memory
used) and, on Hopper and Blackwell, GPM activity that follows the utilisation (`activity_levels`).
Parts before Hopper answer GPM's support query with isSupportedDevice 0 and a sample with Not
Supported, as NVML does on an A100. The GPM latencies (gpm_us()) are those of a real H200's capture
(exporter/data/nvml_h200_gpm.json, docs/real-gpu.md).
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

from exporter.nvml import backend as nv
from exporter.nvml.backend import FABRIC_INFO, NVML_ERROR_NOT_SUPPORTED
from exporter.nvml.fake import DATA, new_uuid

MiB = 1024**2

# The eight GPU PCI buses of a p5.48xlarge (nvidia-smi on a real p5); used for every profile.
P5_BUSES = (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA)


def gpu_bus(index: int) -> int:
    """GPU `index`'s PCI bus: a p5's, then (a larger simulated shape) 0x18, 0x19, ..."""
    return P5_BUSES[index] if index < len(P5_BUSES) else 0x10 + index


# Per-model facts that differ from the captured H200 (public spec sheets / nvidia-smi on the part).
# memory: what NVML reports as total; power limit in mW; max SM and memory clocks in MHz;
# pci device id; architecture (nvmlDeviceArchitecture: 7 Ampere, 9 Hopper, 10 Blackwell).
MODELS: dict[str, dict[str, Any]] = {
    "NVIDIA H100 80GB HBM3": {"memory": 81559 * MiB, "power_mw": 700000, "sm_mhz": 1980, "mem_mhz": 2619,
                              "pci_device_id": 0x233010DE, "arch": 9, "cc": [9, 0], "pcie_gen": 5},
    "NVIDIA H200": {"memory": None, "power_mw": 700000, "sm_mhz": 1980, "mem_mhz": 3201,
                    "pci_device_id": None, "arch": 9, "cc": [9, 0], "pcie_gen": 5},
    "NVIDIA A100-SXM4-40GB": {"memory": 40960 * MiB, "power_mw": 400000, "sm_mhz": 1410, "mem_mhz": 1215,
                              "pci_device_id": 0x20B010DE, "arch": 7, "cc": [8, 0], "pcie_gen": 4},
    "NVIDIA A100-SXM4-80GB": {"memory": 81920 * MiB, "power_mw": 400000, "sm_mhz": 1410, "mem_mhz": 1593,
                              "pci_device_id": 0x20B210DE, "arch": 7, "cc": [8, 0], "pcie_gen": 4},
    "NVIDIA B200": {"memory": 183359 * MiB, "power_mw": 1000000, "sm_mhz": 1965, "mem_mhz": 3996,
                    "pci_device_id": 0x290110DE, "arch": 10, "cc": [10, 0], "pcie_gen": 5},
}

NVLINK_STATE_US = 10.0  # a guess: the capture has only the Not Supported path (6-25 us)
NVLINK_COUNTER_US = 6.0
NVLINK_COUNTERS = 5  # replay, recovery, crc flit, crc data, ecc data
FABRIC_US = 8.7  # the capture's v1 fabric call (it failed in the binding; the V call costs the same)


# GPM per-call latencies in microseconds, as a real H200 answered them (driver 580.159.04):
# nvmlGpmSampleGet reads the counters from the GPU; the metrics are computed on the CPU from two
# samples.
@functools.cache
def gpm_us() -> dict[str, float]:
    return {call: entry["us_median"] for call, entry in
            json.loads((DATA / "nvml_h200_gpm.json").read_text())["devices"][0].items()}
TRAINING_UTIL = 0.97  # a data-parallel training step keeps every GPU's kernels running
# GPM levels of a GPU running such a step, at TRAINING_UTIL: percent, or MiB/s for traffic
# (dense bf16 training on H100: SM ~90 %, tensor ~55 %, HBM ~45 %, all-reduce over NVLink).
TRAINING_LEVELS = {nv.GPM_SM_UTIL: 88.0, nv.GPM_SM_OCCUPANCY: 42.0, nv.GPM_ANY_TENSOR_UTIL: 55.0,
                   nv.GPM_DRAM_BW_UTIL: 47.0, nv.GPM_FP64_UTIL: 0.2, nv.GPM_FP32_UTIL: 9.0,
                   nv.GPM_FP16_UTIL: 4.0, nv.GPM_PCIE_TX_PER_SEC: 900.0, nv.GPM_PCIE_RX_PER_SEC: 1200.0,
                   nv.GPM_NVLINK_TOTAL_TX_PER_SEC: 95000.0, nv.GPM_NVLINK_TOTAL_RX_PER_SEC: 95000.0}


def activity_levels(util: float) -> dict[int, float]:
    """GPM levels of a GPU whose utilisation is `util` (0-1): the training levels, scaled."""
    return {mid: v * util / TRAINING_UTIL for mid, v in TRAINING_LEVELS.items()}


def gpm_metrics_entry(levels: dict[int, float]) -> dict[str, Any]:
    return _ok({str(mid): {"ret": 0, "value": round(v, 3)} for mid, v in levels.items()},
               gpm_us()["nvmlGpmMetricsGet"])


def _gpm_entries(supported: bool, util: float) -> dict[str, Any]:
    """A device's GPM entries as a capture records them."""
    if not supported:
        nope = {"error": "Not Supported", "code": NVML_ERROR_NOT_SUPPORTED}
        return {"nvmlGpmQueryDeviceSupport": _ok({"version": 1, "isSupportedDevice": 0},
                                                 gpm_us()["nvmlGpmQueryDeviceSupport"]),
                "nvmlGpmSampleGet": {**nope, "us_median": 1.0},
                "nvmlGpmMetricsGet": {**nope, "us_median": 1.0}}
    return {"nvmlGpmQueryDeviceSupport": _ok({"version": 1, "isSupportedDevice": 1},
                                             gpm_us()["nvmlGpmQueryDeviceSupport"]),
            "nvmlGpmSampleGet": _ok(None, gpm_us()["nvmlGpmSampleGet"]),
            "nvmlGpmMetricsGet": gpm_metrics_entry(activity_levels(util))}


def _ok(v: Any, us: float) -> dict[str, Any]:
    return {"ok": v, "us_median": us}


def fabric_entry(state: int, status: int = 0) -> dict[str, Any]:
    """A fabric info answer as the real backend returns it (no cluster, health not reported)."""
    return _ok({"api": "v3", "state": state, "status": status, "cliqueId": 0, "clusterUuid": "00" * 16,
                "healthMask": 0, "healthSummary": 0}, FABRIC_US)


def node_capture(profile: Any, capture: dict[str, Any]) -> dict[str, Any]:
    """A capture of `profile.gpus` GPUs derived from the first device of `capture`."""
    src = capture["devices"][0]
    model = MODELS.get(profile.gpu_model, {})
    out = {k: copy.deepcopy(v) for k, v in capture.items() if k != "devices"}
    out["system"] = copy.deepcopy(capture.get("system", {}))
    out["system"].setdefault("nvmlDeviceGetCount", {"us_median": 0.7})["ok"] = profile.gpus
    out["devices"] = []
    for i in range(profile.gpus):
        d = copy.deepcopy(src)
        d["index"] = i
        us = lambda k, d=d: d.get(k, {}).get("us_median", 2.0)  # noqa: E731
        d["nvmlDeviceGetName"] = _ok(profile.gpu_model, us("nvmlDeviceGetName"))
        d["nvmlDeviceGetUUID"] = _ok(new_uuid(f"{profile.instance_type}/{i}"), us("nvmlDeviceGetUUID"))
        serial = int(src.get("nvmlDeviceGetSerial", {}).get("ok") or "1653924043000")
        d["nvmlDeviceGetSerial"] = _ok(str(serial + 17 * (i + 1)), us("nvmlDeviceGetSerial"))
        d["nvmlDeviceGetMinorNumber"] = _ok(i, us("nvmlDeviceGetMinorNumber"))
        bus = gpu_bus(i)
        pci = dict(src.get("nvmlDeviceGetPciInfo", {}).get("ok") or {})
        pci.update(bus=bus, device=0, domain=0, busIdLegacy=f"0000:{bus:02X}:00.0")
        pci["busId"] = f"00000000:{bus:02X}:00.0"
        if model.get("pci_device_id"):
            pci["pciDeviceId"] = model["pci_device_id"]
        d["nvmlDeviceGetPciInfo"] = _ok(pci, us("nvmlDeviceGetPciInfo"))
        if model.get("memory"):
            mem = dict(d["nvmlDeviceGetMemoryInfo"]["ok"])
            mem["total"] = model["memory"]
            mem["free"] = mem["total"] - mem["used"]
            d["nvmlDeviceGetMemoryInfo"]["ok"] = mem
        if model:
            d["nvmlDeviceGetEnforcedPowerLimit"]["ok"] = model["power_mw"]
            d["nvmlDeviceGetMaxClockInfo/1"]["ok"] = model["sm_mhz"]
            d["nvmlDeviceGetMaxClockInfo/0"]["ok"] = model["sm_mhz"]
            d["nvmlDeviceGetMaxClockInfo/2"]["ok"] = model["mem_mhz"]
            d["nvmlDeviceGetClockInfo/2"]["ok"] = model["mem_mhz"]
            d["nvmlDeviceGetArchitecture"]["ok"] = model["arch"]
            d["nvmlDeviceGetCudaComputeCapability"]["ok"] = list(model["cc"])
            for k in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration"):
                d[k]["ok"] = model["pcie_gen"]
        # A little spread between GPUs, as on a real node (temperatures, power, energy).
        d["nvmlDeviceGetTemperature/0"]["ok"] += i % 3
        fv = d["field_values"]
        if "NVML_FI_DEV_MEMORY_TEMP" in fv:
            fv["NVML_FI_DEV_MEMORY_TEMP"]["value"] += (i + 1) % 3
        d["nvmlDeviceGetPowerUsage"]["ok"] += 1000 * i
        # Training: busy kernels, memory three quarters used, and (Hopper on) GPM activity to match.
        util = TRAINING_UTIL - 0.01 * (i % 3)
        d["nvmlDeviceGetUtilizationRates"]["ok"] = {"gpu": round(util * 100), "memory": 38 + i % 3}
        mem = dict(d["nvmlDeviceGetMemoryInfo"]["ok"])
        mem["used"] = mem["total"] * 3 // 4
        mem["free"] = mem["total"] - mem["used"]
        d["nvmlDeviceGetMemoryInfo"]["ok"] = mem
        d.update(_gpm_entries(model.get("arch", 9) >= 9, util))
        for link in range(64):
            d.pop(f"nvmlDeviceGetNvLinkState/{link}", None)
            for c in range(NVLINK_COUNTERS):
                d.pop(f"nvmlDeviceGetNvLinkErrorCounter/{link}/{c}", None)
        for link in range(profile.nvlinks):
            d[f"nvmlDeviceGetNvLinkState/{link}"] = _ok(1, NVLINK_STATE_US)
            for c in range(NVLINK_COUNTERS):
                d[f"nvmlDeviceGetNvLinkErrorCounter/{link}/{c}"] = _ok(0, NVLINK_COUNTER_US)
        if profile.nvlinks == 0:  # a PCIe part: what the capture says
            for link in range(18):
                d[f"nvmlDeviceGetNvLinkState/{link}"] = {"error": "Not Supported", "code": 3,
                                                         "us_median": 25.0}
        if profile.nvlinks and model.get("arch", 0) >= 9:
            d[FABRIC_INFO] = fabric_entry(3)
        else:
            d[FABRIC_INFO] = {"error": "Not Supported", "code": NVML_ERROR_NOT_SUPPORTED,
                              "us_median": FABRIC_US}
        out["devices"].append(d)
    return out
