"""NCCL RAS collector (docs/nccl.md): for each job holding GPUs on this node, what NCCL's own RAS
says about the job's ranks: which rank the others wait for, which peers are missing or dead.

Off by default (`nccl.enabled`, --collector.nccl). It reads nothing while no job holds a GPU
here. Queries run on the collector's own thread, one at a time, each under
`nccl.query_timeout_seconds` and `nccl.max_reply_bytes`; a scrape never waits for one: it
exports what the last reply of each job said. Which node of a job queries, and how often, is
exporter.nccl.election's choice; exporter.nccl.reader finds, trusts and queries the endpoint.

Cardinality (per node): per job on it, about 12 series and 8 per local process; the job-wide
series (ranks behind, missing peers, rank errors) only on the job's querier, at most
`nccl.max_named_ranks` each; `nccl_ras_queries_total` 8. A p5 with one job: 71 series, its
querier at most 157 (docs/nccl.md, "Series and their budget")."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from exporter import deadline
from exporter.catalog import Families, define
from exporter.collector import Context, Derived, ProblemLog
from exporter.config import CollectorSection, non_negative, positive, setting
from exporter.nccl import client, election, netns
from exporter.nccl.findings import Findings
from exporter.nccl.model import OPS
from exporter.nccl.reader import JobReading, Settings, read_job
from exporter.workload.model import Workload, WorkloadReading

C = "nccl"
G = ("gpu",)
PEER = ("gpu", "peer_ip", "peer_pid", "peer_rank", "peer_gpu")


@dataclass
class NcclSection(CollectorSection):
    """NCCL's RAS (docs/nccl.md): which rank a stalled job waits for. Read the risks first."""

    name: ClassVar[str] = C
    enabled: bool = setting(
        False,
        "Query NCCL's RAS of the jobs on this node (--collector.nccl). Off by default: each query is a "
        "job-wide collective inside the training processes, and some NCCL versions have crashed under it "
        '(docs/nccl.md, "Risks").',
    )
    interval_seconds: float = setting(
        30.0,
        "Seconds between two queries of a job by its querier (the other nodes query less often: "
        'docs/nccl.md, "Fleet cost").',
        check=positive,
    )
    query_timeout_seconds: float = setting(
        15.0,
        "Deadline of one query, connect to end of reply; a server slower than this is given up "
        "(result timeout).",
        check=positive,
    )
    max_reply_bytes: int = setting(
        16 << 20,
        "A longer reply is given up (result too_large): about 570 bytes per rank per communicator, "
        "so 16 MiB covers 4,096 GPUs with 6 communicators each.",
        check=positive,
    )
    leg_timeout_seconds: int = setting(
        5,
        "The TIMEOUT sent to the server: how long one leg of NCCL's collective waits for a peer.",
        check=positive,
    )
    elect: bool = setting(
        True,
        "One querier per job, chosen from the replies (world rank 0's node); false: every node "
        "queries every interval.",
    )
    backup_intervals: int = setting(
        2,
        "The backup node (the lowest rank on another node) queries every this many intervals.",
        check=positive,
    )
    standby_intervals: int = setting(
        30, "The other nodes query every max(this, the job's nodes) intervals.", check=positive
    )
    query_unknown_text_versions: bool = setting(
        False,
        "Query a server that speaks only text (NCCL before 2.28.7) whose version neither the library "
        "file name nor a pip wheel's dist-info gives: it may be 2.26, which a query can crash.",
    )
    max_named_ranks: int = setting(
        16,
        "At most this many ranks behind, missing peers and ranks with errors are exported per job (the "
        "most behind first).",
        check=non_negative,
    )


