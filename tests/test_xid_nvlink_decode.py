"""The NVLink XIDs decoded as NVIDIA's catalog says: XID 74 and 144-150 lines from other
projects' tests and from the issues that reported false fatals (tests/fixtures/xid/field_lines.jsonl,
each with its source), the peers' 150 lines (tests/fixtures/xid/peer_xid_lines.jsonl, copied from the
shared peer fixtures), and a property test over the forms the driver writes.

The NVLink5 expectations are checked twice: against the tier written in the fixture, and against an
independent reading of NVIDIA's table here (bits compared as text, as NVIDIA/NVSentinel's parser
does), so a wrong row in exporter/xid/nvlink_table.py or a wrong matcher cannot agree with itself."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.xid.kmsg import parse_record
from exporter.xid.nvlink import DECODED_XIDS, Decoded, decode, from_code
from exporter.xid.nvlink_table import ROWS
from exporter.xid.parser import KernelLogParser, XidReport, parse_message, parse_xid, pci_key
from exporter.xid.policy import Policy, check_policy
from exporter.xid.store import Count, count_key
from exporter.xid.verdict import GpuInput, judge, xid_lines
from tests.helpers import FIXTURES, START_HANG_GUARD_S

FIELD = [json.loads(line) for line in (FIXTURES / "xid" / "field_lines.jsonl").read_text().splitlines()]
PEER = [json.loads(line) for line in (FIXTURES / "xid" / "peer_xid_lines.jsonl").read_text().splitlines()]
ACTION = ("reset", "reboot", "replace")
RESOLUTION = {"IGNORE": "ignore", "RESET_GPU": "reset", "XID_154_EVAL": "xid154"}


def table_outcomes(xid: int, unit: str, intrinfo: int, status: int) -> set[str]:
    """NVIDIA's resolutions for an NVLink5 event, read from the table with text comparisons."""
    bits = f"{intrinfo:032b}"
    units = {u for u in unit.split("/") if u}
    out = set()
    for x, row_unit, v1, v2, row_status, resolution, _sev, _inv in ROWS:
        if x != xid or row_status != status or (units and not units & set(row_unit.split("/"))):
            continue
        if any(len(p) == 32 and all(c in ("-", b) for c, b in zip(p, bits, strict=True)) for p in (v1, v2)):
            out.add(RESOLUTION[resolution])
    return out


@pytest.mark.parametrize("case", FIELD, ids=[f"{i}-{c['xid']}" for i, c in enumerate(FIELD)])
def test_field_lines_classify_as_the_catalog_says(case):
    r = parse_xid(case["line"])
    assert r is not None, case["source"]
    assert (r.xid, r.pci) == (case["xid"], case["pci"])
    assert Policy().tier(r.xid, r.action) == case["tier"], case["source"]
    if "decode" not in case:
        return
    d = from_code(r.action)
    assert d is not None and f"{d.outcome}/{d.severity or '-'}" == case["decode"]
    if r.xid in DECODED_XIDS - {74} and d.decoded:
        hexes = case["line"].split("(")[-1].split()
        want = table_outcomes(r.xid, case["line"].split(", ")[-1].split()[0], int(hexes[0], 16),
                              int(hexes[1], 16))
        assert d.outcome == max(want, key=["ignore", "xid154", "reset"].index), case["line"]


def test_field_lines_cover_what_the_issue_names():
    by_source = {c["source"].split("@")[0].split(" ")[0] for c in FIELD}
    assert {"leptonai/gpud", "NVIDIA/NVSentinel"} <= by_source
    # NVSentinel #1357: the kernel line said Nonfatal; it must never be a node action
    issue = next(c for c in FIELD if "#1357" in c["source"])
    assert issue["tier"] == "nonfatal"
    # every Nonfatal line of the field set is counted, never acted on
    assert all(c["tier"] not in ACTION for c in FIELD if "Nonfatal" in c["line"])
    # and Fatal NVLink5 lines the table says RESET_GPU still reset
    assert any(c["tier"] == "reset" and c["decode"] == "reset/fatal" for c in FIELD if c["xid"] == 149)


