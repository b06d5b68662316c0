"""XID lines from outside the field set, checked independently of it: lines from other projects'
tests, issues and NVIDIA's catalog that tests/fixtures/xid/field_lines.jsonl and the peers' 150 lines
do not hold (tests/fixtures/xid/external_lines.jsonl, each with its source and the class NVIDIA's
catalog gives it, `nvidia`). Each must parse and land in the tier the catalog asks for; where the
project's default differs from the catalog on purpose (docs/xid.md "Where the default differs"),
`nvidia` says so and the tier is the project's.

And, from the other side, the whole policy against the catalog: no code whose immediate action
NVIDIA gives as RESTART_APP or IGNORE is a node action (a false fatal), none NVIDIA resets or
reboots for is milder (a missed fault), except the deliberate differences docs/xid.md lists."""

from __future__ import annotations

import json

import pytest

from exporter.xid.catalog import CATALOG
from exporter.xid.nvlink import DECODED_XIDS, from_code
from exporter.xid.parser import parse_xid
from exporter.xid.policy import TIERS, Policy
from tests.helpers import FIXTURES

EXTERNAL = [json.loads(line) for line in (FIXTURES / "xid" / "external_lines.jsonl").read_text().splitlines()]
ACTION = ("reset", "reboot", "replace")


@pytest.mark.parametrize("case", EXTERNAL, ids=[f"{i}-{c['xid']}" for i, c in enumerate(EXTERNAL)])
def test_external_lines_classify_as_the_catalog_says(case):
    r = parse_xid(case["line"])
    assert r is not None and r.xid == case["xid"], case["source"]
    assert Policy().tier(r.xid, r.action) == case["tier"], (case["line"], case["nvidia"])
    if r.xid in DECODED_XIDS:
        d = from_code(r.action) if r.action is not None else None
        assert d is not None, case["line"]
        assert f"{d.outcome}/{d.severity or '-'}" == case["decode"], (case["line"], case["nvidia"])


def test_external_nonfatal_lines_are_never_a_node_action():
    nonfatal = [c for c in EXTERNAL if "Nonfatal" in c["line"]]
    assert nonfatal
    for c in nonfatal:
        r = parse_xid(c["line"])
        assert r is not None and Policy().tier(r.xid, r.action) not in ACTION, c["line"]


# NVIDIA's immediate action -> the tiers that follow it. IGNORE may be `application` (43 and 137:
# NVIDIA says the application's fault), never an action.
FOLLOWS = {"RESTART_APP": {"application"}, "IGNORE": {"ignore", "application"}, "RESET_GPU": {"reset"},
           "RESTART_BM": {"reboot"}, "RESTART_VM": {"reboot"}}
# The deliberate differences docs/xid.md gives its reasons for (memory errors page for replacement;
# 160's channel repair reboots), tier they take instead.
DELIBERATE = {63: "replace", 64: "replace", 94: "replace", 95: "replace", 160: "reboot"}


@pytest.mark.parametrize("xid", sorted(CATALOG))
def test_no_default_tier_strays_from_nvidias_immediate_action(xid):
    info = CATALOG[xid]
    follows = FOLLOWS.get(info.nvidia_action)
    tier = Policy().tier(xid)
    assert tier in (*TIERS, "unknown")
    if xid in DELIBERATE:
        assert tier == DELIBERATE[xid]
    elif follows is not None:
        assert tier in follows, f"XID {xid}: NVIDIA {info.nvidia_action}, tier {tier}"


def test_xid_154_asks_for_what_nvml_s_recovery_action_means():
    """XID 154 names NVML's recovery action (field 230) in its line; its tier is what that action
    means, as the verdict reads the same value from NVML: 0x3, drain P2P (drain the peer-to-peer
    work, then query again), and 0x5, recover the IMEX domain, are no node action there, so not
    here either."""
    from exporter.xid.verdict import ALL_REASONS, RECOVERY_REASON

    p = Policy()
    line = ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x3 "
            "(Drain P2P)")
    r = parse_xid(line)
    assert r is not None and r.action == 3 and p.tier(r.xid, r.action) not in ACTION
    for code in range(1, 8):  # 0: none; a code without a reason of its own is recovery_action_other
        reason = RECOVERY_REASON.get(code, "recovery_action_other")
        acts = ALL_REASONS[reason] in ("reset_required", "reboot_required", "replace_required")
        assert (p.tier(154, code) in ACTION) == acts, (code, reason)
    assert p.tier(154, 0) == "ignore"


def test_a_nonfatal_nvlink_storm_and_its_xid_45s_leave_the_node_schedulable(tmp_path, capsys):
    """The storm of the field (a B300's RLW_SRC_TRACK Nonfatal XC1 storm on several links during
    the first all-reduce, torn-down channels logged as XID 45 `caused by previous Xid 145`, the
    driver's XID 154 asking to drain P2P): counted, nothing asks for an action, `check` exits 0 and
    the node condition stays True without a taint."""
    from exporter.kube.condition import TAINTED, condition_of
    from tests.test_xid_storms import PCI, check

    lines: list[tuple[float, str]] = []
    for k in range(30):
        for i in range(8):
            t = 100.0 + 11 * k + i / 100
            lines.append((t, f"NVRM: Xid (PCI:{PCI[i]}): 145, RLW_SRC_TRACK Nonfatal XC1 i0 "
                             f"Link {11 + k % 5} (0x04084507 0x00000004 0x00000000 0x00000000 0x00000000 "
                             "0x00000000)"))
            lines.append((t + 0.5, f"NVRM: Xid (PCI:{PCI[i]}): 45, pid={900 + i}, name=python3, "
                                   f"Ch 0000000{k % 8} caused by previous Xid 145"))
    lines += [(500.0 + i, f"NVRM: Xid (PCI:{PCI[i]}): 154, GPU recovery action changed from 0x0 (None) to "
                          "0x3 (Drain P2P)") for i in range(8)]
    code, doc = check(tmp_path, capsys, lines)
    assert code == 0 and doc["node"]["verdict"] == "healthy", doc["node"]
    verdict = doc["node"]["verdict"]
    assert condition_of(verdict) == ("True", "Healthy") and verdict not in TAINTED
    assert all(g["verdict"] == "healthy" for g in doc["gpus"])
    tiers = {(x["xid"], x["tier"]) for g in doc["gpus"] for x in g["xids"]}
    assert tiers == {(145, "nonfatal"), (45, "application"), (154, "nonfatal")}


SXID = [json.loads(line)
        for line in (FIXTURES / "xid" / "external_sxid_lines.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("case", SXID, ids=[f"{i}-{c['sxid']}" for i, c in enumerate(SXID)])
def test_external_sxid_lines_classify_as_the_fabric_manager_guide_says(case):
    from exporter.xid.sxid import SxidReport, parse_sxid
    from exporter.xid.sxid_catalog import SxidPolicy

    r = parse_sxid(case["line"])
    assert isinstance(r, SxidReport), case["source"]
    assert (r.sxid, r.severity) == (case["sxid"], case["severity"])
    assert SxidPolicy().tier(r.sxid, r.severity) == case["tier"], (case["line"], case["fabric_manager"])
