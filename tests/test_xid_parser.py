"""Kernel-log parsing: /dev/kmsg records and every NVRM XID variant (pure functions)."""

from exporter.xid.kmsg import parse_record
from exporter.xid.nvlink import Decoded
from exporter.xid.parser import (
    BusLossStart,
    GpuAt,
    KernelLogParser,
    XidReport,
    parse_message,
    pci_key,
    pci_label,
)
from tests.helpers import FIXTURES

KMSG = FIXTURES / "kmsg"


def test_record_format_and_facility():
    r = parse_record("4,360,29419687,c;NVRM: Xid (PCI:0000:00:06): 31, pid=446, name=python3, channel 0xa")
    assert (r.prio, r.seq, r.usec, r.flags) == (4, 360, 29419687, "c")
    assert r.kernel and r.message.startswith("NVRM: Xid")
    assert not parse_record("12,5,100,-;NVRM: Xid (PCI:0000:00:06): 79, injected").kernel  # user space
    assert parse_record("6,3964,206764307,-,caller=T1;x").seq == 3964  # extra header fields
    for bad in ("no semicolon", "a,b,c,d;msg", "4,1;short header"):
        assert parse_record(bad) is None


def test_real_capture_has_one_xid_31_and_the_gpu_mapping():
    parser = KernelLogParser()
    out = []
    for line in (KMSG / "kmsg_nvidia.txt").read_text().splitlines():
        rec = parse_record(line)
        assert rec is not None and rec.kernel
        p = parser.feed(rec.message)
        if p is not None:
            out.append(p)
    assert out == [
        GpuAt("00000000:00:06", "GPU-5d849bfd-1fd8-d42f-aa96-a7c78683d9fe"),
        XidReport("00000000:00:06", 31, "446", "python3", None, None, out[1].text, "xid"),
    ]
    assert out[1].text.startswith("channel 0x0000000a")


def test_pci_forms_map_to_one_key():
    forms = ["0000:3b:00", "0000:3B:00.0", "00000000:3B:00.0", "PCI:0000:3b:00"]
    assert {pci_key(f) for f in forms} == {"00000000:3b:00"}
    assert pci_label("00000000:3b:00") == "00000000:3B:00.0"  # NVML's pci_bus_id form
    assert pci_key("0018:01:00") == "00000018:01:00"


def test_xid_line_variants():
    cases = {
        # message -> (pci, xid, pid, name, gpu instance, action)
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.":
            ("00000000:3b:00", 79, "1234", None, None, None),
        "NVRM: Xid (PCI:0000:3b:00): 43, pid='<unknown>', name=<unknown>, Ch 00000008":
            ("00000000:3b:00", 43, "<unknown>", "<unknown>", None, None),
        "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting":
            ("00000000:9b:00", 119, "2024380", "nvidia-smi", None, None),
        "NVRM: Xid (PCI:0000:9b:00): 62, pid=5, name=nvc:[driver], 0000a2e5":
            ("00000000:9b:00", 62, "5", "nvc:[driver]", None, None),
        "NVRM: Xid (PCI:0000:9b:00): 48, An uncorrectable double bit error (DBE) has been detected":
            ("00000000:9b:00", 48, None, None, None, None),
        "NVRM: Xid (0000:03:00): 14, Channel 00000001":  # legacy: no PCI:
            ("00000000:03:00", 14, None, None, None, None),
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No":
            ("00000000:01:00", 94, "7194", None, 5, None),
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)":
            # NVIDIA's decode: NETIR_LINK_DOWN subcode 4, RESET_GPU (exporter/xid/nvlink.py)
            ("00000018:01:00", 149, None, None, None, Decoded("reset", "fatal").code),
        "NVRM: Xid (PCI:0000:b3:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
        "(Node Reboot Required)": ("00000000:b3:00", 154, None, None, None, 2),
        # R610 wording: the label changed, the hex code did not
        "NVRM: Xid (PCI:0000:b3:00): 154, pid=3, name=x, GPU recovery action changed from 0x0 (None) to "
        "0x2 (OS Reboot)": ("00000000:b3:00", 154, "3", "x", None, 2),
        "NVRM: Xid (PCI:0000:b3:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)":
            ("00000000:b3:00", 154, None, None, None, 1),
        "NVRM: Xid (PCI:0000:3b:00): 74, pid=9, NVLink: fatal error detected on link 6(0x10000, 0x0)":
            # two registers of the seven: NVIDIA's workflow cannot be applied, so undecoded
            ("00000000:3b:00", 74, "9", None, None, Decoded("undecoded", "fatal").code),
    }
    for msg, want in cases.items():
        r = parse_message(msg)
        assert isinstance(r, XidReport), msg
        assert (r.pci, r.xid, r.pid, r.name, r.gpu_instance, r.action) == want, msg


def test_bus_loss_without_xid_number_is_xid_79():
    one = parse_message("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.")
    assert isinstance(one, XidReport) and (one.pci, one.xid, one.form) == ("00000000:01:00", 79, "bus_loss")
    assert parse_message("NVRM: The NVIDIA GPU 0000:b3:00.0") == BusLossStart("00000000:b3:00", False)
    p = KernelLogParser()
    got = [p.feed(m) for m in ("NVRM: The NVIDIA GPU 0000:b3:00.0",
                               "NVRM: (PCI ID: 10de:26b5) installed in this system has",
                               "NVRM: fallen off the bus and is not responding to commands.")]
    assert got[:2] == [None, None]
    assert isinstance(got[2], XidReport) and (got[2].pci, got[2].xid) == ("00000000:b3:00", 79)
    # the same notice in one record (a saved log that joined the lines)
    whole = p.feed("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has "
                   "fallen off the bus and is not responding to commands.")
    assert isinstance(whole, XidReport) and whole.xid == 79
    # a different "The NVIDIA GPU" notice is not a bus loss, and the pending state expires
    assert p.feed("NVRM: The NVIDIA GPU 0000:b3:00.0") is None
    for _ in range(4):
        assert p.feed("NVRM: something unrelated") is None
    assert p.feed("NVRM: fallen off the bus and is not responding to commands.") is None


def test_not_xids():
    for msg in ("nvidia-nvlink: Nvlink Core is being initialized", "NVRM: GPU Board Serial Number: 1",
                "usb 1-1: new device", "NVRM: Xid without a proper header", ""):
        assert parse_message(msg) is None
