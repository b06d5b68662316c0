"""The GPU collector's metrics (names agreed in the metric-names contract)."""

from __future__ import annotations

from exporter.catalog import MetricSpec, define

G = ("gpu", "uuid", "pci_bus_id")
SLOW = ("Read in the background every gpu.slow_interval_seconds (default 15 s) because NVML takes "
        "{cost} per GPU for it, and served from the last reading.")


def _d(name: str, type_: str, help_: str, labels: tuple[str, ...] = G, unit: str = "",
       detail: str = "default") -> MetricSpec:
    return define(name, type_, help_, labels, unit=unit, collector="gpu", detail=detail)


INFO = _d("gpu_info", "gauge", "Always 1; the GPU's model, serial, VBIOS and board part number.",
          (*G, "model", "serial", "vbios_version", "board_part_number"))
DRIVER_INFO = _d("gpu_driver_info", "gauge", "Always 1; the NVIDIA driver, NVML and CUDA driver versions.",
                 ("driver_version", "nvml_version", "cuda_driver_version"))
COUNT = _d("gpu_devices", "gauge", "GPUs NVML enumerates on this node.", ())
EXPECTED = _d("gpu_devices_expected", "gauge",
              "GPUs this node should have: node.expected_gpus, else the instance type's (absent if unknown).",
              ())
LOST = _d("gpu_lost", "gauge",
          "1 if NVML reports the GPU as lost (NVML_ERROR_GPU_IS_LOST, the XID 79 state: fell off the bus), "
          "else 0. Not transient: the GPU needs a reset or the node a reboot.")
READ_SUCCESS = _d("gpu_read_success", "gauge",
                  "1 if this scrape's health-critical NVML reads of the GPU succeeded within "
                  "gpu.read_timeout_seconds, else 0 (lost, hung, or an NVML error). Not Supported is "
                  "not a failure.")
ECC_MODE = _d("gpu_ecc_mode_enabled", "gauge",
              "1 if ECC is enabled (current mode), else 0. " + SLOW.format(cost="0.15 ms"))
ECC_ERRORS = _d("gpu_ecc_errors_total", "counter",
                "ECC errors: corrected (single-bit) and uncorrected (double-bit); volatile since the "
                "driver loaded, aggregate over the GPU's life.", (*G, "error_type", "counter"))
REMAPPED_ROWS = _d("gpu_remapped_rows_total", "counter",
                   "Rows remapped because of correctable or uncorrectable memory errors (InfoROM "
                   "entries).", (*G, "cause"))
REMAP_PENDING = _d("gpu_row_remap_pending", "gauge",
                   "1 if a row remap waits for a GPU reset or reboot, else 0.")
REMAP_FAILURE = _d("gpu_row_remap_failure", "gauge",
                   "1 if a row remap failed (no spare row left: RMA candidate), else 0.")
REMAPPER_BANKS = _d("gpu_row_remapper_banks", "gauge",
                    "Memory banks by spare rows left (row-remapper histogram).", (*G, "spare_rows"))
RETIRED_PAGES = _d("gpu_retired_pages_total", "counter",
                   "Pages retired for single-bit (multiple) or double-bit ECC errors; only on GPUs "
                   "with page retirement (pre-Ampere).", (*G, "cause"))
RETIRED_PENDING = _d("gpu_retired_pages_pending", "gauge",
                     "1 if a page retirement waits for a reboot, else 0 (pre-Ampere GPUs).")
RECOVERY_ACTION = _d("gpu_recovery_action", "gauge",
                     "NVML recovery action (field 230): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, "
                     "4 drain and reset, 5 recover IMEX domain (driver R570+).")
TEMPERATURE = _d("gpu_temperature_celsius", "gauge", "GPU die and HBM memory temperature.",
                 (*G, "sensor"), unit="celsius")
THRESHOLD = _d("gpu_temperature_threshold_celsius", "gauge",
               "Temperature thresholds (read once): shutdown, slowdown, memory_max and gpu_max "
               "(max operating).", (*G, "threshold"), unit="celsius",
               detail="default: slowdown, memory_max; the others: `gpu.detail`: limits")
SLOWDOWN_MARGIN = _d("gpu_temperature_slowdown_margin_celsius", "gauge",
                     "Slowdown threshold minus GPU temperature: how far the GPU is from HW slowdown.",
                     unit="celsius")
