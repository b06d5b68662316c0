"""What a user coming from dcgm-exporter looks for: each DCGM field an SRE alerts or graphs on,
and this exporter's series for it (or that it is not exported), and the label sets that overlap so a
plain sum() counts twice. docs/metrics.md renders both (exporter.tools.docs); tests/test_docs.py checks that
every metric named here is in the catalog, so a rename cannot leave the table behind."""

from __future__ import annotations

INTRO = (
    "What an SRE alerts or graphs on in dcgm-exporter's default counters, and the series here that "
    'answers the same question. Units differ: this exporter uses base units (bytes, hertz, joules, '
    'seconds, ratios 0-1) where DCGM uses MiB, MHz, mJ, microseconds and percent. Labels: every GPU series '
    'carries `gpu` (NVML index), `uuid` (DCGM: `UUID`) and `pci_bus_id`; the model, serial and VBIOS are in '
    '`gpu_info` (join with `* on (instance, gpu) group_left (model) gpu_info`), not on every series.'
)

NOT_EXPORTED = "not exported: keep dcgm-exporter for it"

# (DCGM field(s), this exporter's series, note)
FIELDS: tuple[tuple[str, str, str], ...] = (
    ('`DCGM_FI_DEV_XID_ERRORS`',
     '`gpu_xid_errors_total{xid, tier}`, `gpu_xid_last_seen_timestamp_seconds`',
     ("DCGM exports the last XID's number as a gauge, so two XIDs in one scrape interval show "
      'one; here every event is counted per XID since boot (kernel log and NVML events), with its'
      ' action tier. Alert on `increase(gpu_xid_errors_total[..])` or the shipped XID rules.')),
    ('`DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`',
     '`gpu_ecc_errors_total{error_type="corrected", counter="volatile"}`',
     'since the driver loaded'),
    ('`DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`',
     '`gpu_ecc_errors_total{error_type="uncorrected", counter="volatile"}`',
     ''),
    ('`DCGM_FI_DEV_ECC_SBE_AGG_TOTAL`',
     '`gpu_ecc_errors_total{error_type="corrected", counter="aggregate"}`',
     'lifetime (InfoROM)'),
    ('`DCGM_FI_DEV_ECC_DBE_AGG_TOTAL`',
     '`gpu_ecc_errors_total{error_type="uncorrected", counter="aggregate"}`',
     ''),
    ('`DCGM_FI_DEV_RETIRED_SBE`, `DCGM_FI_DEV_RETIRED_DBE`, `DCGM_FI_DEV_RETIRED_PENDING`',
     '`gpu_retired_pages_total{cause}`, `gpu_retired_pages_pending`',
     'pre-Ampere GPUs only'),
    ('`DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS`, `DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`',
     '`gpu_remapped_rows_total{cause="correctable"|"uncorrectable"}`',
     ''),
    ('`DCGM_FI_DEV_ROW_REMAP_PENDING`',
     '`gpu_row_remap_pending`',
     ''),
    ('`DCGM_FI_DEV_ROW_REMAP_FAILURE`',
     '`gpu_row_remap_failure`',
     ''),
    ('`DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`',
     '`gpu_nvlink_errors_total{type="crc_flit", link="all"}`',
     'per link with `gpu.detail: [nvlink_per_link]`'),
    ('`DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL`',
     '`gpu_nvlink_errors_total{type="crc_data", link="all"}`',
     ''),
    ('`DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL`',
     '`gpu_nvlink_errors_total{type="replay", link="all"}`',
     ''),
    ('`DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL`',
     '`gpu_nvlink_errors_total{type="recovery", link="all"}`',
     ''),
    ('`DCGM_FI_DEV_POWER_USAGE`',
     '`gpu_power_watts`',
     ''),
    ('`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`',
     '`gpu_energy_joules_total`',
     'joules, not millijoules'),
    ('`DCGM_FI_DEV_POWER_MGMT_LIMIT`',
     '`gpu_power_limit_watts`',
     'the enforced limit'),
    ('`DCGM_FI_DEV_GPU_TEMP`',
     '`gpu_temperature_celsius{sensor="gpu"}`',
     ''),
    ('`DCGM_FI_DEV_MEMORY_TEMP`',
     '`gpu_temperature_celsius{sensor="memory"}`',
     ''),
    ('`DCGM_FI_DEV_SLOWDOWN_TEMP`',
     '`gpu_temperature_threshold_celsius{threshold="slowdown"}`',
     'and `gpu_temperature_slowdown_margin_celsius`'),
    ('`DCGM_FI_DEV_SM_CLOCK`, `DCGM_FI_DEV_MEM_CLOCK`',
     '`gpu_clock_hertz{clock="sm"|"memory"}`',
     'hertz, not MHz'),
    ('`DCGM_FI_DEV_CLOCK_THROTTLE_REASONS` (`DCGM_FI_DEV_CLOCKS_EVENT_REASONS`)',
     '`gpu_clock_event_active{reason}`',
     ('one series per reason instead of a bit mask; idle, sync_boost and sw_power_cap with '
      '`gpu.detail: [routine_clock_events]`')),
    ('`DCGM_FI_DEV_THERMAL_VIOLATION`, `DCGM_FI_DEV_POWER_VIOLATION`',
     '`gpu_throttle_seconds_total{reason="thermal"|"sw_power_cap"}`',
     'seconds, with `gpu.detail: [throttle_time]`'),
    ('`DCGM_FI_DEV_GPU_UTIL`',
     '`gpu_utilization_ratio{resource="gpu"}`',
     '0-1, not percent'),
    ('`DCGM_FI_DEV_MEM_COPY_UTIL`',
     '`gpu_utilization_ratio{resource="memory"}`',
     '0-1'),
    ('`DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE`, `DCGM_FI_DEV_FB_TOTAL`',
     '`gpu_memory_used_bytes`, `gpu_memory_total_bytes`',
     'bytes, not MiB; free = total - used'),
    ('`DCGM_FI_DEV_PCIE_REPLAY_COUNTER`',
     '`gpu_pcie_replays_total`',
     ''),
    ('`DCGM_FI_DEV_PCIE_LINK_GEN`, `DCGM_FI_DEV_PCIE_LINK_WIDTH`',
     ('`gpu_pcie_link_generation`, `gpu_pcie_link_width`, `gpu_pcie_link_generation_max`, '
      '`gpu_pcie_link_width_max`'),
     ''),
    ('`DCGM_FI_DEV_PSTATE`',
     '`gpu_performance_state`',
     ''),
    ('`DCGM_FI_DRIVER_VERSION` (label)',
     '`gpu_driver_info{driver_version, nvml_version, cuda_driver_version}`',
     ''),
    ('`DCGM_FI_PROF_SM_ACTIVE`',
     '`gpu_sm_active_seconds_total`',
     ('a counter of seconds from NVML GPM (Hopper and newer, no DCGM): the ratio is '
      '`rate(gpu_sm_active_seconds_total[5m])` (0-1, as DCGM), recorded as `gpu:gpu_sm_active:ratio5m`; '
      'where `gpu_activity_measured` is 0 (A100, MIG mode, a profiler holding the counters) there is no '
      'series')),
    ('`DCGM_FI_PROF_SM_OCCUPANCY`',
     '`gpu_sm_occupancy_seconds_total`',
     '`rate(gpu_sm_occupancy_seconds_total[5m])`'),
    ('`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`',
     '`gpu_tensor_active_seconds_total`',
     '`rate(gpu_tensor_active_seconds_total[5m])`, recorded as `gpu:gpu_tensor_active:ratio5m`'),
    ('`DCGM_FI_PROF_DRAM_ACTIVE`',
     '`gpu_dram_active_seconds_total`',
     '`rate(gpu_dram_active_seconds_total[5m])`'),
    ('`DCGM_FI_PROF_PIPE_FP64_ACTIVE`, `DCGM_FI_PROF_PIPE_FP32_ACTIVE`, `DCGM_FI_PROF_PIPE_FP16_ACTIVE`',
     '`gpu_pipe_active_seconds_total{pipe="fp64"|"fp32"|"fp16"}`',
     '`rate(...[5m])`, with `gpu.detail: [activity_pipes]`'),
    ('`DCGM_FI_PROF_NVLINK_TX_BYTES`, `DCGM_FI_PROF_NVLINK_RX_BYTES`',
     '`gpu_nvlink_bytes_total{direction="tx"|"rx"}`',
     ('bytes per second: `rate(gpu_nvlink_bytes_total[5m])` (DCGM: bytes per second over its sampling '
      'interval); with `gpu.detail: [activity_traffic]`')),
    ('`DCGM_FI_PROF_PCIE_TX_BYTES`, `DCGM_FI_PROF_PCIE_RX_BYTES`',
     '`gpu_pcie_bytes_total{direction="tx"|"rx"}`',
     '`rate(gpu_pcie_bytes_total[5m])`; with `gpu.detail: [activity_traffic]`'),
    (('`DCGM_FI_PROF_GR_ENGINE_ACTIVE`, `DCGM_FI_PROF_PIPE_INT_ACTIVE`, the per-precision tensor pipes '
      '(`DCGM_FI_PROF_PIPE_TENSOR_HMMA/IMMA/DFMA_ACTIVE`), the profiling fields on A100 and per MIG '
      'instance'),
     NOT_EXPORTED,
     ('the activity above is whole-GPU and Hopper-and-newer only (NVML GPM); A100 has no GPM, and '
      'per-MIG-instance samples (nvmlGpmMigSampleGet) are not read. Never run both on one GPU: DCGM\'s '
      'profiling module holds the counters and this exporter then reports `gpu_activity_measured{reason='
      '"counters_in_use"} 0`')),
    (('`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`, `DCGM_FI_DEV_PCIE_TX_THROUGHPUT`, '
      '`DCGM_FI_DEV_PCIE_RX_THROUGHPUT`'),
     NOT_EXPORTED,
     'throughput, not health (the GPM bytes above answer the same question on Hopper)'),
    ('`DCGM_FI_DEV_ENC_UTIL`, `DCGM_FI_DEV_DEC_UTIL`, `DCGM_FI_DEV_VGPU_*`',
     NOT_EXPORTED,
     ''),
)

