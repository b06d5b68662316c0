"""Property tests: generated state files, valid ones and ones with a hostile value put
anywhere in them (non-finite and huge numbers, wrong types, lone surrogates, long strings). The
exporter either loads a file exactly, or sets it aside (or, for another boot or kernel log,
leaves it), and the scrape never fails (a render error is a 500) nor serves a non-finite value.
Derandomized in CI (tests/conftest.py's "ci" profile)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from exporter import collectors
from exporter.runner import Runner
from exporter.xid.service import one_shot
from exporter.xid.store import MAX_COUNT, OTHER
from exporter.xid.sxid_state import SXID_DOC
from tests.helpers import samples, scrape, test_pool
from tests.test_xid_service import make_ctx

GPUS = ["00000000:53:00", "00000000:64:00", "00000000:75:00"]
KEYS = ["13", "31", "43", "48", "63", "64", "74", "79", "94", "95", "154/2", "999"]
times = st.floats(0, 1e10, allow_nan=False)
uuids = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=96)
seqs = st.none() | st.integers(0, 2**63 - 1)
HOSTILE = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.just(1e300), st.just(-1),
    st.integers(-(2**70), 2**70), st.booleans(), st.none(),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2).map(lambda s: "GPU-" + s),
    st.just("x" * 300), st.just("GPU-\x1b[31m"), st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["31", "a"]), st.integers(), max_size=2),
)


def xid_of(key: str) -> int:
    return int(key.split("/")[0])


@st.composite
def xid_docs(draw) -> dict:
    counts = draw(st.dictionaries(st.sampled_from([*GPUS, OTHER]), st.dictionaries(
        st.sampled_from(KEYS), st.tuples(st.integers(0, MAX_COUNT), times, times).map(list),
        min_size=1, max_size=4), max_size=4))
    acks: dict = {}  # by what tells acks apart (pci, xid, time to the ms)
    for pci, ks in draw(st.lists(st.sampled_from(sorted(counts.items())), max_size=3)) if counts else []:
        key = draw(st.sampled_from(sorted(ks)))
        xid = draw(st.sampled_from([None, xid_of(key)]))
        t = draw(times)
        acks.setdefault((pci, xid, round(t, 3)), {
            "pci": pci, "index": draw(st.none() | st.integers(0, 1023)), "uuid": draw(uuids), "xid": xid,
            "time": t, "baseline": {key: draw(st.integers(0, ks[key][0]))},
            **({"logged": True} if draw(st.booleans()) else {})})
    events = draw(st.lists(st.tuples(st.sampled_from([*GPUS, OTHER]), st.sampled_from(KEYS), times),
                           max_size=3, unique_by=lambda e: (e[0], xid_of(e[1]), e[2])))
    sources = st.sampled_from([["kmsg"], ["kmsg", "nvml"]])
    return {"version": 1, "boot_id": "boot-1", "written": draw(times), "last_seq": draw(seqs),
            "recoveries": draw(st.integers(0, 5)), "counts": counts,
            "open": [[p, xid_of(k), k, t, draw(sources)] for p, k, t in events],
            # mostly the GPUs with counts: their identities label the series
            "gpus": {p: {"index": draw(st.none() | st.integers(0, 1023)), "uuid": draw(uuids)}
                     for p in GPUS if (p in counts or draw(st.booleans())) and draw(st.integers(0, 3))},
            "acks": list(acks.values())}


def leaves(v: Any, path: tuple = ()) -> list[tuple]:
    """Every place in a document a value can be put (containers and scalars alike)."""
    out = [path] if path else []
    if isinstance(v, dict):
        for k, x in v.items():
            out += leaves(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += leaves(x, (*path, i))
    return out


def put(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: put(doc.get(head), rest, value)}
    return [put(x, rest, value) if i == head else x for i, x in enumerate(doc)]


@st.composite
def hostile(draw, docs) -> dict:
    """A generated document, perhaps with a hostile value put in one or two places: anywhere, or
    where a scalar is (the values the exporter reads)."""
    doc = draw(docs)
    for _ in range(draw(st.integers(0, 2))):
        places = leaves(doc)
        scalars = [p for p in places if not isinstance(get(doc, p), (dict, list))]
        doc = put(doc, draw(st.sampled_from(scalars if scalars and draw(st.booleans()) else places)),
                  draw(HOSTILE))
    return doc


def get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def write(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json.dumps(doc).encode("utf-8", "surrogatepass"))


def scrape_is_sound(ctx) -> dict:
    """The node's XID, SXid and verdict metrics as /metrics renders them (a render error would be
    a 500), every value finite."""
    built = collectors.build(ctx, only=["gpu", "health", "xid", "nvswitch"])
    got = samples(scrape(Runner.from_config(built, ctx.config, pool=test_pool())))
    bad = {k: v for k, v in got.items() if not math.isfinite(v)}
    assert not bad, bad
    return got


def check_is_sound(ctx) -> None:
    """`check --json` (read-only) makes its verdict and document of this state without an error."""
    from exporter.commands import check
    from exporter.compose import compose

    ctx = compose(ctx.config, nvml=ctx.nvml, pool=ctx.pool, read_only=True)  # as exporter.cli builds check's
    nv, svc, problems = check.gather(ctx)
    assert nv is not None, problems
    json.dumps(check.to_json(nv, svc, problems, check.exit_status(nv.verdict, bool(problems)), ctx))


def expected_acks(doc: dict) -> dict:
    out: dict = {}
    for a in doc.get("acks") or []:
        out.setdefault((a["pci"], a.get("xid"), round(float(a["time"]), 3)),
                       (a.get("index"), a.get("uuid") or "", dict(a.get("baseline") or {})))
    return out


def issue_case(**change) -> dict:
    """The issue's hostile files: a good document with one field changed."""
    doc = {"version": 1, "boot_id": "boot-1", "counts": {GPUS[0]: {"94": [2, 5.0, 1.7e9]}},
           "gpus": {GPUS[0]: {"index": 0, "uuid": "GPU-0"}}}
    for path, value in change.items():
        doc = put(doc, tuple(int(k) if k.isdigit() else k for k in path.split("__")), value)
    return doc


