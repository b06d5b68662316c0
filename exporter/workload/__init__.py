"""Which Slurm job or Kubernetes pod holds each GPU (issue 26)."""