CLOCK_EVENT = _d("gpu_clock_event_active", "gauge",
                 "1 if the clock event (throttle) reason is active now, else 0; only reasons the GPU "
                 "supports.", (*G, "reason"),
                 detail="default (idle, sync_boost, sw_power_cap: `gpu.detail`: routine_clock_events)")
THROTTLE = _d("gpu_throttle_seconds_total", "counter",
              "Time clocks were held back for the reason (thermal = any thermal policy). "
              + SLOW.format(cost="0.65 ms per reason"), (*G, "reason"), unit="seconds",
              detail="`gpu.detail`: throttle_time")
POWER = _d("gpu_power_watts", "gauge", "Power draw (NVML power usage).", unit="watts")
POWER_LIMIT = _d("gpu_power_limit_watts", "gauge", "Enforced power limit.", unit="watts")
ENERGY = _d("gpu_energy_joules_total", "counter",
            "Energy used since the driver loaded. " + SLOW.format(cost="3 ms"), unit="joules")
UTILIZATION = _d("gpu_utilization_ratio", "gauge",
                 "Fraction of the last sample period the GPU (kernels) or memory (reads/writes) was busy.",
                 (*G, "resource"), unit="ratio")
MEMORY_USED = _d("gpu_memory_used_bytes", "gauge", "Frame buffer memory used.", unit="bytes")
MEMORY_TOTAL = _d("gpu_memory_total_bytes", "gauge", "Frame buffer memory total.", unit="bytes")
CLOCK = _d("gpu_clock_hertz", "gauge", "Current SM and memory clock.", (*G, "clock"), unit="hertz")
CLOCK_MAX = _d("gpu_clock_max_hertz", "gauge", "Maximum SM and memory clock (read once).", (*G, "clock"),
               unit="hertz", detail="`gpu.detail`: limits")
PSTATE = _d("gpu_performance_state", "gauge", "Performance state: 0 (P0, maximum) to 15 (P15, minimum).")
PCIE_REPLAYS = _d("gpu_pcie_replays_total", "counter",
                  "PCIe replays (link-level retransmissions). " + SLOW.format(cost="0.18 ms"))
PCIE_GEN = _d("gpu_pcie_link_generation", "gauge", "Current PCIe link generation (can drop at idle).")
PCIE_GEN_MAX = _d("gpu_pcie_link_generation_max", "gauge", "Maximum PCIe link generation of the GPU and "
                  "system (read once).")
PCIE_WIDTH = _d("gpu_pcie_link_width", "gauge", "Current PCIe link width (lanes); below the maximum is a "
                "degraded link.")
PCIE_WIDTH_MAX = _d("gpu_pcie_link_width_max", "gauge", "Maximum PCIe link width (read once).")
PCIE_ERRORS = _d("gpu_pcie_errors_total", "counter",
                 "PCIe error counters NVML exposes as fields, by type. "
                 + SLOW.format(cost="up to 0.2 ms"), (*G, "type"), detail="`gpu.detail`: pcie_errors")
NVLINK_UP = _d("gpu_nvlink_up", "gauge",
               "1 if the NVLink link is active, else 0, per link (gpu.detail: nvlink_per_link); by default "
               "link=\"all\": 1 if every link of the GPU is active, 0 if any is not. Only GPUs with NVLink. "
               + SLOW.format(cost="about 0.1 ms per link"), (*G, "link"),
               detail="default per GPU; per link: `gpu.detail`: nvlink_per_link")
NVLINK_ERRORS = _d("gpu_nvlink_errors_total", "counter",
                   "NVLink data-link errors by type (CRC flit, CRC data, replay, recovery), summed over "
                   "the GPU's links with link=\"all\", or per link (gpu.detail: nvlink_per_link); only "
                   "GPUs with NVLink. " + SLOW.format(cost="about 0.4 ms per link"), (*G, "link", "type"),
                   detail="default per GPU; per link: `gpu.detail`: nvlink_per_link")

FABRIC_STATE = _d("gpu_fabric_state", "gauge",
                  "Always 1, one series per GPU: its NVLink fabric registration state with the Fabric "
                  "Manager (not_started, in_progress, completed). Absent where the GPU has no fabric support "
                  "(Not Supported: PCIe parts, a single passthrough GPU). Until completed, CUDA fails "
                  "to start on the GPU (error 802).", (*G, "state"))
