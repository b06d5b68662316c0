"""gpu-health-exporter: one small per-node agent for GPU, XID, EFA and FSx for Lustre health."""

__version__ = "0.1.0"
