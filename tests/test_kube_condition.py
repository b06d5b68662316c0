"""The verdict -> GpuHealthy mapping, the taint/label plan and the writer thread, without a server
(tests/test_kubernetes.py runs them against a real kube-apiserver)."""

from __future__ import annotations

import threading

import pytest

from exporter.kube import client as kube
from exporter.kube.condition import (
    CONDITIONS,
    MESSAGE_LIMIT,
    Desired,
    bound,
    condition_of,
    desired,
)
from exporter.kube.writer import LABEL_KEY, LABEL_VALUE, OWNER_ANNOTATION, TAINT_KEY, Options, Writer, plan
from exporter.xid.verdict import VERDICTS, GpuVerdict, NodeVerdict, XidLine
from tests.helpers import START_HANG_GUARD_S, test_pool, wait_for


def test_every_verdict_state_has_a_condition_and_anything_else_is_unknown():
    # a new verdict state fails here until it has its row (its condition is Unknown meanwhile)
    assert not set(VERDICTS) - set(CONDITIONS), "map every verdict state in exporter/kube/condition.py"
    assert condition_of("healthy") == ("True", "Healthy")
    assert condition_of("replace_required") == ("False", "ReplaceRequired")
    for other in ("unknown", "some_state_added_later", ""):
        assert condition_of(other)[0] == "Unknown"


def node(verdict: str, gpu_verdict: str = "healthy") -> NodeVerdict:
    bad = gpu_verdict != "healthy"
    x = XidLine(94, "replace", 1, 0.0, False, "ECC")
    g = GpuVerdict("1", "GPU-1", "00000000:64:00.0", gpu_verdict, ["xid_replace"] * bad, [x] * bad)
    return NodeVerdict(verdict, list(g.reasons), [g], 8, 8)


def test_the_exporters_own_trouble_is_unknown_unless_action_is_already_shown():
    assert desired(None, []).status == "Unknown"
    d = desired(node("healthy"), [("KernelLogUnparsable", "kernel log x: none of its lines")])
    assert (d.status, d.reason, d.taint, d.replace) == ("Unknown", "KernelLogUnparsable", None, None)
    d = desired(node("degraded", "degraded"), [("NvmlUnavailable", "NVML: no driver")])
    assert d.status == "Unknown"
    # check's rule: what could be read already shows action is required -> it stands
    d = desired(node("replace_required", "replace_required"), [("NvmlUnavailable", "NVML: no driver")])
    assert (d.status, d.reason, d.taint, d.replace) == ("False", "ReplaceRequired", True, True)
    d = desired(node("unknown"), [])
    assert (d.status, d.taint, d.replace) == ("Unknown", None, None)


def test_message_names_gpu_and_xid_and_is_bounded():
    d = desired(node("replace_required", "replace_required"), [])
    assert "GPU 1 00000000:64:00.0 replace_required (xid_replace): XID 94 x1" in d.message
    assert desired(node("healthy"), []).message == "all 8 GPUs healthy"
    long = bound("é" * 5000)
    assert len(long.encode()) <= MESSAGE_LIMIT and long.endswith("[... cut]")


def want(status: str = "False", reason: str = "ReplaceRequired", taint: bool | None = True,
         replace: bool | None = True) -> Desired:
    return Desired(status, reason, "m", taint, replace)


def a_node(taints=(), labels=None, owns: str | None = None) -> dict:
    ann = {OWNER_ANNOTATION: owns} if owns is not None else {}
    return {"metadata": {"resourceVersion": "7", "labels": labels or {}, "annotations": ann},
            "spec": {"taints": list(taints)}}


BOTH = Options(taint=True, hyperpod_label=True)
OURS = {"key": TAINT_KEY, "value": "ReplaceRequired", "effect": "NoSchedule"}
OTHER = {"key": "example.com/other", "effect": "NoSchedule"}


def test_plan_sets_then_removes_only_what_it_owns():
    p = plan(a_node([OTHER]), want(), BOTH)
    assert p == {"metadata": {"resourceVersion": "7", "labels": {LABEL_KEY: LABEL_VALUE},
                              "annotations": {OWNER_ANNOTATION: "label,taint"}},
                 "spec": {"taints": [OTHER, OURS]}}
    set_ = a_node([OTHER, OURS], {LABEL_KEY: LABEL_VALUE}, "label,taint")
    assert plan(set_, want(), BOTH) is None  # already so
    cleared = plan(set_, want("True", "Healthy", False, False), BOTH)
    assert cleared == {"metadata": {"resourceVersion": "7", "labels": {LABEL_KEY: None},
                                    "annotations": {OWNER_ANNOTATION: None}}, "spec": {"taints": [OTHER]}}
    assert plan(set_, want("Unknown", "NvmlUnavailable", None, None), BOTH) is None  # left as it was