@example(issue_case(gpus={GPUS[0]: {"index": 0, "uuid": "GPU-\udcff"}}))  # every scrape a 500
@example(issue_case(gpus={GPUS[0]: {"index": 0, "uuid": "GPU-" + "x" * 100_000}}))  # a huge scrape
@example(issue_case(counts={GPUS[0]: {"94": [2, 5.0, 1e300]}}))  # `check` crashed
@example(issue_case(acks=[{"pci": GPUS[0], "xid": 94, "time": 1.7e9, "baseline": {"94": 10**9}}]))
@given(hostile(xid_docs()))
def test_an_xid_state_file_is_loaded_exactly_or_set_aside(doc):
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        path = tmp / "state" / "xid-state.json"
        write(path, doc)
        ctx = make_ctx(tmp, "")
        check_is_sound(make_ctx(tmp, None))
        svc = one_shot(ctx)
        problem = svc.state.status.problem
        scrape_is_sound(ctx)
        if problem == "corrupt":  # set aside, nothing taken from it
            assert not path.exists() and list(path.parent.glob("xid-state.json.corrupt-*"))
            assert svc.store.counts == {} and svc.store.acks == [] and svc.identities.known == {}
            return
        if problem in ("other_boot", "other_source"):  # a valid file that is not this boot's or log's
            assert doc.get("boot_id") != "boot-1" or doc.get("kmsg") not in (None, svc.state.kmsg)
            assert svc.store.counts == {}
            return
        assert problem == "", problem
        got = {(p, k): [c.count, c.last_kernel_s, c.last_wall] for p, ks in svc.store.counts.items()
               for k, c in ks.items()}
        assert got == {(p, k): [v[0], float(v[1]), float(v[2])] for p, ks in (doc.get("counts") or {}).items()
                       for k, v in ks.items()}
        assert {a.ident(): (a.index, a.uuid, a.baseline) for a in svc.store.acks} == expected_acks(doc)
        assert {p: (i.index, i.uuid) for p, i in svc.identities.known.items()} == \
            {p: (g.get("index"), g.get("uuid") or "") for p, g in (doc.get("gpus") or {}).items()}
        assert svc.follower.counted_through("xid") == doc.get("last_seq")
        assert svc.state.recoveries == (doc.get("recoveries") or 0)
        assert {(p, x, ev.start_s) for (p, x), q in svc.store.open.items() for ev in q} == \
            {(e[0], e[1], float(e[3])) for e in doc.get("open") or []}
        # and what the exporter writes back, it reads back the same
        assert svc.flush_state(force=True)
        again = one_shot(make_ctx(tmp, None))
        assert again.state.status.problem == "" and {
            (p, k): c.count for p, ks in again.store.counts.items() for k, c in ks.items()} == {
            k: v[0] for k, v in got.items()}