FABRIC_STATUS = _d("gpu_fabric_status", "gauge",
                   "The NVML return code of the GPU's fabric registration once its state is completed: "
                   "0 success, anything else a failed registration. Absent before completion.")
FABRIC_INFO = _d("gpu_fabric_info", "gauge",
                 "Always 1; the GPU's NVLink fabric clique id and cluster UUID, where the driver reports one "
                 "(multi-node NVLink). Absent when both are zero (Hopper) or the GPU has no fabric support.",
                 (*G, "clique_id", "cluster_uuid"))
FABRIC_HEALTH = _d("gpu_fabric_health_problem", "gauge",
                   "1 if the fabric health mask reports the problem (degraded_bandwidth, route_recovery, "
                   "route_unhealthy, access_timeout_recovery, incorrect_configuration), 0 if it reports it "
                   "absent. Only problems the driver reports (newer drivers, multi-node NVLink) appear.",
                   (*G, "problem"))

# Activity from NVML's GPU Performance Monitoring (GPM; Hopper and newer), exporter/gpu/gpm.py.
ACTIVITY = ("Counted from NVML GPU Performance Monitoring samples taken at each collection (Hopper and "
            "newer; absent where gpu_activity_measured is 0): the interval's average times its length, so "
            "rate() over any window is the {what} as a ratio 0-1 ({dcgm}).")
SM_ACTIVE = _d("gpu_sm_active_seconds_total", "counter",
               "Seconds of SM activity: the fraction of the GPU's SMs with at least one warp resident, "
               "times time. " + ACTIVITY.format(what="SM activity", dcgm="DCGM_FI_PROF_SM_ACTIVE"),
               unit="seconds")
SM_OCCUPANCY = _d("gpu_sm_occupancy_seconds_total", "counter",
                  "Occupancy-weighted seconds: resident warps against the SMs' maximum, times time. "
                  + ACTIVITY.format(what="SM occupancy", dcgm="DCGM_FI_PROF_SM_OCCUPANCY"), unit="seconds")
TENSOR_ACTIVE = _d("gpu_tensor_active_seconds_total", "counter",
                   "Seconds the tensor (matrix) pipes were active, any precision. "
                   + ACTIVITY.format(what="tensor pipe activity", dcgm="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
                   unit="seconds")
DRAM_ACTIVE = _d("gpu_dram_active_seconds_total", "counter",
                 "Seconds of device memory (HBM) bandwidth use: the fraction of peak bandwidth used, "
                 "times time. "
                 + ACTIVITY.format(what="memory bandwidth use", dcgm="DCGM_FI_PROF_DRAM_ACTIVE"),
                 unit="seconds")
PIPE_ACTIVE = _d("gpu_pipe_active_seconds_total", "counter",
                 "Seconds the non-tensor FP64, FP32 or FP16 pipes were active. "
                 + ACTIVITY.format(what="pipe's activity", dcgm="DCGM_FI_PROF_PIPE_FP64/FP32/FP16_ACTIVE"),
                 (*G, "pipe"), unit="seconds", detail="`gpu.detail`: activity_pipes")
NVLINK_BYTES = _d("gpu_nvlink_bytes_total", "counter",
                  "Bytes sent (tx) and received (rx) over all the GPU's NVLinks, from GPM's NVLink "
                  "throughput averaged over each collection interval (DCGM_FI_PROF_NVLINK_TX/RX_BYTES).",
                  (*G, "direction"), unit="bytes", detail="`gpu.detail`: activity_traffic")
PCIE_BYTES = _d("gpu_pcie_bytes_total", "counter",
                "Bytes the GPU sent (tx) and received (rx) over PCIe, from GPM's PCIe throughput averaged "
                "over each collection interval (DCGM_FI_PROF_PCIE_TX/RX_BYTES).",
                (*G, "direction"), unit="bytes", detail="`gpu.detail`: activity_traffic")
ACTIVITY_MEASURED = _d("gpu_activity_measured", "gauge",
                       "1 if the GPU's activity (gpu_sm_active_seconds_total and the other GPM counters) is "
                       "measured, else 0 with why: gpu_not_supported (no GPM: before Hopper, e.g. A100), "
                       "driver_too_old (no GPM functions in the driver or nvidia-ml-py), mig_mode, "
                       "counters_in_use (held by DCGM's profiling module or Nsight), no_permission, "
                       "sample_failed (this collection's sample failed; the next one covers the gap). One "
                       "series per GPU: its current reason (measured when 1).", (*G, "reason"))