def test_plan_never_touches_another_agents_taint_or_label():
    theirs = a_node([{**OURS, "value": "theirs"}], {LABEL_KEY: LABEL_VALUE})
    assert plan(theirs, want(), BOTH) is None
    assert plan(theirs, want("True", "Healthy", False, False), BOTH) is None
    # HyperPod changed the label we set: it is theirs now; we only drop our claim
    changed = a_node([], {LABEL_KEY: "UnschedulablePendingReboot"}, "label")
    assert plan(changed, want("True", "Healthy", False, False), BOTH) == {
        "metadata": {"resourceVersion": "7", "annotations": {OWNER_ANNOTATION: None}}}


def test_plan_replaces_hyperpods_healthy_value_and_puts_it_back():
    healthy = a_node([], {LABEL_KEY: "Schedulable"})
    p = plan(healthy, want(taint=None), BOTH)
    assert p["metadata"]["labels"] == {LABEL_KEY: LABEL_VALUE}
    assert p["metadata"]["annotations"] == {OWNER_ANNOTATION: "label=Schedulable"}
    ours = a_node([], {LABEL_KEY: LABEL_VALUE}, "label=Schedulable")
    assert plan(ours, want("True", "Healthy", False, False), BOTH)["metadata"] == {
        "resourceVersion": "7", "labels": {LABEL_KEY: "Schedulable"}, "annotations": {OWNER_ANNOTATION: None}}
    # HyperPod's own verdicts are its own
    assert plan(a_node([], {LABEL_KEY: "UnschedulablePendingReboot"}), want(taint=None), BOTH) is None


def test_plan_with_one_option_off():
    p = plan(a_node(), want(), Options(taint=True))
    assert p["spec"]["taints"] == [OURS] and "labels" not in p["metadata"]
    assert plan(a_node(), want("False", "RebootRequired", True, False), Options(hyperpod_label=True)) is None


class FakeClient:
    """The Client's calls, kept in memory; `gate` (when set) holds every call until released."""

    node = "n1"

    def __init__(self, conditions=None, fail: list[str] | None = None) -> None:
        self.conditions = conditions or []
        self.fail = fail or []
        self.calls: list[str] = []
        self.gate: threading.Event | None = None

    def _enter(self, name: str) -> None:
        if self.gate is not None:
            self.gate.wait()
        self.calls.append(name)
        if self.fail:
            raise kube.ApiError(self.fail.pop(0), f"{name} failed")

    def read_status(self) -> dict:
        self._enter("read")
        return {"status": {"conditions": list(self.conditions)}}

    def patch_status(self, body: dict) -> dict:
        self._enter("patch")
        self.conditions = body["status"]["conditions"]
        return {"status": {"conditions": list(self.conditions)}}

    def close(self) -> None:
        pass


@pytest.fixture
def writer():
    made: list[Writer] = []

    def make(client: FakeClient, **opts) -> Writer:
        w = Writer(lambda: client, Options(**{"retry_min_s": 0.05, "retry_max_s": 0.2, **opts}))
        w.start()
        made.append(w)
        return w
    yield make
    for w in made:
        w.close()


def test_offer_never_waits_for_the_server_and_the_write_follows(writer):
    c = FakeClient()
    c.gate = threading.Event()
    w = writer(c)
    offers = threading.Thread(target=lambda: [w.offer(want("True", "Healthy", False, False))
                                              for _ in range(100)], daemon=True)
    offers.start()
    # the server holds every call until the gate opens; the offers end all the same
    wait_for(lambda: not offers.is_alive(), START_HANG_GUARD_S, "100 offers while the server holds its calls")
    c.gate.set()
    wait_for(lambda: c.conditions and c.conditions[0]["status"] == "True", START_HANG_GUARD_S, "the write")
    assert w.state.up and c.calls == ["read", "patch"]