SWITCHES = ["00000000:05:00", "00000000:06:00"]


@st.composite
def sxid_docs(draw) -> dict:
    rows = draw(st.lists(st.tuples(st.sampled_from([*SWITCHES, OTHER]), st.sampled_from([12028, 20034]),
                                   st.sampled_from(["fatal", "non_fatal"]), st.integers(0, MAX_COUNT), times),
                         max_size=4, unique_by=lambda r: r[:3]))
    return {"version": 1, "boot_id": "b", "kmsg": "k", "last_seq": draw(seqs),
            "counts": [list(r) for r in rows],
            "switches": {p: i for i, p in enumerate(SWITCHES)}}


@example({"version": 1, "boot_id": "b", "kmsg": "k", "counts": [[SWITCHES[0], 12028, "fatal", 1, math.inf]],
          "switches": {SWITCHES[0]: 0}})
@given(hostile(sxid_docs()))
def test_an_sxid_state_file_is_loaded_exactly_or_set_aside(doc):
    """An old `sxid-state.json` (migrated into the state document when read)."""
    from exporter.state.file import StateFile
    from exporter.xid.store import EventStore
    from exporter.xid.sxid_state import MAX_SWITCHES, SXID_EVENTS, by_report

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "sxid-state.json"
        write(path, doc)
        sf = StateFile(d, "b", "k", doc=SXID_DOC)
        st_ = sf.read()
        if sf.status.problem in ("corrupt", "newer_version"):  # set aside for a human (or a newer exporter)
            assert st_ is None and not path.exists() and list(Path(d).glob("sxid-state.json.*-*"))
            return
        if st_ is None:  # another boot's or log's
            assert (doc.get("boot_id"), doc.get("kmsg")) != ("b", "k")
            return
        store = EventStore(SXID_EVENTS)
        assert SXID_DOC.load(st_, store) == doc.get("last_seq")  # what the follower resumes from
        own: list[str] = []  # addresses with series of their own: the first MAX_SWITCHES, in order
        want: dict = {}
        for p, x, s, n, wall in doc.get("counts") or []:
            if p != OTHER and p not in own and len(own) < MAX_SWITCHES:
                own.append(p)
            key = (p if p in own else OTHER, x, s)
            c, w = want.get(key, (0, 0.0))
            want[key] = (c + n, max(w, float(wall)))
        counts = by_report(store)
        assert {k: (c.count, c.last_wall) for k, c in counts.items()} == want
        assert all(math.isfinite(c.last_wall) for c in counts.values())
        assert store.indices == {p: n for p, n in (doc.get("switches") or {}).items() if p in own}
        assert st_.get("last_seq") == doc.get("last_seq")  # what the follower resumes from
        assert sf.write(SXID_DOC.dump(store, st_.get("last_seq")))
        assert StateFile(d, "b", "k", doc=SXID_DOC).read() is not None
