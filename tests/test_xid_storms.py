"""Never falsely fatal, as an operator sees it through `check` and the node condition: an
NVLink XID lands in the tier NVIDIA's decode gives it, a root fault's storm of consequences is that
one fault, a job crash's application XIDs change no verdict, and a GPU without NVLink gets no NVLink
reason."""

from __future__ import annotations

import json

from exporter.cli import main
from exporter.health import GpuHealth
from exporter.kube.condition import desired
from exporter.xid.nvlink import Decoded
from exporter.xid.policy import Policy
from exporter.xid.store import Count, count_key
from exporter.xid.verdict import GpuInput, judge, xid_lines

# PCI addresses of the simulated p5.48xlarge's GPUs 0-7
PCI = ["0000:53:00", "0000:64:00", "0000:75:00", "0000:86:00", "0000:97:00", "0000:a8:00", "0000:b9:00",
       "0000:ca:00"]


def kmsg(lines: list[tuple[float, str]]) -> str:
    """/dev/kmsg records at the given seconds since boot (warning level, as the driver logs XIDs)."""
    return "".join(f"4,{i + 1},{int(t * 1e6)},-;{m}\n" for i, (t, m) in enumerate(lines))


def check(tmp_path, capsys, lines: list[tuple[float, str]]) -> tuple[int, dict]:
    log = tmp_path / "kmsg.txt"
    log.write_text(kmsg(lines))
    code = main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--json",
                 "--path.state-dir", str(tmp_path / "state")])
    return code, json.loads(capsys.readouterr().out)


def gpu(doc: dict, index: int) -> dict:
    return next(g for g in doc["gpus"] if g["gpu"] == index)


def test_nonfatal_nvlink_xids_are_counted_and_the_node_stays_healthy(tmp_path, capsys):
    # NVSentinel #1357's line and gpud's NVLink5 test lines, every one Nonfatal, a minute apart
    lines = [(60.0 * (i + 1), f"NVRM: Xid (PCI:{PCI[2]}): {m}") for i, m in enumerate([
        "145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 17 (0x04084507 0x00000004 0x00000000 0x00000000 0x00000000 "
        "0x00000000",
        "145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 "
        "0x00000001 0x00000000 0x00100000 0x00000004)",
        "149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000 "
        "0x00000000 0x00000000)",
        # a unit NVIDIA's table does not have: undecoded, and still never an action
        "144, SAW_EGR Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)",
    ])]
    code, doc = check(tmp_path, capsys, lines)
    assert code == 0 and doc["node"]["verdict"] == "healthy", doc["node"]
    g2 = gpu(doc, 2)
    assert g2["verdict"] == "healthy" and g2["reasons"] == []
    assert {(x["xid"], x["count"], x["tier"], x["undecoded"]) for x in g2["xids"]} == {
        (144, 1, "nonfatal", 1), (145, 2, "nonfatal", 0), (149, 1, "nonfatal", 0)}


def test_a_fatal_nvlink_xid_resets_as_nvidias_table_says_and_an_undecodable_one_stays_conservative(
        tmp_path, capsys):
    lines = [
        # NETIR_LINK_DOWN subcode 4: RESET_GPU
        (100.0, f"NVRM: Xid (PCI:{PCI[3]}): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 "
                "0x00000000 0x00000000 0x00000000 0x00000000)"),
        # NETIR_LINK_DOWN subcode 38: IGNORE, though the line says Fatal (gpud PR #1160)
        (200.0, f"NVRM: Xid (PCI:{PCI[4]}): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 "
                "0x00000000 0x00000000 0x00000000 0x00000000)"),
        # cut before its error status: undecodable, keeps XID 149's conservative tier
        (300.0, f"NVRM: Xid (PCI:{PCI[6]}): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406"),
        # XID 74, register 0 bit 20 alone: sympathetic, reported if it repeats
        (400.0, f"NVRM: Xid (PCI:{PCI[7]}): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error "
                "detected on link 14(0x100000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"),
    ]
    code, doc = check(tmp_path, capsys, lines)
    assert code == 2 and doc["node"]["verdict"] == "reset_required"
    assert (gpu(doc, 3)["verdict"], gpu(doc, 3)["xids"][0]["tier"]) == ("reset_required", "reset")
    assert (gpu(doc, 4)["verdict"], gpu(doc, 4)["xids"][0]["tier"]) == ("healthy", "ignore")
    g6 = gpu(doc, 6)
    assert g6["verdict"] == "reset_required" and g6["xids"][0]["undecoded"] == 1
    assert (gpu(doc, 7)["verdict"], gpu(doc, 7)["xids"][0]["tier"]) == ("healthy", "nonfatal")


