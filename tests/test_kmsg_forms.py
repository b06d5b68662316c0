"""A kernel log is read whole or not trusted: `check --kmsg-file` takes /dev/kmsg records,
`dmesg`, `dmesg -T`, `journalctl -k` (short, short-iso, short-precise, short-monotonic) and syslog
lines, or a mix, and counts their XIDs and SXids as the daemon would; a line that names an XID or
SXid it cannot read makes the answer 3, never 0."""

from __future__ import annotations

import json
import time

import pytest

from exporter.cli import main
from exporter.xid import textlog
from exporter.xid.kmsg import KmsgReader
from exporter.xid.service import one_shot
from tests.test_xid_service import counts, make_ctx

XID94 = "NVRM: Xid (PCI:0000:53:00): 94, pid=4121, name=python3, Contained: SM (0x1). RST: No, D-RST: No"
XID63 = "NVRM: Xid (PCI:0000:75:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked"
SXID = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
WALL = time.mktime((2026, 11, 27, 10, 14, 9, 0, 0, -1))  # the local time the forms below print

FORMS = {
    "kmsg": "4,812,5123456789,-;{m}",
    "dmesg": "[ 5123.456789] {m}",
    "dmesg -T": "[Fri Nov 27 10:14:09 2026] {m}",
    "dmesg iso": "2026-11-27T10:14:09,000000{tz} {m}",
    "dmesg -x": "kern  :warn  : [ 5123.456789] {m}",
    "journalctl short": "Nov 27 10:14:09 ip-10-1-2-3 kernel: {m}",
    "journalctl short-precise": "Nov 27 10:14:09.123456 ip-10-1-2-3 kernel: {m}",
    "journalctl short-iso": "2026-11-27T10:14:09{tz} ip-10-1-2-3 kernel: {m}",
    "journalctl short-iso-precise": "2026-11-27T10:14:09.123456{tz} ip-10-1-2-3 kernel: {m}",
    "journalctl short-monotonic": "[ 5123.456789] ip-10-1-2-3 kernel: {m}",
    "syslog": "Nov 27 10:14:09 ip-10-1-2-3 kernel: [ 5123.456789] {m}",
    "syslog with pri": "<4>Nov 27 10:14:09 ip-10-1-2-3 kernel: {m}",
    "syslog rfc5424": "<4>1 2026-11-27T10:14:09.000000{tz} ip-10-1-2-3 kernel - - - {m}",
}


