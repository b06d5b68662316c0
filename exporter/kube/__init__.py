"""The verdict on the exporter's own Kubernetes Node: the `GpuHealthy` condition and the opt-in
taint and HyperPod label (docs/deploy.md, "The GpuHealthy node condition")."""