UP = define(
    "nccl_ras_up",
    "gauge",
    "1 when this node's last query of the job's RAS was answered and trusted, 0 when it was not; "
    "gpu: the job's lowest GPU on this node.",
    G,
    collector=C,
)
INFO = define(
    "nccl_ras_info",
    "gauge",
    "Always 1: the NCCL version and the report format of the job's last reply.",
    G + ("nccl_version", "format"),
    collector=C,
)
ROLE = define(
    "nccl_ras_querier",
    "gauge",
    "1 when this node queries the job every interval (its querier), 0 when it queries less often.",
    G,
    collector=C,
)
QUERIES = define(
    "nccl_ras_queries_total",
    "counter",
    "Queries of RAS by outcome: ok, no_listener, untrusted (a listener not the job's, or a reply "
    "that does not know it), timeout, protocol_error, too_large, unsupported (a version a query "
    "can crash), error.",
    ("result",),
    collector=C,
)
DURATION = define(
    "nccl_ras_query_duration_seconds",
    "gauge",
    "How long the job's last answered query took.",
    G,
    unit="seconds",
    collector=C,
)
COLLECTION = define(
    "nccl_ras_collection_seconds",
    "gauge",
    "How long NCCL's job-wide collective took for the last reply, as the server says.",
    G,
    unit="seconds",
    collector=C,
)
REPLY_BYTES = define(
    "nccl_ras_reply_bytes", "gauge", "Size of the job's last reply.", G, unit="bytes", collector=C
)
LAST_REPLY = define(
    "nccl_ras_last_reply_timestamp_seconds",
    "gauge",
    "When this node last had a trusted reply about the job.",
    G,
    unit="seconds",
    collector=C,
)
ENDPOINT = define(
    "nccl_ras_endpoint_info",
    "gauge",
    "Always 1 per process of a job on this node: the IP a RAS report gives it (its bootstrap "
    "interface: node or pod IP), its pid in its namespace and its GPU; how a peer named by any "
    "node's reply is found on its node.",
    ("gpu", "ip", "pid"),
    collector=C,
)
LAUNCHED = define(
    "nccl_ras_collectives_launched_total",
    "counter",
    "Collective operations the GPU's rank launched in the largest communicator, by op (host-side "
    "launches; Send/Recv and CUDA-graph launches are not counted), from this node's last reply.",
    ("gpu", "op"),
    collector=C,
)
BEHIND = define(
    "nccl_ras_ops_behind",
    "gauge",
    "Operations the GPU's rank is behind the most advanced rank of its communicators, within this "
    "node's last reply.",
    ("gpu", "rank"),
    collector=C,
)
ERRORS = define(
    "nccl_ras_rank_errors",
    "gauge",
    "1 while the GPU's rank reports an error of `kind` (init, async, abort) in this node's last reply.",
    ("gpu", "kind"),
    collector=C,
)
JOB_OPS = define(
    "nccl_ras_job_ops_launched",
    "gauge",
    "Operations launched by the most (which=max) and least (which=min) advanced rank of the job's "
    "largest communicator, in the querier's last JSON reply; gpu: the job's lowest GPU here.",
    G + ("which",),
    collector=C,
)
JOB_RANKS = define(
    "nccl_ras_job_ranks",
    "gauge",
    "Ranks of the job's largest communicator by state (total, reporting, unresponsive, dead), in "
    "the querier's last reply.",
    G + ("state",),
    collector=C,
)
RANK_BEHIND = define(
    "nccl_ras_rank_behind",
    "gauge",
    "Operations a rank of the job is behind the most advanced one, for the ranks behind (at most "
    "nccl.max_named_ranks), in the querier's last reply; peer_gpu: its GPU as NCCL names it.",
    PEER,
    collector=C,
)
PEER_MISSING = define(
    "nccl_ras_peer_missing",
    "gauge",
    "1 per rank whose process did not answer (state unresponsive) or was declared dead, in the "
    "querier's last reply (at most nccl.max_named_ranks).",
    PEER + ("state",),
    collector=C,
)
RANK_ERROR = define(
    "nccl_ras_rank_error",
    "gauge",
    "1 per rank of the job reporting an error of `kind` (init, async, abort), in the querier's "
    "last reply (at most nccl.max_named_ranks).",
    PEER + ("kind",),
    collector=C,
)


@dataclass
class _Job:
    anchor: int  # the job's lowest GPU index here
    reading: JobReading | None = None  # the last attempt
    good: JobReading | None = None  # the last trusted reply
    role: str = election.UNKNOWN
    gpus: list[int] = field(default_factory=list)
    version: str | None = None  # the NCCL version a reply gave (or the library file)
    due: float = 0.0  # monotonic
    last_ok_mono: float = 0.0
    queued: bool = False
    phased: bool = False  # SHARED: this node's turn offset applied


Processes = Callable[[list[int]], dict[int, int]]