ONLY_HERE = (
    'Only here (no DCGM field): the per-GPU and node verdict (`gpu_health_verdict`, '
    '`gpu_node_health_verdict` and their reasons), `gpu_lost`, `gpu_recovery_action`, '
    '`gpu_row_remapper_banks`, `gpu_activity_measured` (whether and why not a GPU\'s activity is '
    'measured), NVSwitch SXids, fabric registration, EFA devices and FSx for Lustre clients. '
)

PITFALLS: tuple[str, ...] = (
    (
        '**ECC**: `gpu_ecc_errors_total{counter="aggregate"}` already contains the `counter="volatile"` '
        'errors of the current driver load (aggregate is lifetime, volatile since the driver loaded). '
        'Select one: `sum by (instance, gpu) (gpu_ecc_errors_total{error_type="corrected", '
        'counter="volatile"})`, never `sum by (instance, gpu) '
        '(gpu_ecc_errors_total{error_type="corrected"})`. '
    ),
    (
        '**Throttle time**: `gpu_throttle_seconds_total{reason="thermal"}` is the time any thermal policy '
        'held the clocks, which includes `reason="sw_thermal"` and `reason="hw_thermal"`, and reasons can '
        'be active at the same time. Sum one reason over GPUs, never several reasons of one GPU. '
    ),
    (
        '**NVLink**: without `nvlink_per_link` the series carry `link="all"`, the sum over links; with it '
        'they are per link and there is no `all` series: do not add the two kinds of scrape together. '
    ),
    (
        '**Verdicts**: `gpu_health_verdict` has one series per verdict with value 1 for the current one; '
        'count GPUs with `sum by (verdict) (gpu_health_verdict == 1)`-style selections, not a sum over '
        'verdicts. '
    ),
)
