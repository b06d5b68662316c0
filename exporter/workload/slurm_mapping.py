"""The Slurm job mapping directory, in dcgm-exporter's format (`--hpc-job-mapping-dir`), as AWS's
HyperPod lifecycle scripts and deploy/slurm/prolog.sh write it: one file per GPU, named by the
GPU's index (`2`) or by its index and a MIG instance (`2.1`), holding the ids of the jobs on it,
one a line. A MIG instance's jobs are the jobs of its GPU (the series are per GPU).

The index is NVML's (dcgm-exporter's GPU id; Slurm's own with `AutoDetect=nvml` or a gres.conf
listing /dev/nvidia0.. in NVML order). Other names in the directory (the prolog's temporary
and lock files, anything else) are not GPU files and are ignored.

A missing directory means no job: /run is emptied at boot and the first prolog creates it.

`parse_*` are pure; `read_dir` does the I/O."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from exporter.nvml.session import DeviceIdentity
from exporter.workload.model import Workload

NAME = re.compile(r"([0-9]{1,4})(?:\.([0-9]{1,4}))?")  # as dcgm-exporter: ^\d+(\.\d+)?$
JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?")  # 123, array 123_4, het 123+1
MAX_FILE_BYTES = 64 * 1024  # a file names a few jobs; a larger one is not a mapping file
MAX_FILES = 4096


class MappingError(Exception):
    """A file of the directory that cannot be used (named in the message)."""


def parse_name(name: str) -> int | None:
    """The GPU index a file name stands for (`2`, `2.1`), else None (not a GPU file)."""
    m = NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def parse_jobs(text: str, where: str) -> list[str]:
    """The job ids of a file's text, one a line (blank lines skipped); MappingError on a line
    that is not a Slurm job id."""
    jobs = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not JOB_ID.fullmatch(line):
            raise MappingError(f"{where} line {n}: {line[:40]!r} is not a Slurm job id")
        jobs.append(line)
    return jobs


@dataclass
class DirReading:
    """Jobs per GPU index (every file's jobs), and the files that could not be used."""

    jobs: dict[int, set[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    bad_indexes: set[int] = field(default_factory=set)


def read_dir(path: str) -> DirReading:
    """Read the mapping directory. Raises OSError when it exists but cannot be listed."""
    out = DirReading()
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return out
    for name in sorted(names)[:MAX_FILES]:
        index = parse_name(name)
        if index is None:
            continue
        where = os.path.join(path, name)
        try:
            data = _read(where)
            if len(data) > MAX_FILE_BYTES:
                raise MappingError(f"{where}: over {MAX_FILE_BYTES} bytes")
            jobs = parse_jobs(data.decode("utf-8", "replace"), where)
        except FileNotFoundError:
            continue  # an epilog removed it between the listing and the read
        except (OSError, MappingError) as e:
            out.problems.append(str(e) if isinstance(e, MappingError) else f"{where}: {e.strerror or e}")
            out.bad_indexes.add(index)
            continue
        out.jobs.setdefault(index, set()).update(jobs)
    return out


def _read(path: str) -> bytes:
    """Up to MAX_FILE_BYTES + 1 bytes (one read: the files are a few bytes); os.open, not open():
    no buffered file object for a file read once, and O_NONBLOCK so a FIFO put there cannot block."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)


def by_uuid(reading: DirReading,
            gpus: Sequence[DeviceIdentity]) -> tuple[dict[str, tuple[Workload, ...]], list[str]]:
    """The directory's jobs per GPU UUID: every GPU of `gpus` whose file (if any) was usable is
    observed; a file of an index NVML does not have is a problem."""
    known = {g.index for g in gpus}
    problems = list(reading.problems)
    for index in sorted(set(reading.jobs) - known):
        problems.append(f"mapping file for GPU {index}, which NVML does not list")
    out = {g.uuid: tuple(Workload(hpc_job=j) for j in sorted(reading.jobs.get(g.index, ())))
           for g in gpus if g.uuid and g.index not in reading.bad_indexes}
    return out, problems