def nvml_processes(ctx: Context) -> Processes:
    """Host pid -> GPU index of the processes NVML lists on the GPUs."""
    from exporter.nvml.backend import NvmlError
    from exporter.workload.slurm_cgroup import gpu_pids

    def read(gpus: list[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        if not ctx.nvml.ensure():
            return out
        for g in gpus:
            try:
                for pid in gpu_pids(ctx.nvml.backend, g):
                    out.setdefault(pid, g)
            except NvmlError:
                continue
        return out

    return read


class NcclCollector(Derived):
    name = C
    config_section = NcclSection
    prefix = "nccl_ras_"
    docs_group = "NCCL RAS"
    depends_on = ("workload",)

    def __init__(
        self,
        ctx: Context,
        processes: Processes | None = None,
        opener: netns.Opener | None = None,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ctx)
        cfg = ctx.config.section(NcclSection)
        self.cfg = cfg
        self.procfs = ctx.config.paths.procfs
        self.processes = processes or nvml_processes(ctx)
        self.opener = opener or netns.open_socket
        self.settings = Settings(cfg.query_timeout_seconds, cfg.max_reply_bytes, cfg.leg_timeout_seconds)
        self.reads = deadline.Deadlines(ctx.pool)
        # the socket's deadline, plus time to list the job's processes and read procfs
        self.deadline_s = cfg.query_timeout_seconds * 1.5 + 1.0
        self._mono = mono
        self._cond = threading.Condition()
        self._jobs: dict[Workload, _Job] = {}
        self._queue: list[Workload] = []
        self._busy = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self.results = dict.fromkeys(client.RESULTS, 0)
        self.problems = ProblemLog(self.log)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="nccl-ras", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def settled(self, timeout: float) -> bool:
        """Wait until no query is queued or running (tests, the bench); False at the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    # -- the scrape side: which jobs are here, which are due; export what the last replies said

    def _jobs_here(self, reading: WorkloadReading | None) -> dict[Workload, list[int]]:
        if reading is None:
            return {}
        index = {g.uuid: g.index for g in self.ctx.nvml.devices} if self.ctx.nvml.ok else {}
        out: dict[Workload, list[int]] = {}
        for uuid, held in reading.by_uuid.items():
            if uuid in index:
                for w in held:
                    out.setdefault(w, []).append(index[uuid])
        return {w: sorted(g) for w, g in out.items()}

    def derive(self, out: Families, inputs: Mapping[str, Any]) -> None:
        reading = inputs.get("workload")
        if reading is None and self.ctx.workload is not None:
            reading = self.ctx.workload.latest
        here = self._jobs_here(reading)
        now = self._mono()
        with self._cond:
            for w in self._jobs.keys() - here.keys():  # the job left: forget it
                del self._jobs[w]
            for w, gpus in here.items():
                job = self._jobs.get(w)
                if job is None:
                    job = self._jobs[w] = _Job(gpus[0])
                job.anchor = gpus[0]
                job.gpus = gpus
                if now >= job.due and not job.queued:
                    job.queued = True
                    self._queue.append(w)
            if self._queue:
                self._cond.notify_all()
            jobs = list(self._jobs.values())
            results = dict(self.results)
        for result, n in results.items():
            out.add(QUERIES, n, result=result)
        for job in jobs:
            self._export(out, job)

    def _export(self, out: Families, job: _Job) -> None:
        r, good = job.reading, job.good
        if r is None:
            return
        a = str(job.anchor)
        out.add(UP, 1 if r.result == client.OK else 0, gpu=a)
        out.add(ROLE, 1 if job.role in (election.QUERIER, election.UNKNOWN) else 0, gpu=a)
        for nspid, gpu in sorted(r.local.items()):
            for ip in sorted(r.local_ips):
                out.add(ENDPOINT, 1, gpu=str(gpu), ip=ip, pid=str(nspid))
        if good is None or good.findings is None:
            return
        f = good.findings
        out.add(INFO, 1, gpu=a, nccl_version=f.version, format=f.format)
        out.add(DURATION, good.took_s, gpu=a)
        out.add(COLLECTION, f.collection_s, gpu=a)
        out.add(REPLY_BYTES, good.bytes, gpu=a)
        out.add(LAST_REPLY, good.at, gpu=a)
        if self._mono() - job.last_ok_mono >= 3 * self.cfg.interval_seconds:
            return  # a node that queries rarely does not show an old reply as the present
        mine = {key: w for key, w in f.ranks.items() if w.pid in good.local and w.host in good.local_ips}
        for key, w in sorted(mine.items(), key=lambda kv: kv[1].rank):
            local_gpu = str(good.local[w.pid])
            for op, n in zip(OPS, f.counts.get(key, ()), strict=False):
                out.add(LAUNCHED, n, gpu=local_gpu, op=op)
            if f.format == "json" or key in f.behind:
                out.add(BEHIND, f.behind.get(key, 0), gpu=local_gpu, rank=str(w.rank))
            for kind in f.errors.get(key, ()):
                out.add(ERRORS, 1, gpu=local_gpu, kind=kind)
        if job.role not in (election.QUERIER, election.UNKNOWN, election.SHARED):
            return  # the job-wide view is the querier's to export: one copy per job
        self._export_job(out, a, f)

    def _export_job(self, out: Families, a: str, f: Findings) -> None:
        if f.ops_max is not None and f.ops_min is not None:
            out.add(JOB_OPS, f.ops_max, gpu=a, which="max")
            out.add(JOB_OPS, f.ops_min, gpu=a, which="min")
        states = list(f.missing.values())
        for state, n in (
            ("total", f.size),
            ("reporting", f.reporting),
            ("unresponsive", states.count("unresponsive")),
            ("dead", states.count("dead")),
        ):
            out.add(JOB_RANKS, n, gpu=a, state=state)
        k = self.cfg.max_named_ranks

        def peer(key: tuple[str, int]) -> dict[str, str]:
            w = f.ranks[key]
            return {
                "gpu": a,
                "peer_ip": w.host,
                "peer_pid": str(w.pid),
                "peer_rank": str(w.rank),
                "peer_gpu": str(w.gpu),
            }

        named = [key for key in f.ranks if key[0]]  # a rank without a host cannot be placed
        for key in sorted((x for x in named if x in f.behind), key=lambda x: (-f.behind[x], f.ranks[x].rank))[
            :k
        ]:
            out.add(RANK_BEHIND, f.behind[key], **peer(key))
        for key in sorted((x for x in named if x in f.missing), key=lambda x: f.ranks[x].rank)[:k]:
            out.add(PEER_MISSING, 1, state=f.missing[key], **peer(key))
        for key in sorted((x for x in named if x in f.errors), key=lambda x: f.ranks[x].rank)[:k]:
            for kind in f.errors[key]:
                out.add(RANK_ERROR, 1, kind=kind, **peer(key))

    # -- the query side: the collector's own thread, one query at a time

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or bool(self._queue))
                if self._stop:
                    return
                w = self._queue.pop(0)
                job = self._jobs.get(w)
                if job is None:
                    self._cond.notify_all()
                    continue
                self._busy = True
                gpus, version = list(job.gpus), job.version
            reading = self._read_under_deadline(w, gpus, version)
            with self._cond:
                self._busy = False
                self.results[reading.result] += 1
                job = self._jobs.get(w)
                if job is not None:
                    self._record(job, reading)
                self._cond.notify_all()
            self.problems.report(
                w.describe(),
                "" if reading.result == client.OK else f"NCCL RAS {reading.result}: {reading.why}",
            )

    def _read_under_deadline(self, w: Workload, gpus: list[int], version: str | None) -> JobReading:
        """The job's reading on a pool thread (exporter.deadline). The socket's own deadline ends a
        query; this one also bounds what else can block (NVML's process list, procfs): past it the
        read is written off, and the job is not read again until it returns."""
        o = self.reads.call(("nccl", w), lambda: self._read(gpus, version), self.deadline_s)
        if o.ok:
            r: JobReading = o.value
            return r
        if o.status == deadline.ERROR:
            self.log.error("reading the RAS of %s: %s", w.describe(), o.reason)
        return JobReading(
            client.TIMEOUT if o.status in (deadline.TIMEOUT, deadline.BLOCKED) else client.ERROR, o.reason
        )

    def _read(self, gpus: list[int], version: str | None) -> JobReading:
        pids = self.processes(gpus)
        return read_job(
            self.procfs, pids, self.opener, self.settings, version, self.cfg.query_unknown_text_versions
        )

    def _record(self, job: _Job, reading: JobReading) -> None:
        job.queued = False
        if reading.result == client.OK and reading.findings is not None:
            f = reading.findings
            # This node's IP in the reply: the job's own listeners say it; else only the one host
            # where most of its pids appear (pids repeat across nodes in containers).
            if not reading.local_ips:
                reading.local_ips = f.hosts_of(set(reading.local))
            job.good = reading
            job.last_ok_mono = self._mono()
            job.role = election.role(f, reading.local_ips) if self.cfg.elect else election.QUERIER
        elif reading.result == client.UNSUPPORTED:
            job.good = None  # never show what a version now refused said
        if reading.result != client.OK and job.role == election.QUERIER:
            job.role = election.UNKNOWN  # a querier that cannot read keeps trying every interval
        if reading.version:
            job.version = reading.version
        job.reading = reading
        last = job.good.findings if job.good else None
        every = election.every(job.role, last, self.cfg.backup_intervals, self.cfg.standby_intervals)
        if job.role == election.SHARED and last is not None and not job.phased:
            # nodes that found the job together take turns, not all at once every N intervals
            job.phased = True
            every += zlib.crc32(",".join(sorted(reading.local_ips)).encode()) % max(1, last.nodes)
        job.due = self._mono() + every * self.cfg.interval_seconds


COLLECTOR = NcclCollector
