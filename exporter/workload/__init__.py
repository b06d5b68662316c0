"""Which Slurm job or Kubernetes pod holds each GPU (issue 26).

- model: Workload and WorkloadReading, the contract with fault attribution;
- source: WorkloadSource (the configured kinds under one deadline; `read(gpus)` from any thread,
  `latest`), the interface fault attribution calls; see its docstring;
- one reader per kind, parsers pure: slurm_mapping (the job mapping directory), slurm_cgroup
  (NVML's processes and their cgroups), kubelet (pod-resources v1 over gRPC, podresources/);
- the collector: exporter.collectors.workload (gpu_workload_info)."""