def test_xid_45_storm_after_one_xid_79_is_that_one_fault(tmp_path, capsys):
    # GPU 5 falls off the bus; the job's other processes are torn down on every GPU for minutes, each
    # teardown an XID 45 (more than 10 s apart: separate events), as on the GB300 of NVSentinel PR #1629
    lines = [(1000.0, f"NVRM: Xid (PCI:{PCI[5]}): 79, pid=1234, GPU has fallen off the bus.")]
    for k in range(60):
        for i in range(8):
            lines.append((1001.0 + 15 * k + i / 10, f"NVRM: Xid (PCI:{PCI[i]}): 45, pid={4000 + i}, "
                          f"name=python3, Ch 0000000{k % 10} caused by previous Xid 79"))
    code, doc = check(tmp_path, capsys, lines)
    assert code == 2 and doc["node"]["reasons"] == ["xid_reboot"]
    assert [g["gpu"] for g in doc["gpus"] if g["verdict"] != "healthy"] == [5]
    assert all(x["tier"] == "application" for g in doc["gpus"] for x in g["xids"] if x["xid"] == 45)
    assert sum(x["count"] for g in doc["gpus"] for x in g["xids"] if x["xid"] == 45) == 480


def test_a_job_crash_flood_of_13_31_43_changes_no_verdict(tmp_path, capsys):
    lines = []
    for k in range(40):  # 40 crashes and restarts of the job, 20 s apart, on every GPU
        for i in range(8):
            t = 500.0 + 20 * k + i / 100
            lines += [(t, f"NVRM: Xid (PCI:{PCI[i]}): 13, pid=7, name=python3, Graphics SM Warp Exception on "
                          f"(GPC {j}, TPC 1, SM 0): Out Of Range Address") for j in range(4)]
            lines += [(t + 0.001, f"NVRM: Xid (PCI:{PCI[i]}): 31, pid=7, name=python3, Ch 00000003, intr "
                                  "10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted"),
                      (t + 0.002, f"NVRM: Xid (PCI:{PCI[i]}): 43, pid=7, name=python3, Ch 00000008")]
    code, doc = check(tmp_path, capsys, lines)
    assert code == 0 and doc["node"]["verdict"] == "healthy" and doc["node"]["reasons"] == []
    g0 = gpu(doc, 0)
    assert {(x["xid"], x["count"]) for x in g0["xids"]} == {(13, 40), (31, 40), (43, 40)}


def test_the_node_condition_follows_the_decoded_tier():
    policy = Policy()
    nonfatal = count_key(149, Decoded("ignore", "nonfatal").code)
    fatal = count_key(149, Decoded("reset", "fatal").code)

    def verdict(key: str):
        counts = {key: Count(1, 10.0, 1e9)}
        lines = xid_lines(counts, counts, policy)
        return judge([GpuInput("0", "GPU-0", "00000000:53:00.0", None, lines)], None, None)

    d = desired(verdict(nonfatal), [])
    assert (d.status, d.reason, d.taint) == ("True", "Healthy", False)
    d = desired(verdict(fatal), [])
    assert (d.status, d.reason, d.taint) == ("False", "ResetRequired", True)


def test_a_gpu_without_nvlink_gets_no_nvlink_reason():
    """A PCIe GPU: NVML answers NOT_SUPPORTED to its NVLink and fabric calls (NVSentinel PR #1481),
    so the GPU reading has no fabric state and no links; no reason of the verdict is about NVLink."""
    h = GpuHealth(index=0, uuid="GPU-0", pci_bus_id="00000000:53:00.0", read_ok=True)
    assert h.fabric_state is None
    nv = judge([GpuInput("0", "GPU-0", "00000000:53:00.0", h, [])], None, None, uptime_s=1e6)
    assert nv.verdict == "healthy" and nv.gpus[0].reasons == [] and nv.gpus[0].fabric_state is None
