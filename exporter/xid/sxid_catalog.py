"""NVSwitch SXid catalog and policy: what each code means, how the Fabric Manager user guide
classes it and what it says to do, and which verdict tier an SXid lands in.

Sources: NVIDIA Fabric Manager User Guide (release 2.3), tables "Non-Fatal / Fatal / Always Fatal
/ Other Notable NVSwitch SXid Errors"; code names from open-gpu-kernel-modules
`ctrl_dev_nvswitch.h`. Codes 27000-30999 were renumbered between driver 545 and 550 (28006 is a
multicast timeout on 535 and an OSFP thermal event on 550+), so they are described by block only.

Policy (configurable, `sxid.policy`): the severity token on the line decides by default. A fatal
SXid takes `sxid.fatal_tier` (reboot: on an EC2 P5 a VM restart is how the GPUs and NVSwitches
get reset, and one NVSwitch down fails fabric registration for all 8 GPUs, so a fatal SXid is a
node fault); non-fatal and correctable ones are counted and ticketed by rate, not acted on; a
line without a severity token is `unknown` (degraded, visible). Codes the guide says need a VM
restart although non-fatal (11004, 12028) default to reboot. Explicit entries in `sxid.policy`
win over the severity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.xid.policy import check_tiers

TIERS = ("replace", "reboot", "ignore")


@dataclass(frozen=True)
class SxidInfo:
    sxid: int
    name: str
    fm_class: str  # the guide's class: non-fatal, fatal, always-fatal, notable, or "" (not in the guide)
    action: str  # what the guide says to do


_NONE = "none (hardware corrects it)"
_ACCESS = "reset the GPU (access port) or the GPUs behind the trunk; on EC2 restart the instance"
_ALWAYS = "restart the host, or reset all NVSwitches and GPUs"

_ENTRIES = [
    SxidInfo(10001, "Host PRIV error", "notable", "none; may precede fatal errors"),
    SxidInfo(10002, "Host PRIV timeout", "notable", "none; may precede fatal errors"),
    SxidInfo(10003, "Host unhandled interrupt", "notable", "never expected: reset all GPUs and NVSwitches"),
    SxidInfo(10004, "Host thermal event start", "notable", "check cooling; links may drop to one lane"),
    SxidInfo(10005, "Host thermal event end", "notable", "none"),
    SxidInfo(10006, "Host thermal shutdown", "", "no documented action"),
    SxidInfo(10007, "Host IO failure", "", "no documented action"),
    SxidInfo(11001, "Ingress invalid command", "fatal", _ACCESS),
    SxidInfo(11004, "Ingress invalid ACL", "non-fatal",
             "traffic stalls, CUDA jobs abort (Xid 45): validate routing, restart the VM"),
    SxidInfo(11009, "Ingress invalid VCSet", "fatal", _ACCESS),
    SxidInfo(11013, "Ingress header DBE", "fatal", _ACCESS),
    SxidInfo(11018, "Ingress RID DBE", "fatal", _ACCESS),
    SxidInfo(11019, "Ingress RLAN DBE", "fatal", _ACCESS),
    SxidInfo(11020, "Ingress control parity", "fatal", _ACCESS),
    SxidInfo(12001, "Egress crossbar overflow", "fatal", _ACCESS),
    SxidInfo(12002, "Egress packet route", "fatal", _ACCESS),
    SxidInfo(12020, "Egress sequence ID error", "always-fatal", _ALWAYS),
    SxidInfo(12022, "Egress input ECC DBE", "fatal", _ACCESS),
    SxidInfo(12024, "Egress output ECC DBE", "fatal", _ACCESS),
    SxidInfo(12025, "Egress credit overflow", "fatal", _ACCESS),
    SxidInfo(12026, "Egress destination request ID error", "fatal", _ACCESS),
    SxidInfo(12027, "Egress destination response ID error", "fatal", _ACCESS),
    SxidInfo(12028, "Egress non-posted PRIV error", "non-fatal",
             "traffic stalls, CUDA jobs abort (Xid 45): restart the VM"),
    SxidInfo(12030, "Egress control parity", "fatal", _ACCESS),
    SxidInfo(12031, "Egress credit parity", "fatal", _ACCESS),
    SxidInfo(12032, "Egress flit type mismatch", "fatal", _ACCESS),
    SxidInfo(14017, "TS ATO timeout", "fatal", _ACCESS),
    SxidInfo(15001, "Route buffer overflow", "fatal", _ACCESS),
    SxidInfo(15006, "Route transdone overflow", "fatal", _ACCESS),
    SxidInfo(15009, "Route GLT DBE", "fatal", _ACCESS),
    SxidInfo(15010, "Route parity", "fatal", _ACCESS),
    SxidInfo(15012, "Route incoming DBE", "fatal", _ACCESS),
    SxidInfo(15013, "Route credit parity", "fatal", _ACCESS),
    SxidInfo(19047, "NCISOC header ECC DBE", "fatal", _ACCESS),
    SxidInfo(19048, "NCISOC data ECC DBE", "fatal", _ACCESS),
    SxidInfo(19084, "AN1 heartbeat timeout", "non-fatal",
             "usually accompanied by a fatal SXid: reset all GPUs and NVSwitches"),
    SxidInfo(20001, "TX replay error", "non-fatal", "none; possible throughput loss"),
    SxidInfo(20009, "RX short error rate", "", "none; link errors"),
    SxidInfo(20012, "Broken/inconsistent connection (RX CRC counter)", "non-fatal",
             "unless it was a shutdown, check the link mechanics"),
    SxidInfo(20034, "LTSSM fault up (link went down)", "fatal",
             "A100: restart the VM; H100: reset the GPU (on EC2: restart the instance)"),
    SxidInfo(22003, "Minion halt", "always-fatal", _ALWAYS),
    SxidInfo(22011, "Minion external error", "always-fatal", _ALWAYS),
    SxidInfo(22012, "Minion link NA interrupt", "fatal", "check the link mechanics"),
    SxidInfo(22013, "Minion link DLREQ interrupt", "non-fatal", "safe to ignore"),
    SxidInfo(24004, "Sourcetrack TCEN0 crumbstore DBE", "fatal", _ACCESS),
    SxidInfo(24005, "Sourcetrack TCEN0 TD crumbstore DBE", "fatal", _ACCESS),
    SxidInfo(24006, "Sourcetrack TCEN1 crumbstore DBE", "fatal", _ACCESS),
    SxidInfo(24007, "Sourcetrack timeout", "fatal", _ACCESS),
    SxidInfo(26006, "SOE halted", "", "no documented action"),
    SxidInfo(26008, "SOE watchdog", "", "no documented action"),
]
_SBE = (11012, 11021, 11022, 11023, 12021, 12023, 15008, 15011, 19049, 19055, 19057, 19059, 19062, 19065,
        19068, 19071, 24001, 24002, 24003)
_ENTRIES += [SxidInfo(c, "Single-bit ECC error (corrected)", "non-fatal", _NONE) for c in _SBE]
_DBE = (19054, 19056, 19058, 19060, 19061, 19063, 19064, 19066, 19067, 19069, 19070)
_ENTRIES += [SxidInfo(c, "RAM ECC DBE", "fatal", _ACCESS) for c in _DBE]
_ENTRIES += [SxidInfo(c, "NXBAR error", "always-fatal", _ALWAYS) for c in range(23001, 23018)]

CATALOG: dict[int, SxidInfo] = {e.sxid: e for e in _ENTRIES}

# Blocks of the driver's enum, to name codes the guide does not describe.
BLOCKS = [(10000, "host"), (11000, "NPORT ingress"), (12000, "NPORT egress"), (13000, "NPORT Fstate"),
          (14000, "NPORT Tstate"), (15000, "NPORT route"), (16000, "NPORT"), (17000, "NVLCTRL"),
          (18000, "NVLIPT"), (19000, "NVLTLC"), (20000, "DLPL (link layer)"), (21000, "AFS"),
          (22000, "MINION"), (23000, "NXBAR (crossbar)"), (24000, "NPORT sourcetrack"),
          (25000, "NVLIPT link"), (26000, "SOE"), (27000, "CCI / multicast / reduction (driver-specific)")]


def describe(sxid: int) -> str:
    """The code's name, or its block's for a code the guide does not list."""
    info = CATALOG.get(sxid)
    if info is not None:
        return info.name
    block = next((name for start, name in reversed(BLOCKS) if sxid >= start), "")
    return f"{block} error" if block and sxid < 31000 else ""


# Codes that take a tier whatever their line's severity (the guide: restart the VM).
DEFAULT_POLICY: dict[str, list[int]] = {"reboot": [11004, 12028]}
SEVERITY_TIER = {"non_fatal": "ignore", "correctable": "ignore", "unknown": "unknown"}


def check_policy(value: Any) -> str | None:
    """Config check for `nvswitch.policy`."""
    return check_tiers(value, TIERS, "SXid")


def check_fatal_tier(value: Any) -> str | None:
    return None if value in ("replace", "reboot") else "replace or reboot"


class SxidPolicy:
    """Tier of an SXid report: an explicit code entry, else by the line's severity."""

    def __init__(self, overrides: Mapping[str, list[int]] | None = None, fatal_tier: str = "reboot") -> None:
        self.fatal_tier = fatal_tier
        self.codes: dict[int, str] = {}
        for source in (DEFAULT_POLICY, overrides or {}):
            for tier, codes in source.items():
                for c in codes:
                    self.codes[c] = tier

    def tier(self, sxid: int, severity: str) -> str:
        explicit = self.codes.get(sxid)
        if explicit is not None:
            return explicit
        if severity == "fatal":
            return self.fatal_tier
        return SEVERITY_TIER.get(severity, "unknown")
