"""The Slurm job mapping directory, in dcgm-exporter's format (`--hpc-job-mapping-dir`), as AWS's
HyperPod lifecycle scripts and deploy/slurm/job-mapping.sh write it: one file per GPU holding the
ids of the jobs on it, one a line. docs/xid.md, "The job mapping directory", lists every producer.

File names:
- the GPU's NVML index (`2`), or its index and a MIG instance (`2.1`): dcgm-exporter's names; a
  MIG instance's jobs are the jobs of its GPU (the series are per GPU);
- the GPU's UUID (`GPU-<uuid>`) or a MIG device's (`MIG-<uuid>`, resolved to its GPU through
  NVML): what a prolog writes from a CUDA_VISIBLE_DEVICES of UUIDs (Slurm 25.11), and
  job-mapping.sh with GPU_HEALTH_JOB_MAPPING_NAMES=uuid. Both forms of one GPU add up.
Other names (the prolog's temporary `.N.XXXXXX` files, its lock, anything else) are not GPU
files: they are filtered out before any limit is applied, so no number of them hides a GPU file.

Lines: dcgm-exporter takes each line as free text, so any printable single-line id of at most
MAX_JOB_ID_CHARS characters is a job id (Slurm's `123`, `123_4`, `123+1`; PBS's `1234.pbs01`;
dcgm-exporter's own fixtures' `job1-0`); an id of another shape than Slurm's is logged once. A line
that is not one (too long, a control character, not UTF-8) is dropped and reported with its line
number, never its text; the file's other ids stand. A file whose every id line was dropped
leaves its GPU unobserved (unknown), never idle.

Bounds, all before allocation: MAX_ENTRIES directory entries looked at, MAX_GPU_FILES GPU files
and MAX_TOTAL_BYTES bytes read per reading, MAX_FILE_BYTES per file, MAX_JOBS_PER_FILE ids per
file. Reaching one is a problem of the reading, and the GPUs it left unread are unobserved.

A file that is not a regular file (a symbolic link, FIFO, device, directory) is a problem naming
the file and what it is; it is never opened, so nothing of what it points at reaches a log. Its
GPU is unobserved.

`parse_*` are pure; `read_dir` does the I/O."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.nvml.session import DeviceIdentity
from exporter.regular_file import NotRegularFile, file_kind
from exporter.workload.model import Workload

INDEX_NAME = re.compile(r"([0-9]{1,4})(?:\.([0-9]{1,4}))?")  # as dcgm-exporter: ^\d+(\.\d+)?$
UUID_NAME = re.compile(r"(?:GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{6,62}[0-9A-Fa-f]")
SLURM_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?")  # 123, array 123_4, het 123+1
MAX_JOB_ID_CHARS = 128  # Slurm's ids are at most ~20; PBS's `seq.server` a few dozen
MAX_JOBS_PER_FILE = 64  # a GPU shared by more jobs than this (sharding) keeps the first 64
MAX_FILE_BYTES = 16 * 1024  # MAX_JOBS_PER_FILE ids of the longest length fit in half of it
MAX_GPU_FILES = 512  # 64 GPUs with 7 MIG instances each, and their UUID-named files
MAX_TOTAL_BYTES = 1 << 20  # read per reading
MAX_ENTRIES = 65536  # directory entries looked at per reading (leftover temporary files included)
MAX_PROBLEMS = 16  # problems named per reading (the rest counted): one log line, one landing-page entry


class MappingError(Exception):
    """A file of the directory that cannot be used (named in the message)."""


def parse_name(name: str) -> int | str | None:
    """What GPU a file name stands for: an NVML index (`2`, `2.1`) as an int, a UUID (`GPU-...`,
    `MIG-...`) as a str; None: not a GPU file."""
    m = INDEX_NAME.fullmatch(name)
    if m:
        return int(m.group(1))
    if UUID_NAME.fullmatch(name):
        return name
    return None


@dataclass
class FileJobs:
    """A file's job ids (at most MAX_JOBS_PER_FILE), its dropped lines' numbers, the ids of a
    shape other than Slurm's, and how many ids were beyond the limit."""

    jobs: list[str] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)
    odd: list[str] = field(default_factory=list)
    over: int = 0