def _peer_reports(case) -> list[XidReport]:
    parser = KernelLogParser()
    out = []
    for raw in case["line"].split("\n"):
        msg = raw
        if case["form"] == "kmsg":
            rec = parse_record(raw)
            if rec is None or not rec.kernel:
                continue
            msg = rec.message
        r = parser.feed(msg)
        if isinstance(r, XidReport):
            out.append(r)
    return out


# Where a peer's expectation records a quirk of that peer (its note says so) and this exporter reads the
# line otherwise, on purpose: line -> what it does instead, and why.
PEER_DIFFERS = {
    "NVRM: Xid (PCI:0000:05:00): 99999, unknown error":
        None,  # more than 3 digits: a corrupted line, never a label value (docs/xid.md "Limits")
    "NVRM: Xid critical error: 79, details follow":
        None,  # no PCI address: no GPU to count it on (`check` reports the line as unreadable)
    "4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.":
        79,  # the peer drops kernel records below err level; the driver logs XIDs at warning (4)
    "3,1,1,-;nvidia-uvm: reported NVRM: Xid (PCI:0000:3b:00): 31":
        31,  # the peer wants the message to start with NVRM; a kernel record quoting one still counts
}


@pytest.mark.parametrize("case", PEER, ids=[f"{i}-{c['form']}" for i, c in enumerate(PEER)])
def test_peer_lines_keep_passing(case):
    got = _peer_reports(case)
    if case["line"] in PEER_DIFFERS:
        want = PEER_DIFFERS[case["line"]]
        assert [r.xid for r in got] == ([want] if want else []), case
        return
    if case["expect_xid"] is None:
        assert got == [], case
        return
    assert got, case
    assert (got[0].xid, got[0].pci) == (case["expect_xid"], pci_key(case["expect_pci"].removeprefix("PCI:")))
    if got[0].xid in DECODED_XIDS - {74} and "Nonfatal" in case["line"]:
        assert Policy().tier(got[0].xid, got[0].action) == "nonfatal"


# -- property: any field order and spacing the driver has used parses; Nonfatal is never an action --
def _pattern_value(pattern: str, free: int) -> int:
    v = 0
    for i, ch in enumerate(pattern):
        bit = 31 - i
        if ch == "1" or (ch == "-" and free >> bit & 1):
            v |= 1 << bit
    return v


_SPACE = st.sampled_from([" ", "  ", "   ", "\t"])
_PREFIX = st.sampled_from(["", ", pid=876767, name=ray::WorkerDict", ", pid='<unknown>', name=<unknown>",
                           ", pid=11436, name=cache_mgr_main"])


@st.composite
def nvlink5_lines(draw):
    row = draw(st.sampled_from(ROWS))
    xid, unit, v1, v2, status = row[:5]
    pattern = draw(st.sampled_from([p for p in (v1, v2) if len(p) == 32]))
    intrinfo = _pattern_value(pattern, draw(st.integers(0, 2**32 - 1)))
    severity = draw(st.sampled_from(["Fatal", "Nonfatal"]))
    sp = [draw(_SPACE) for _ in range(5)]
    shown_unit = draw(st.sampled_from([unit, unit.split("/")[0]]))
    link = draw(st.sampled_from(["00", "08", "13", "-1", "0", "17"]))
    extra = " ".join(f"0x{draw(st.integers(0, 2**32 - 1)):08x}" for _ in range(draw(st.integers(0, 4))))
    close = draw(st.sampled_from([")", "", " ...)"]))
    hexes = f"0x{intrinfo:08x}{sp[4]}0x{status:08x}" + (f" {extra}" if extra else "")
    order = draw(st.sampled_from(["unit-first", "severity-first"]))
    head = (f"{shown_unit}{sp[0]}{severity}" if order == "unit-first" else f"{severity}{sp[0]}{shown_unit}")
    line = (f"NVRM: Xid (PCI:0018:01:00): {xid}{draw(_PREFIX)}, {head}{sp[1]}XC{draw(st.integers(0, 1))}"
            f"{sp[2]}i0{sp[3]}Link {link} ({hexes}{close}")
    return line, xid, shown_unit, intrinfo, status, severity