def test_transition_time_kept_from_the_server_and_failures_retried(writer):
    old = {"type": "GpuHealthy", "status": "False", "reason": "ReplaceRequired",
           "lastTransitionTime": "2026-01-01T00:00:00Z"}
    c = FakeClient([old], fail=["server", "conflict"])
    w = writer(c)
    w.offer(want())
    wait_for(lambda: w.state.up, START_HANG_GUARD_S, "the write after two failures")
    assert c.conditions[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert w.state.errors["server"] == 1 and w.state.errors["conflict"] == 1
    w.offer(want("True", "Healthy", False, False))
    wait_for(lambda: c.conditions[0]["status"] == "True", START_HANG_GUARD_S, "the change")
    assert c.conditions[0]["lastTransitionTime"] != "2026-01-01T00:00:00Z"


def test_heartbeat_rewrites_an_unchanged_condition(writer):
    c = FakeClient()
    w = writer(c, heartbeat_s=0.2)
    w.offer(want())
    wait_for(lambda: c.calls.count("patch") >= 3, START_HANG_GUARD_S, "heartbeat writes")


def test_a_poke_collects_and_writes_at_once_without_a_scrape_or_heartbeat(writer):
    """What an XID, an ack or a lost GPU does (exporter.xid.service on_change -> Writer.poke): the
    writer asks for a collection and writes its verdict, with the heartbeat an hour away."""
    c = FakeClient()
    w = writer(c, heartbeat_s=3600.0, poke_min_s=3600.0)
    healthy, fault = want("True", "Healthy", False, False), want()
    collected: list[Desired] = []

    def collect() -> None:  # the runner's collection: the Kubernetes collector offers its verdict
        collected.append(fault)  # the XID the poke announced is in it
        w.offer(fault)
    w.collect = collect
    w.offer(healthy)
    wait_for(lambda: c.conditions and c.conditions[0]["status"] == "True", START_HANG_GUARD_S,
             "the first write")
    assert collected == []  # offers alone never collect
    for _ in range(50):  # a flood pokes on every kernel-log read
        w.poke()
    wait_for(lambda: c.conditions[0]["status"] == "False", START_HANG_GUARD_S, "the poked collection written")
    # the pokes that came while it ran fold into one more collection, not before poke_min_s
    w.offer(healthy)
    wait_for(lambda: c.conditions[0]["status"] == "True", START_HANG_GUARD_S, "a later offer written")
    assert len(collected) == 1


def test_pokes_without_a_collect_function_are_harmless(writer):
    c = FakeClient()
    w = writer(c)
    w.poke()
    w.offer(want())
    wait_for(lambda: w.state.up, START_HANG_GUARD_S, "the write")


def test_token_is_read_again_when_the_file_changes(tmp_path):
    f = tmp_path / "token"
    f.write_text("one\n")
    t = kube.Token(str(f))
    assert t.get() == "one"
    new = tmp_path / "token.new"
    new.write_text("two")
    new.replace(f)
    assert t.get() == "two"
    f.write_text("")
    with pytest.raises(kube.ApiError) as e:
        t.get()
    assert e.value.kind == "config"


def test_in_cluster_endpoint_and_its_absence():
    env = {"KUBERNETES_SERVICE_HOST": "10.100.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    ep = kube.endpoint("", "", "", env)
    assert (ep.url, ep.token_file) == ("https://10.100.0.1:443", kube.TOKEN_FILE)
    assert kube.endpoint("", "", "", {"KUBERNETES_SERVICE_HOST": "fd00::1",
                                      "KUBERNETES_SERVICE_PORT": "443"}).url == "https://[fd00::1]:443"
    with pytest.raises(kube.ApiError, match="KUBERNETES_SERVICE_HOST"):
        kube.endpoint("", "", "", {})


def test_the_collector_gets_this_collections_verdict_and_nvml_trouble_is_unknown(tmp_path):
    """A derived collector on a derived one: the runner runs the verdict first whatever the order."""
    from exporter.collectors.gpu import GpuCollector
    from exporter.collectors.health import HealthCollector
    from exporter.collectors.kubernetes import KubernetesCollector
    from exporter.runner import Runner
    from tests.helpers import scrape, value
    from tests.test_health_collector import p5
    from tests.test_xid_service import make_ctx

    _, ctx = p5(tmp_path / "ok")
    runner = Runner([KubernetesCollector(ctx), HealthCollector(ctx), GpuCollector(ctx)], deadline_s=5,
            pool=test_pool())
    scrape(runner)  # the kernel log not read yet (no follower), no state file: cannot tell
    assert runner.readings["kubernetes"].reason == "KernelLogNotRead"
    runner.close()
    ctx.xid.read_kmsg()  # as the daemon's follower does
    runner = Runner([KubernetesCollector(ctx), HealthCollector(ctx), GpuCollector(ctx)], deadline_s=5,
            pool=test_pool())
    text = scrape(runner)
    d = runner.readings["kubernetes"]
    assert (d.status, d.reason, d.taint, d.replace) == ("True", "Healthy", False, False), d
    assert value(text, "gpu_health_exporter_kubernetes_up") == 0  # never started: nothing written
    runner.close()
    ctx = make_ctx(tmp_path / "no-nvml", "")  # NVML init fails: the verdict says unknown
    runner = Runner([KubernetesCollector(ctx), GpuCollector(ctx), HealthCollector(ctx)], deadline_s=5,
            pool=test_pool())
    scrape(runner)
    d = runner.readings["kubernetes"]
    assert runner.readings["health"].verdict == "unknown"
    assert (d.status, d.reason, d.taint, d.replace) == ("Unknown", "NvmlUnavailable", None, None)
    runner.close()
