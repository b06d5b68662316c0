"""The procfs tree of a job's processes (exporter.tools.simulate.nccl_ras.write_procfs), as the NCCL
collector's tests use it."""

from exporter.tools.simulate.nccl_ras import Proc, write_procfs

write = write_procfs
__all__ = ["Proc", "write"]