@given(nvlink5_lines())
def test_any_nvlink5_line_parses_decodes_and_nonfatal_is_never_an_action(case):
    line, xid, unit, intrinfo, status, severity = case
    r = parse_message(line)
    assert isinstance(r, XidReport) and (r.xid, r.pci) == (xid, "00000018:01:00")
    d = from_code(r.action)
    assert d is not None and d.severity == severity.lower()
    want = table_outcomes(xid, unit, intrinfo, status)
    assert want and d.outcome == max(want, key=["ignore", "xid154", "reset"].index)
    tier = Policy().tier(r.xid, r.action)
    if severity == "Nonfatal":
        assert tier == "nonfatal"
    else:
        assert tier == {"ignore": "ignore", "xid154": "nonfatal", "reset": "reset"}[d.outcome]


@given(st.integers(74, 74) | st.integers(144, 150),
       st.sampled_from(["Nonfatal", "Non-fatal", "NonFatal", "non-fatal"]),
       st.text(alphabet=st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ_/ 0123456789x(),-"), max_size=60))
def test_no_nonfatal_line_is_ever_a_node_action(xid, word, noise):
    """Whatever else a line says (a unit the table lacks, garbage registers, none at all), a line
    that says Nonfatal lands in no reset, reboot or replace tier."""
    for line in (f"NVRM: Xid (PCI:0000:3b:00): {xid}, {noise} {word} {noise}",
                 f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, name=x, NVLink: {word} error detected on link 3"
                 f"({noise})"):
        r = parse_xid(line)
        assert r is not None and Policy().tier(r.xid, r.action) not in ACTION, line
        # and so no verdict asks for an action: the node stays schedulable
        key = count_key(r.xid, r.action)
        lines = xid_lines({key: Count(1, 1.0, 1e9)}, {key: Count(1, 1.0, 1e9)}, Policy())
        gpu = GpuInput("0", "GPU-0", "00000000:3b:00.0", None, lines)
        assert judge([gpu], None, None).verdict == "healthy"


@given(st.lists(st.integers(0, 2**32 - 1), min_size=7, max_size=7), _SPACE,
       st.sampled_from(["pid='<unknown>', name=<unknown>, ", "pid=<unknown>, name=<unknown>, ", ""]))
def test_any_xid74_line_parses_with_its_registers(regs, sp, prefix):
    line = (f"NVRM: Xid (PCI:0000:b9:00): 74, {prefix}NVLink: fatal error detected on link 6("
            + f",{sp}".join(f"0x{v:x}" for v in regs) + ")")
    r = parse_xid(line)
    assert r is not None and r.xid == 74
    d = decode(74, r.text)
    assert d is not None and d.link == 6 and d.severity == "fatal"
    assert from_code(r.action) == Decoded(d.outcome, d.severity)


# -- XID 74 by NVIDIA's WORKFLOW_NVLINK_ERR ---------------------------------------------------------------
@pytest.mark.parametrize("regs,outcome", [
    ((1 << 16, 0, 0, 0, 0, 0, 0), "reset"),  # register 0 bit 16: link mechanical: reseat, diagnostics
    ((1 << 21, 0, 0, 0, 0, 0, 0), "reset"),  # marginal signal integrity
    ((1 << 20, 0, 0, 0, 0, 0, 0), "ticket"),  # sympathetic: follow the other XIDs
    ((1 << 4, 0, 0, 0, 0, 0, 0), "ticket"),  # ECC/parity: report if more than 2 on the link
    ((0, 0, 1 << 16, 0, 0, 0, 0), "ticket"),  # register 2 bit 16: report if repeated
    ((0, 0, 0, 1 << 18, 0, 0, 0), "reset"),  # register 3 bit 18: a fabric reset is required
    ((0, 0, 0, 0, 1 << 20, 0, 0), "ignore"),  # register 4: ECC threshold, continue operation
    ((1 | 1 << 23 | 1 << 30, 0, 0, 0, 0, 0, 0), "ignore"),  # "can be safely ignored"
    ((1 << 2, 0, 0, 0, 0, 0, 0), "undecoded"),  # a bit the workflow does not list: report a bug
    ((0, 0xFFFF, 0, 0, 0, 0xFF, 0xFF), "undecoded"),  # only registers not valid for decoding
    ((1 << 16,), "undecoded"),  # not the seven registers
])
def test_xid74_registers_decode_by_nvidias_workflow(regs, outcome):
    text = "NVLink: fatal error detected on link 2(" + ", ".join(hex(v) for v in regs) + ")"
    d = decode(74, text)
    assert d is not None and d.outcome == outcome
    tier = Policy().tier(74, d.code)
    assert tier == {"reset": "reset", "ticket": "nonfatal", "ignore": "ignore", "undecoded": "reset"}[outcome]


def test_undecodable_keeps_the_conservative_tier_and_nvml_alone_is_undecoded():
    p = Policy()
    for xid in sorted(DECODED_XIDS):
        assert p.tier(xid) == "reset" and p.undecoded(xid, None)  # NVML's report: no fields
        code = Decoded("undecoded", "fatal").code
        assert p.tier(xid, code) == "reset" and p.undecoded(xid, code)
        assert not p.undecoded(xid, Decoded("ignore", "fatal").code)
    assert not p.undecoded(154, 2) and not p.undecoded(79, None)


def test_policy_overrides_the_decode_per_code_and_severity():
    nonfatal, fatal = Decoded("ignore", "nonfatal").code, Decoded("reset", "fatal").code
    p = Policy({"reboot": ["149/fatal"], "reset": ["145/nonfatal"], "ignore": [146]})
    assert p.tier(149, fatal) == "reboot" and p.tier(149, nonfatal) == "nonfatal"
    assert p.tier(145, nonfatal) == "reset" and p.tier(145, fatal) == "reset"
    assert p.tier(146, fatal) == "ignore" and p.tier(146, nonfatal) == "ignore"
    assert p.tier(147, fatal) == "reset"
    assert check_policy({"reboot": ["149/fatal", 79], "nonfatal": [13]}) is None
    for bad in ({"reboot": ["149/maybe"]}, {"reboot": ["13/fatal"]}, {"reboot": ["x"]}, {"loud": [149]}):
        assert check_policy(bad) is not None, bad


# -- one event per decode; NVML's report (no fields) joins the kernel line's --------------------------------
def test_a_nonfatal_line_never_swallows_a_fatal_one_and_nvml_joins_the_line():
    from exporter.xid.store import XID_EVENTS, EventStore, count_key

    nonfatal, fatal = Decoded("ignore", "nonfatal").code, Decoded("reset", "fatal").code
    st = EventStore(XID_EVENTS, window_s=10.0)
    assert st.report("kmsg", "00000000:75:00", 149, 100.0, 1e9, nonfatal, listed=True)
    assert st.report("kmsg", "00000000:75:00", 149, 101.0, 1e9, fatal, listed=True)  # its own event
    assert not st.report("nvml", "00000000:75:00", 149, 101.5, 1e9, listed=True)  # joins
    assert not st.report("kmsg", "00000000:75:00", 149, 102.0, 1e9, fatal, listed=True)  # same decode
    got = {k: c.count for k, c in st.snapshot()["00000000:75:00"].items()}
    assert got == {count_key(149, nonfatal): 1, count_key(149, fatal): 1}
    # NVML first (held past its grace): counted undecoded, then moved to the line's decode
    assert st.report("nvml", "00000000:86:00", 145, 200.0, 1e9, listed=True)
    assert {k: c.count for k, c in st.snapshot()["00000000:86:00"].items()} == {"145": 1}
    assert not st.report("kmsg", "00000000:86:00", 145, 200.5, 1e9, nonfatal, listed=True)
    assert {k: c.count for k, c in st.snapshot()["00000000:86:00"].items()} == {count_key(145, nonfatal): 1}
    assert Policy().tier(145, nonfatal) == "nonfatal"


def test_nvml_nvlink_xid_waits_for_the_kernel_line_that_decodes_it(tmp_path):
    """NVML's XID 149 event has no fields: the counter holds it (as XID 154's) so the kernel line
    decodes the event; a Nonfatal line then leaves no reset series and nothing undecoded."""
    import time

    from exporter.collectors.xid import XidCollector
    from exporter.runner import Runner
    from tests.helpers import samples, scrape, test_pool, value, wait_for
    from tests.test_xid_service import fake_p5, make_ctx

    fake, session = fake_p5()
    ctx = make_ctx(tmp_path, "", nvml=session, nvml_events=True, follow_poll_seconds=0.05)
    c = XidCollector(ctx)
    c.start()
    try:
        watcher = lambda: c.service.watcher  # noqa: E731 - started by c.start()
        wait_for(lambda: watcher() and watcher().status.state == "watching", START_HANG_GUARD_S,
                 "the watcher")
        fake.queue_event(6, 149)  # NVML: the XID alone
        wait_for(lambda: c.service.watcher.status.events >= 1, START_HANG_GUARD_S,
                 "the NVML event taken")  # then the line
        with open(tmp_path / "kmsg", "a") as f:
            f.write(f"4,0,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:0000:b9:00): 149, NETIR_BER_EVENT "
                    "Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000)\n")
        wait_for(lambda: c.service.store.reports.get("nvml", 0) >= 1, START_HANG_GUARD_S,
                 "NVML's report after its grace")
        text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
        assert value(text, "gpu_xid_errors_total", gpu="6", xid="149", tier="nonfatal") == 1
        assert not [1 for n, ls in samples(text) if n == "gpu_xid_errors_total" and ("tier", "reset") in ls]
        assert not [1 for n, _ in samples(text) if n == "gpu_xid_undecoded_total"]
    finally:
        c.close()


def test_an_undecodable_event_is_exported_as_undecoded_at_the_conservative_tier(tmp_path):
    from exporter.collectors.xid import XidCollector
    from exporter.runner import Runner
    from exporter.xid.service import one_shot
    from tests.helpers import promtool_check_metrics, samples, scrape, test_pool, value
    from tests.test_xid_service import make_ctx

    ctx = make_ctx(tmp_path, "4,1,5000000,-;NVRM: Xid (PCI:0018:01:00): 149, NETIR Fatal XC0 i0 Link -1 "
                             "(0x000fe406\n"  # cut short: undecodable
                             "4,2,9000000,-;NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 "
                             "Link 13 (0x0409a0c2 0x00000008 0x00000001)\n")
    one_shot(ctx)
    text = scrape(Runner([XidCollector(ctx)], deadline_s=5, pool=test_pool()))
    assert promtool_check_metrics(text) == ""
    assert value(text, "gpu_xid_errors_total", xid="149", tier="reset") == 1
    assert value(text, "gpu_xid_undecoded_total", xid="149") == 1
    assert value(text, "gpu_xid_errors_total", xid="145", tier="nonfatal") == 1
    undecoded = {dict(ls)["xid"] for n, ls in samples(text) if n == "gpu_xid_undecoded_total"}
    assert undecoded == {"149"}  # the decoded 145 has none
