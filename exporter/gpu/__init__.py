"""GPU health from NVML: the metrics and the per-GPU reader behind the gpu collector."""
