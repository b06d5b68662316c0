"""Property tests (Hypothesis) of every parser of outside input: whatever the bytes, no exception
escapes beyond the one the parser documents, and what comes out is bounded and finite.

Inputs are generated around each format (real lines with mutated fields, numbers of any length,
stray bytes) and as raw text. Example counts (per test, `EXAMPLES` unless noted) are kept small
enough for a loaded 2-core CI: 15 tests x 300 examples, about 20 s in all.
"""

from __future__ import annotations

import json
import math
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.config import ConfigError, load
from exporter.efa import parse as efa
from exporter.lustre import discovery, parsers
from exporter.state.file import StateFile
from exporter.xid.identities import GpuIdentities
from exporter.xid.kmsg import KmsgReader, parse_record
from exporter.xid.parser import KernelLogParser, parse_message
from exporter.xid.persistence import STATE_DOC
from exporter.xid.store import XID_DOC, XID_EVENTS, EventStore
from exporter.xid.sxid import parse_sxid

EXAMPLES = settings.default.max_examples  # the profile's: 300 in CI, more with HYPOTHESIS_PROFILE=search
examples = settings(max_examples=EXAMPLES)

# numbers of any length: 20 digits passes 2**64, 310 passes a float
digits = st.one_of(st.text(string.digits, min_size=1, max_size=25),
                   st.integers(19, 400).map(lambda n: "9" * n))
number = st.one_of(st.integers(-(10**30), 10**30).map(str), digits,
                   st.sampled_from(["-1", "0", "1e308", "nan"]))
word = st.text(string.ascii_letters + string.digits + "_-.:", max_size=20)
junk = st.text(max_size=200)  # any unicode, control characters included
hexs = st.text("0123456789abcdefABCDEF", min_size=1, max_size=10)
pci = st.builds(lambda d, b, s: f"{d}:{b}:{s}", hexs, hexs, hexs)


