"""What a RAS STATUS report says, validated (exporter.nccl.parse_json, parse_text build it).

Every string here was checked: `host` is an IP address (or "" where NCCL had none), hashes are
hex, numbers are in range. Label values come only from these fields."""

from __future__ import annotations

from dataclasses import dataclass

# NCCL_NUM_FUNCTIONS, in the order the JSON report writes them (nccl_common.h).
OPS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
MAX_RANKS = 65536  # a communicator's size
MAX_DEV = 63  # CUDA and NVML device ordinals
MAX_PID = 4194304  # Linux's pid_max limit
MAX_COUNT = 2**64 - 1
ERROR_KINDS = ("init", "async", "abort")
# ncclResult_t: init_state 7 = ncclInProgress (init running), not an error.
IN_PROGRESS = 7


class ReplyError(ValueError):
    """A reply that does not follow the protocol or the schema: the whole reply is discarded."""


@dataclass(frozen=True)
class Rank:
    """A rank that reported (JSON: every field; text: the identity, `counts` None)."""

    rank: int
    host: str
    pid: int  # in the rank's own pid namespace; -1: unknown
    cuda_dev: int  # -1: unknown
    nvml_dev: int  # -1: unknown
    counts: tuple[int, ...] | None = None  # per OPS; None in a text report
    init_state: int = 0
    async_error: int = 0
    finalize: bool = False
    destroy: bool = False
    abort: bool = False

    @property
    def errors(self) -> tuple[str, ...]:
        """Which of ERROR_KINDS this rank reports."""
        out = []
        if self.init_state not in (0, IN_PROGRESS):
            out.append("init")
        if self.async_error not in (0, IN_PROGRESS):
            out.append("async")
        if self.abort:
            out.append("abort")
        return tuple(out)


@dataclass(frozen=True)
class Missing:
    """A rank that did not report. unresponsive and dead both False: its process answered without
    this communicator (destroyed, or not created yet: NOCOMM), not a missing peer."""

    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    unresponsive: bool
    dead: bool

    @property
    def state(self) -> str:
        """dead, unresponsive, or "" (NOCOMM)."""
        return "dead" if self.dead else "unresponsive" if self.unresponsive else ""


@dataclass(frozen=True)
class Communicator:
    hash: str  # lower-case hex without 0x
    size: int
    ranks: tuple[Rank, ...]
    missing: tuple[Missing, ...]


@dataclass(frozen=True)
class Lag:
    """A rank behind: `behind` operations, from a text report's MISMATCH block."""

    comm: str
    rank: int
    host: str
    pid: int
    nvml_dev: int
    behind: int


@dataclass(frozen=True)
class Report:
    """One STATUS reply. A JSON report fills `communicators` completely; a text report holds only
    what the text prints: the communicators' sizes, the missing ranks (`communicators` with empty
    `ranks`), the ranks behind (`lags`) and the ranks with errors (`error_ranks`)."""

    version: str  # X.Y.Z
    format: str  # json or text
    communicators: tuple[Communicator, ...]
    collection_s: float
    timeouts: int
    lags: tuple[Lag, ...] = ()
    error_ranks: tuple[tuple[Rank, str], ...] = ()  # (rank, kind) for text
    dead: frozenset[tuple[str, int]] = frozenset()  # text: (host, pid) of processes considered dead
    # text: the table's largest communicator size and its ranks that reported (JSON: from the lists)
    table: tuple[int, int] = (0, 0)
    nodes: int = 0  # text: the most nodes a communicator's reporting ranks span (JSON: 0)


def version_tuple(v: str) -> tuple[int, int, int]:
    a, b, c = v.split(".")
    return int(a), int(b), int(c)