def job_id(line: str) -> str | None:
    """The job id a line holds (surrounding white space dropped), None when it is not one."""
    line = line.strip()
    if not line or len(line) > MAX_JOB_ID_CHARS or not line.isprintable():
        return None
    return line


def parse_jobs(data: bytes) -> FileJobs:
    """The job ids of a file's bytes, one a line; blank lines skipped, bad lines dropped."""
    try:  # the common file: a few Slurm ids, one a line
        lines = data.decode("ascii").split("\n")
        if len(lines) <= MAX_JOBS_PER_FILE and all(SLURM_JOB_ID.fullmatch(x) for x in lines if x):
            return FileJobs(list(dict.fromkeys(x for x in lines if x)))
    except UnicodeDecodeError:
        pass
    out = FileJobs()
    seen: set[str] = set()
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            out.bad_lines.append(n)
            continue
        jid = job_id(text)
        if jid is None:
            out.bad_lines.append(n)
            continue
        if jid in seen:
            continue
        if len(out.jobs) >= MAX_JOBS_PER_FILE:
            out.over += 1
            continue
        seen.add(jid)
        out.jobs.append(jid)
        if not SLURM_JOB_ID.fullmatch(jid) and len(out.odd) < 1:
            out.odd.append(jid)
    return out


@dataclass
class DirReading:
    """Jobs per GPU (by NVML index, or by UUID as named), and what went wrong."""

    jobs: dict[int | str, set[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    bad: set[int | str] = field(default_factory=set)  # GPUs whose file could not be used
    incomplete: bool = False  # a limit left some GPU files unread: no GPU without one is idle
    odd: list[tuple[str, str]] = field(default_factory=list)  # (file, id): ids not of Slurm's shape
    missing: bool = False  # the directory does not exist


def read_dir(path: str) -> DirReading:
    """Read the mapping directory. Raises OSError when it exists but cannot be listed."""
    out = DirReading()
    names: list[tuple[str, int | str, bool]] = []  # (name, GPU, a regular file by its entry)
    extra = entries = 0
    try:
        it = os.scandir(path)
    except FileNotFoundError:
        out.missing = True
        return out
    with it:
        for entry in it:
            entries += 1
            if entries > MAX_ENTRIES:
                out.incomplete = True
                out.problems.append(f"{path}: more than {MAX_ENTRIES} entries (leftover temporary files?); "
                                    "the rest were not looked at, so GPUs without a file read are unknown")
                break
            gpu = parse_name(entry.name)
            if gpu is None:
                continue  # filtered before the cap: temporary and lock files never hide a GPU file
            if len(names) >= MAX_GPU_FILES:
                extra += 1
                continue
            try:
                regular = entry.is_file(follow_symlinks=False)  # d_type: no system call
            except OSError:
                regular = False
            names.append((entry.name, gpu, regular))
    if extra:
        out.incomplete = True
        out.problems.append(f"{path}: {len(names) + extra} or more GPU files, over the limit of "
                            f"{MAX_GPU_FILES} read per reading; GPUs without a file read are unknown")
    budget = MAX_TOTAL_BYTES
    for name, gpu, regular in sorted(names, key=lambda n: (isinstance(n[1], str), str(n[1]), n[0])):
        where = f"{path.rstrip('/')}/{name}"
        if budget <= 0:
            out.incomplete = True
            out.bad.add(gpu)
            out.problems.append(f"{where}: not read, the reading's {MAX_TOTAL_BYTES} bytes are spent")
            continue
        try:
            if not regular:  # never opened: a link's target is not read, a device not touched
                raise NotRegularFile(file_kind(os.lstat(where).st_mode), where)
            data = _read(where, min(MAX_FILE_BYTES, budget))
            budget -= len(data)
        except FileNotFoundError:
            continue  # an epilog removed it between the listing and the read
        except NotRegularFile as e:
            out.problems.append(f"{where} is {e.kind}, not a regular file; its GPU is unknown")
            out.bad.add(gpu)
            continue
        except (OSError, MappingError) as e:
            why = str(e) if isinstance(e, MappingError) else f"{where}: {_strerror(e)}"
            out.problems.append(why)
            out.bad.add(gpu)
            continue
        parsed = parse_jobs(data)
        if parsed.bad_lines:
            lines = ", ".join(map(str, parsed.bad_lines[:5])) + (" ..." if len(parsed.bad_lines) > 5 else "")
            out.problems.append(f"{where} line(s) {lines}: not a job id (printable single-line text of at "
                                f"most {MAX_JOB_ID_CHARS} characters); dropped, the file's other ids kept")
            if not parsed.jobs:
                out.bad.add(gpu)  # something holds the GPU, and we cannot say what
                continue
        if parsed.over:
            out.problems.append(f"{where}: {parsed.over} more job ids than the {MAX_JOBS_PER_FILE} read "
                                "per file")
        out.odd.extend((where, j) for j in parsed.odd)
        out.jobs.setdefault(gpu, set()).update(parsed.jobs)
    return out


def _read(where: str, limit: int) -> bytes:
    """The bytes of the regular file `where`, at most `limit`: opened without following a link and
    without blocking, checked by fstat (it may have been replaced since the listing) and refused by
    its size before it is read; one read, as a mapping file is a few bytes."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # made a link since the listing
            raise NotRegularFile("a symbolic link", where) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(file_kind(st.st_mode), where)
        if st.st_size > limit:
            budget = "" if limit == MAX_FILE_BYTES else " (what is left of the reading's byte budget)"
            raise MappingError(f"{where}: {st.st_size} bytes, over the {limit} a mapping file may "
                               f"hold{budget}")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise MappingError(f"{where}: over {limit} bytes (it grew while read)")
    return data


def _strerror(e: OSError) -> str:
    return e.strerror or errno.errorcode.get(e.errno or 0, "") or type(e).__name__


def by_uuid(reading: DirReading, gpus: Sequence[DeviceIdentity], mig_parent: Mapping[str, str] | None = None,
            ) -> tuple[dict[str, tuple[Workload, ...]], list[str]]:
    """The directory's jobs per GPU UUID: every GPU of `gpus` whose files (by index and by
    UUID) were usable is observed; a file of a GPU NVML does not list is a problem, and so is a
    `MIG-` file whose device `mig_parent` (lower-case MIG UUID -> GPU UUID) does not know."""
    problems = list(reading.problems)
    by_index = {g.index: g.uuid for g in gpus if g.uuid}
    by_lower = {g.uuid.lower(): g.uuid for g in gpus if g.uuid}
    mig = {k.lower(): v for k, v in (mig_parent or {}).items()}

    def owner(gpu: int | str) -> str | None:
        if isinstance(gpu, int):
            return by_index.get(gpu)
        low = gpu.lower()
        return by_lower.get(low) or mig.get(low)

    held: dict[str, set[str]] = {}
    for gpu, jobs in reading.jobs.items():
        uuid = owner(gpu)
        if uuid is None:
            what = f"GPU {gpu}" if isinstance(gpu, int) else gpu
            problems.append(f"mapping file for {what}, which NVML does not list")
            continue
        held.setdefault(uuid, set()).update(jobs)
    bad = {owner(g) for g in reading.bad} | {None}
    out = {}
    for g in gpus:
        if not g.uuid or g.uuid in bad:
            continue
        if reading.incomplete and g.uuid not in held:
            continue  # its file may be among those a limit left unread
        out[g.uuid] = tuple(Workload(hpc_job=j) for j in sorted(held.get(g.uuid, ())))
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"and {len(problems) - MAX_PROBLEMS} more problems of the directory"]
    return out, problems
