"""A model of a node over time: workloads take and leave GPUs, the workload source
takes readings (some GPUs unobserved now and then), the wall clock steps back and forth, XIDs
happen (counted live, or late as the backlog; the source's fresh reading failing or not) and
operators ack GPUs, in any order Hypothesis draws. After every event the attribution names
exactly the workload that held the GPU at the event, or says it is unknown; never another one,
never "idle" for a held GPU. After every ack none of that GPU's records from before it shows.

What the model assumes (docs/xid.md, "Who the fault hit"): a GPU is held by one workload at a
time, job ids are never reused, and a live event's GPU does not change hands between the event
and its counting (milliseconds: the job it killed is not gone yet, its epilog runs later)."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from exporter.attribution.fault import LIVE_S, FaultAttribution
from exporter.attribution.history import WorkloadHistory
from exporter.workload.model import Workload, WorkloadReading
from exporter.xid.store import Ack

GPUS = {"00000000:53:00": "GPU-00000000-0000-0000-0000-000000000000",
        "00000000:64:00": "GPU-00000001-0000-0000-0000-000000000000"}
PCIS = sorted(GPUS)
EPS = 0.001  # every action takes a little time: two things never happen at the same instant


class Ids:
    def labels(self, pci, ask_nvml=True):
        return ("", GPUS[pci], pci)

    def to_state(self):
        return {pci: {"index": i, "uuid": u} for i, (pci, u) in enumerate(sorted(GPUS.items()))}


class Node:
    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, 1_800_000_000.0
        self.holder = {pci: () for pci in PCIS}
        self.changes = {pci: [(float("-inf"), ())] for pci in PCIS}  # (mono, holder from then on)
        self.jobs = 0
        self.history = WorkloadHistory()
        self.fresh_ok = True
        self.attr = FaultAttribution(self.history, Ids(), mono=lambda: self.mono, wall=lambda: self.wall)
        self.attr.fresh = self.fresh
        self.acks: list[Ack] = []

    def tick(self, s: float = EPS) -> None:
        self.mono += s
        self.wall += s

    def held_at(self, pci: str, t: float) -> tuple:
        return [h for at, h in self.changes[pci] if at <= t][-1]

    def set_holder(self, pci: str, held: tuple) -> None:
        self.holder[pci] = held
        self.changes[pci].append((self.mono, held))

    def reading(self, observed) -> WorkloadReading:
        r = WorkloadReading(self.wall, {GPUS[p]: self.holder[p] for p in observed}, self.mono)
        self.history.observe(r)  # the source's listener
        return r

    def fresh(self, not_before: float):
        if not self.fresh_ok:
            return None
        return self.reading(PCIS)


ACTIONS = st.one_of(
    st.tuples(st.just("advance"), st.one_of(st.floats(EPS, 30), st.floats(EPS, 1200))),
    st.tuples(st.just("step"), st.floats(-7200, 7200)),
    st.tuples(st.just("take"), st.sampled_from(PCIS)),
    st.tuples(st.just("leave"), st.sampled_from(PCIS)),
    st.tuples(st.just("read"), st.sets(st.sampled_from(PCIS))),
    st.tuples(st.just("live"), st.sampled_from(PCIS), st.floats(0, LIVE_S - 0.1), st.booleans()),
    st.tuples(st.just("late"), st.sampled_from(PCIS), st.one_of(st.floats(LIVE_S + 0.1, 60),
                                                                 st.floats(LIVE_S + 0.1, 3000))),
    st.tuples(st.just("ack"), st.sampled_from(PCIS)),
)


P0, P1 = PCIS


@given(st.lists(ACTIONS, max_size=60))
# the job ended between two readings, the XID came after it ended: not the job's
@example([("take", P0), ("read", {P0, P1}), ("advance", 10), ("leave", P0), ("advance", 10),
          ("read", {P0, P1}), ("advance", 30)] + [("late", P0, d) for d in (20.0, 35.0, 45.0)])
# a job started between the scrape and the XID, its fresh reading tells (the job killed early)
@example([("read", {P0, P1}), ("advance", 5), ("take", P0), ("live", P0, 0.01, True),
          ("live", P0, 0.01, False)])
# the wall clock steps back an hour between two jobs; an ack after the step
@example([("take", P0), ("read", {P0}), ("advance", 15), ("step", -3600.0), ("leave", P0), ("take", P0),
          ("read", {P0}), ("advance", 15), ("read", {P0}), ("late", P0, 10.0), ("live", P0, 0.5, True),
          ("ack", P0), ("advance", 1), ("live", P0, 0.5, True)])
def test_attribution_names_exactly_the_workload_that_held_the_gpu_or_unknown(actions):
    n = Node()
    named = 0
    for action in actions:
        n.tick()
        kind = action[0]
        if kind == "advance":
            n.tick(action[1])
        elif kind == "step":
            n.wall += action[1]  # NTP steps the wall clock; the monotonic one goes on
        elif kind == "take" and not n.holder[action[1]]:
            n.jobs += 1
            w = Workload(hpc_job=str(n.jobs)) if n.jobs % 3 else Workload("", "ns", f"pod-{n.jobs}", "c")
            n.set_holder(action[1], (w,))
        elif kind == "leave":
            n.set_holder(action[1], ())
        elif kind == "read":
            n.reading(sorted(action[1]))
        elif kind in ("live", "late"):
            pci = action[1]
            if kind == "live":
                at = n.mono  # it happens now; counted `delay` later, the GPU as the event left it
                n.fresh_ok = action[3]
                n.tick(action[2])
            else:
                at = max(0.0, n.mono - action[2])  # it happened a while ago: the backlog
            truth = n.held_at(pci, at)
            rec = n.attr.xid(pci, 79, n.wall - (n.mono - at), kernel_s=at)
            assert rec.mono == at
            assert rec.workloads is None or rec.workloads == truth, (kind, at, truth, rec.workloads)
            named += rec.workloads is not None
            if kind == "live" and n.fresh_ok:
                assert rec.workloads == truth  # a reading after the event always tells
            last_ack = max((a.mono for a in n.acks if a.pci == pci), default=float("-inf"))
            if kind == "live" and rec.workloads is not None and rec.mono > last_ack:
                assert any(r.event == rec.event and r.workloads == rec.workloads and r.mono >= rec.mono
                           for r in n.attr.ledger.visible(n.acks))
        elif kind == "ack":
            pci = action[1]
            n.acks.append(Ack(pci, PCIS.index(pci), GPUS[pci], None, n.wall, {}, mono=n.mono))
            assert all(r.mono > n.mono for r in n.attr.ledger.visible(n.acks) if r.pci == pci)


def test_the_model_names_workloads_at_all():
    """The property is not met by answering "unknown" to everything: a scripted run of it names
    the job of a live event, of a bracketed late event, and says idle for a live event on an idle
    GPU."""
    n = Node()
    pci = PCIS[0]
    n.reading(PCIS)
    n.tick(1)
    n.set_holder(pci, (Workload(hpc_job="42"),))
    n.tick(1)
    n.reading(PCIS)
    n.tick(20)
    n.reading(PCIS)
    n.tick(1)
    assert n.attr.xid(pci, 79, n.wall - 10, kernel_s=n.mono - 10).workloads == (Workload(hpc_job="42"),)
    assert n.attr.xid(pci, 94, n.wall, kernel_s=n.mono).workloads == (Workload(hpc_job="42"),)
    n.tick(1)
    assert n.attr.xid(PCIS[1], 94, n.wall, kernel_s=n.mono).workloads == ()