def lines(*parts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Text of lines drawn from `parts`, joined in any order and number."""
    return st.lists(st.one_of(*parts), max_size=20).map("\n".join)


def finite(x: object) -> bool:
    return not isinstance(x, float) or math.isfinite(x)


# -- kernel log ----------------------------------------------------------------------------------
kmsg_record = st.builds(lambda p, s, u, f, m: f"{p},{s},{u},{f};{m}", number, number, number, word, junk)
xid_message = st.builds(lambda a, x, rest: f"NVRM: Xid (PCI:{a}): {x}, pid={rest}, name=p, {rest}",
                        pci, number, junk)
nvrm_message = st.one_of(
    xid_message, st.builds(lambda a, u: f"NVRM: GPU at PCI:{a}: GPU-{u}", pci, hexs),
    st.builds(lambda a: f"NVRM: GPU {a}: GPU has fallen off the bus.", pci),
    st.builds(lambda a: f"NVRM: The NVIDIA GPU {a}", pci), st.just("NVRM: fallen off the bus and is not"),
    st.builds(lambda a, x: f"NVRM: Xid (PCI:{a}): 154, GPU recovery action changed from 0x0 to 0x{x}",
              pci, hexs),
    junk.map(lambda j: "NVRM: " + j))


@examples
@given(st.one_of(kmsg_record, junk))
def test_kernel_log_records(text):
    rec = parse_record(text)
    if rec is not None:
        assert rec.prio >= 0 and rec.seq >= 0 and rec.usec >= 0


@examples
@given(st.lists(st.one_of(kmsg_record, junk, st.binary(max_size=50).map(lambda b: b.decode("latin-1"))),
                max_size=30))
def test_kernel_log_file_reader(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("kmsg") / "kmsg"
    path.write_bytes("\n".join(records).encode("utf-8", "surrogateescape"))
    r = KmsgReader(str(path))
    got = list(r.read_available())
    assert r.stats.records == len(got) and r.stats.malformed >= 0


@examples
@given(st.lists(nvrm_message, max_size=10))
def test_xid_lines(messages):
    parser = KernelLogParser()
    for m in messages:
        for parsed in (parse_message(m), parser.feed(m)):
            xid = getattr(parsed, "xid", None)
            assert xid is None or 1 <= xid <= 999  # never an unbounded label value


@examples
@given(st.one_of(
    st.builds(lambda n, a, c, sev, rest: f"nvidia-nvswitch{n}: SXid (PCI:{a}): {c}, {sev}, {rest}",
              number, pci, number, st.sampled_from(["Fatal", "Non-fatal", "", "x"]), junk),
    junk))
def test_sxid_lines(message):
    parse_sxid(message)


# -- EFA -----------------------------------------------------------------------------------------
@examples
@given(st.one_of(number, junk, digits.map(lambda d: d + "\n")))
def test_efa_counter_files(text):
    for fn in (efa.parse_counter, efa.parse_lifespan_seconds, efa.parse_rate_bytes_per_second,
               efa.parse_hex_id):
        for arg in (text, text.encode("utf-8", "surrogateescape")) if fn is efa.parse_counter else (text,):
            try:
                v = fn(arg)
            except ValueError:
                continue  # the documented failure: that device's read fails
            assert finite(v) and (fn is not efa.parse_counter or 0 <= v < 2**64 * 10)


@examples
@given(st.dictionaries(word, st.lists(word, max_size=8), max_size=4), st.lists(word, max_size=8))
def test_efa_listing_plans(port_files, device_files):
    efa.plan_reads(port_files, device_files)


# -- Lustre --------------------------------------------------------------------------------------
stat_name = st.from_regex(r"[A-Za-z_][\w.\-]{0,12}", fullmatch=True)
unit = st.one_of(st.sampled_from(["usecs", "usec", "secs", "sec", "reqs", "regs", "bytes", "pages"]), word)
stats_line = st.builds(lambda n, c, u, a, b, s, q: f"{n} {c} samples [{u}] {a} {b} {s} {q}".rstrip(),
                       stat_name, digits, unit, number, number, number, st.one_of(digits, st.just("")))
header = st.builds(lambda k, v: f"{k} {v} secs.nsecs", st.sampled_from(["snapshot_time", "start_time",
                                                                          "elapsed_time"]), number)


@examples
@given(lines(stats_line, header, junk))
def test_lustre_stats(text):
    s = parsers.parse_stats(text)
    for c in s.counters.values():  # every number is exported as a float: none may overflow one
        assert finite(c.seconds() or 0.0)
        assert all(finite(float(v)) for v in (c.count, c.min, c.max, c.sum, c.sumsq) if v is not None)
    assert finite(s.reset_timestamp() or 0.0)


@examples
@given(lines(st.builds(lambda k, v: f"  {k}: {v}", word, number), st.builds(lambda k: f"{k}:", word),
             st.builds(lambda t, s: f"  - [ {t}, {s} ]", number, word), junk))
def test_lustre_import_state_and_cache(text):
    imp = parsers.parse_import(text)
    hist = parsers.parse_state(text)
    cache = parsers.parse_max_cached_mb(text)
    parsers.parse_health_check(text)
    parsers.version_tuple(parsers.parse_version(text))
    values = [imp.connection_attempts, imp.idle_seconds, imp.inflight, imp.timeouts, imp.avg_waittime_usecs,
              cache.max_mb, cache.used_mb, parsers.parse_int(text)] + [t for t, _ in hist.history]
    assert all(finite(float(v)) for v in values if v is not None)  # exported as floats


@examples
@given(lines(st.builds(lambda a, b, c: f"{a}@tcp:/{b} /mnt/{c} lustre rw 0 0", word, word, word),
             st.builds(lambda a, b: f"36 25 0:{a} / /fsx rw - lustre {b}@o2ib:/fs rw", number, word), junk))
def test_lustre_mounts_and_devices(text):
    for parse in (discovery.parse_mounts, discovery.parse_mountinfo):
        mounts, bad = parse(text)
        discovery.distinct_mounts(mounts)
        assert bad >= 0
    for name in text.split():
        discovery.parse_device(name)
        discovery.split_instance(name)


# -- the state file ------------------------------------------------------------------------------
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**25), 10**25), st.floats(allow_nan=True),
              st.text(max_size=12)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children,
                                                                               max_size=4)),
    max_leaves=20)
count_row = st.lists(st.one_of(st.integers(-5, 10**20), st.floats(allow_nan=True), st.text(max_size=3)),
                     min_size=0, max_size=4)
state_doc = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 1, 1, 2, "1"]), "boot_id": st.sampled_from(["b", "b", 7]),
     "counts": st.dictionaries(st.sampled_from(["00000000:53:00", "other", "x", ""]),
                               st.dictionaries(st.sampled_from(["31", "154/2", "0", "99999999999", "x"]),
                                               count_row, max_size=3), max_size=3),
     "last_seq": st.one_of(st.none(), st.integers(-3, 2**70), st.text(max_size=3)),
     "open": st.lists(json_value, max_size=3), "gpus": json_value, "acks": json_value,
     "recoveries": st.one_of(st.integers(-1, 10**12), st.text(max_size=2))})


@examples
@given(st.one_of(state_doc.map(lambda d: json.dumps(d).encode()),
                 json_value.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200)))
def test_state_file(tmp_path_factory, raw):
    d = tmp_path_factory.mktemp("state")
    (d / "xid-state.json").write_bytes(raw)
    sf = StateFile(str(d), "b", doc=STATE_DOC)
    data = sf.read()  # never raises: a bad file (or section) is set aside
    if data is not None:
        # a dropped XID section is never silent: the file is corrupt (set aside, named in the log)
        assert "counts" in data or "counts" not in json.loads(raw) or sf.status.problem == "corrupt"
        s, ids = EventStore(XID_EVENTS), GpuIdentities(None)
        XID_DOC.load(data, s, ids)
        assert all(0 <= c.count <= 10**9 for ks in s.counts.values() for c in ks.values())
        assert StateFile(str(d), "b", doc=STATE_DOC).write(XID_DOC.dump(s, ids, data.get("last_seq")))
        assert StateFile(str(d), "b", doc=STATE_DOC).read() is not None  # what is written reads back


# -- the config ----------------------------------------------------------------------------------
yaml_scalar = st.one_of(st.integers(-(10**6), 10**6).map(str), st.sampled_from(["true", "null", "~", "1e999",
                                                                               ".nan", "'x'", "[]", "{}"]),
                        st.text(string.ascii_letters, max_size=6))
yaml_doc = st.lists(st.tuples(st.sampled_from(["listen", "log_level", "gpu", "xid", "paths", "nope",
                                               "collector_timeout_seconds", "lustre"]),
                              st.sampled_from(["", "  timeout_seconds", "  read_timeout_seconds", "  enabled",
                                               "  policy", "  sysfs", "  parallel"]), yaml_scalar),
                    max_size=8).map(lambda kv: "\n".join(f"{k}:\n{s}: {v}" if s else f"{k}: {v}"
                                                         for k, s, v in kv))


@examples
@given(st.one_of(yaml_doc, junk, st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))
def test_config(tmp_path_factory, text):
    import exporter.collectors  # noqa: F401 - every section declared

    exporter.collectors.collector_classes()
    p = tmp_path_factory.mktemp("cfg") / "config.yaml"
    p.write_bytes(text.encode("utf-8", "surrogateescape"))
    try:
        load(p)
    except ConfigError as e:
        assert str(p) in str(e)  # the error names the file
