"""The verdict: XID tiers since boot less acks, and the NVML state the GPU collector publishes."""

from exporter.health import GpuHealth, NodeGpuHealth
from exporter.xid.policy import Policy
from exporter.xid.store import Count
from exporter.xid.verdict import (
    ALL_REASONS,
    VERDICTS,
    GpuVerdict,
    gpu_reasons,
    node_verdict,
    worst,
    xid_lines,
)

P = Policy()


def lines(counts, unacked=None):
    cs = {k: Count(n, 1.0, 1700000000.0) for k, n in counts.items()}
    return xid_lines(cs, cs if unacked is None else {k: cs[k] for k in unacked}, P)


def test_default_tiers_and_xid_154_follows_its_action():
    assert [P.tier(x) for x in (63, 64, 94, 95)] == ["replace"] * 4
    assert P.tier(79) == "reboot"
    assert [P.tier(x) for x in (13, 31, 43, 45, 68, 137)] == ["application"] * 6
    assert [P.tier(x) for x in (48, 62, 74, 109, 110, 119, 120, 136, 140, 143, 155, 158)] == ["reset"] * 12
    assert P.tier(92) == "ignore" and P.tier(4242) == "unknown"
    assert (P.tier(154, 0), P.tier(154, 1), P.tier(154, 2)) == ("ignore", "reset", "reboot")
    assert P.tier(154) == "reset"  # NVML's XID 154 event carries no action code
    pinned = Policy({"ignore": [154], "application": [63]})
    assert pinned.tier(154, 2) == "ignore" and pinned.tier(63) == "application"
    assert pinned.tier(64) == "replace"


def test_xid_reasons_are_sticky_until_acknowledged():
    ls = lines({"63": 1, "31": 5, "92": 1, "4242": 1})
    assert gpu_reasons(None, ls, False) == ["xid_replace", "xid_unknown"]  # application/ignore: no reason
    acked = lines({"63": 1, "31": 5}, unacked=["31"])
    assert gpu_reasons(None, acked, False) == []
    assert [x.acknowledged for x in acked] == [False, True]  # 31 then 63, sorted by XID


def test_nvml_state_reasons():
    h = GpuHealth(0, "u", "00000000:53:00.0", row_remap_pending=True, recovery_action=2,
                  ecc_uncorrected_volatile=1)
    assert gpu_reasons(h, [], False) == ["recovery_action_reboot", "row_remap_pending", "uncorrected_ecc"]
    assert gpu_reasons(GpuHealth(0, "u", "p", row_remap_failure=True), [], False) == ["row_remap_failure"]
    assert gpu_reasons(GpuHealth(0, "u", "p", recovery_action=3), [], False) == ["recovery_action_drain"]
    # The preview-only codes map as XID 154's action codes do.
    assert gpu_reasons(GpuHealth(0, "u", "p", recovery_action=6), [], False) == ["recovery_action_reset"]
    assert gpu_reasons(GpuHealth(0, "u", "p", recovery_action=7), [], False) == ["recovery_action_reboot"]
    assert gpu_reasons(GpuHealth(0, "u", "p", recovery_action=5), [], False) == ["recovery_action_other"]
    assert gpu_reasons(GpuHealth(0, "u", "p", recovery_action=5), [], False) == ["recovery_action_other"]
    assert gpu_reasons(GpuHealth(0, "u", "p"), [], True) == ["gpu_lost"]


def test_node_verdict_takes_the_worst_and_adds_node_reasons():
    g = [GpuVerdict("0", "u0", "p0", "reset_required", ["xid_reset"]),
         GpuVerdict("1", "u1", "p1", "replace_required", ["row_remap_failure"])]
    nv = node_verdict(g, NodeGpuHealth(count=7, expected=8), None)
    assert nv.verdict == "replace_required"
    assert nv.reasons == ["row_remap_failure", "gpu_count_below_expected", "xid_reset"]
    healthy = node_verdict([GpuVerdict("0", "u", "p")], NodeGpuHealth(count=8, expected=None), 8)
    assert (healthy.verdict, healthy.reasons, healthy.expected_gpus) == ("healthy", [], 8)
    no_nvml = node_verdict([], NodeGpuHealth(count=0, nvml_error="NVML could not be initialised"), 8)
    assert (no_nvml.verdict, no_nvml.reasons) == ("unknown", ["nvml_unavailable"])  # never healthy


def test_a_gpu_that_does_not_answer_is_unknown_then_reboot_required():
    """The GPU's reads overran the deadline (unanswered_s set) or failed (read_ok off)."""
    from exporter.xid.verdict import UNRESPONSIVE_S, GpuInput, judge

    hung = GpuHealth(3, "u", "p", unanswered_s=0.0)
    assert gpu_reasons(hung, [], False) == ["gpu_not_answering"]
    long = GpuHealth(3, "u", "p", unanswered_s=UNRESPONSIVE_S)
    assert gpu_reasons(long, [], False) == ["gpu_unresponsive"]
    assert gpu_reasons(GpuHealth(3, "u", "p", unanswered_s=5.0), [], False, unresponsive_s=2.0) == \
        ["gpu_unresponsive"]
    assert gpu_reasons(GpuHealth(3, "u", "p", read_ok=False), [], False) == ["gpu_not_read"]
    assert gpu_reasons(GpuHealth(3, "u", "p", lost=True, read_ok=False), [], False) == ["gpu_lost"]
    nv = judge([GpuInput("3", "u", "p", hung, []), GpuInput("0", "u0", "p0", GpuHealth(0, "u0", "p0"), [])],
               NodeGpuHealth(count=8, expected=8), 8)
    assert nv.verdict == "unknown" and [g.verdict for g in nv.gpus] == ["healthy", "unknown"]
    # what could be read and says "act" wins over unknown
    assert worst(["unknown", "reset_required"]) == "reset_required"
    assert worst(["degraded", "unknown"]) == "unknown"


def test_reason_set_is_bounded_and_levels_are_verdicts():
    assert set(ALL_REASONS.values()) <= set(VERDICTS)
    assert worst([]) == "healthy"
    assert worst(["degraded", "reboot_required", "reset_required"]) == "reboot_required"
