#!/bin/bash
# Slurm Prolog (PrologFlags=Alloc recommended): record this job on its GPUs in the job mapping
# directory the exporter reads (deploy/slurm/job-mapping.sh; docs/deploy.md, "Workloads").
exec "$(dirname -- "${BASH_SOURCE[0]}")/job-mapping.sh" add