def _tz() -> str:
    off = time.localtime(WALL).tm_gmtoff
    return "{}{:02d}:{:02d}".format("+" if off >= 0 else "-", abs(off) // 3600, abs(off) % 3600 // 60)


def line(form: str, message: str) -> str:
    return FORMS[form].format(m=message, tz=_tz())


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_parses_to_the_kernel_s_message(form):
    got = line(form, XID94)
    if form == "kmsg":
        return  # the record form is exporter.xid.kmsg's own (tests/test_xid_kmsg.py)
    t = textlog.parse_line(got)
    assert t is not None and t.message == XID94 and t.kernel
    assert t.kernel_s is not None or t.wall is not None
    if t.wall is not None:
        assert abs(t.wall - WALL) < 1


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_counts_its_xids_and_sxids_as_the_daemon_would(tmp_path, form):
    text = "\n".join([
        line(form, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07"),
        line(form, XID94), line(form, XID94),  # the same event twice (within 10 s): counted once
        line(form, SXID),
    ]) + "\n"
    if form == "kmsg":  # records need their own sequence numbers
        text = "".join(f"4,{800 + i},{5123456789 + i},-;{m}\n" for i, m in enumerate(
            ["NVRM: loading", XID94, XID94, SXID]))
    ctx = make_ctx(tmp_path, text)
    svc = one_shot(ctx)
    assert counts(svc) == {("00000000:53:00", "94"): 1}
    snap = svc.snapshot()
    assert [(x.sxid, x.severity, x.count) for x in snap.sxids] == [(20034, "fatal", 1)]
    assert snap.kmsg.stats.unparsed_faults == 0
    if textlog.parse_line(line(form, XID94)) and textlog.parse_line(line(form, XID94)).wall is not None:
        [x] = snap.xids["00000000:53:00"]
        assert abs(x.last_seen - WALL) < 1  # the line's own time, not when it was read


@pytest.mark.parametrize("form", sorted(FORMS))
def test_an_xid_line_no_parser_reads_is_counted_as_unparsed_in_every_form(tmp_path, form):
    cut = "NVRM: Xid (PCI:0000:53:0"  # cut off inside the report
    if form == "kmsg":
        text = f"4,800,5123456789,-;{cut}\n"
    else:
        text = line(form, cut) + "\n"
    r = KmsgReader(str(tmp_path / "log"))
    (tmp_path / "log").write_text(text + "4,900,6000000000,-;NVRM: nothing\n")
    list(r.read_available())
    assert r.stats.unparsed_faults == 1 and cut in r.stats.last_unparsed_fault


def test_a_flood_s_lines_are_readable_and_a_cut_line_after_it_is_still_unparsed(tmp_path):
    """The reader takes a line starting with the last readable XID's header as readable without
    parsing it again (a flood); a line that only looks like it is still checked whole."""
    flood = [f"4,{n},{5_000_000 + n},-;NVRM: Xid (PCI:0000:53:00): 13, pid=42, name=python3, SM {n % 2}"
             for n in range(50)]
    cut = "NVRM: Xid (PCI:0000:53:00): 1"  # another XID's header cut short: not the flood's
    other = "NVRM: Xid (PCI:0000:zz:00): 13, pid=42"  # not a PCI address a parser reads
    (tmp_path / "log").write_text("\n".join([*flood, f"4,60,6000000000,-;{cut}3x",
                                             f"4,61,6000000001,-;{other}"]) + "\n")
    r = KmsgReader(str(tmp_path / "log"))
    assert len(list(r.read_available())) == 52
    assert r.stats.unparsed_faults == 1 and other in r.stats.last_unparsed_fault


def test_another_program_s_line_is_read_never_counted(tmp_path):
    text = "Nov 27 10:14:09 ip-10-1-2-3 python3[4121]: " + XID94 + "\n-- Boot 3f2a --\n"
    ctx = make_ctx(tmp_path, text)
    svc = one_shot(ctx)
    assert counts(svc) == {}
    assert svc.snapshot().kmsg.stats.malformed == 0  # the journal's boot line is no line of the log


def test_a_mix_of_records_and_text_lines_counts_every_xid(tmp_path):
    """Records with a `dmesg -T` XID 94 line among them are not healthy: the line is read, not dropped."""
    text = "".join([
        "6,1,0,-;Linux version 6.1.0\n",
        f"4,400,40000000,-;{XID63}\n",
        f"[Fri Nov 27 10:14:09 2026] {XID94}\n",
        f"Nov 27 10:15:09 ip-10-1-2-3 kernel: {SXID}\n",
        "4,401,50000000,-;NVRM: GPU at PCI:0000:53:00: GPU-34173249-2645-505b-b4c8-589b62677791\n",
    ])
    svc = one_shot(make_ctx(tmp_path, text))
    assert counts(svc) == {("00000000:75:00", "63"): 1, ("00000000:53:00", "94"): 1}
    assert [x.sxid for x in svc.snapshot().sxids] == [20034]


def _check(capsys, tmp_path, text: str, *extra: str) -> tuple[int, dict]:
    log = tmp_path / "kernel.log"
    log.write_text(text)
    code = main(["check", "--simulate", "p5.48xlarge", "--path.state-dir", str(tmp_path / "st"),
                 "--kmsg-file", str(log), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_check_on_a_mixed_log_with_an_xid_94_is_not_healthy(tmp_path, capsys):
    text = f"6,1,0,-;Linux version 6.1.0\n4,2,1000000,-;NVRM: loading\n[Fri Nov 27 10:14:09 2026] {XID94}\n"
    code, doc = _check(capsys, tmp_path, text)
    assert code == 2 and doc["node"]["verdict"] != "healthy"
    g0 = next(g for g in doc["gpus"] if g["gpu"] == 0)
    assert [x["xid"] for x in g0["xids"]] == [94] and doc["problems"] == []


def test_check_on_a_log_with_an_unreadable_xid_line_answers_3_never_0(tmp_path, capsys):
    text = "4,1,1000000,-;NVRM: loading\nNov 27 10:14:09 ip-10-1-2-3 kernel: NVRM: Xid (PCI:0000:53:0\n"
    code, doc = _check(capsys, tmp_path, text)
    assert code == 3 and doc["node"]["verdict"] == "unknown"
    assert any("name an XID or SXid report that could not be read" in p for p in doc["problems"])
    # a line that looks like an SXid but is none the parser reads: the same
    code, doc = _check(capsys, tmp_path, "4,1,1000000,-;nvidia-nvswitch1: SXid (PCI:garbage\n")
    assert code == 3


def test_a_regular_file_it_may_not_read_gets_a_file_hint_not_the_cap_syslog_one(tmp_path):
    """A mode-000 log file was told about /dev/kmsg and CAP_SYSLOG."""
    import errno

    from exporter.xid.follower import read_error_hint

    log = tmp_path / "saved.log"
    log.write_text("4,1,1,-;NVRM: x\n")
    log.chmod(0)
    hint = read_error_hint(str(log), errno.EACCES)
    assert "CAP_SYSLOG" not in hint and "mode and owner" in hint
    assert "CAP_SYSLOG" in read_error_hint("/dev/null", errno.EPERM)  # a character device
    assert read_error_hint(str(log), errno.ENOENT) == ""
