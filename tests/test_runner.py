"""The collection framework: deadlines, failure isolation, shared in-flight collections."""

import logging
import threading
import time

from exporter.catalog import MetricSpec
from exporter.collector import Collector, Derived, Failed
from exporter.compose import compose
from exporter.config import load
from exporter.runner import Runner
from tests.helpers import (
    DEADLINE_MARGIN_S,
    HANG_GUARD_S,
    START_HANG_GUARD_S,
    samples,
    scrape,
    test_pool,
    value,
)

# The tests' own metric: a spec of their own, never declared in the product's catalog.
PROBE = MetricSpec("gpu_health_exporter_test_probe", "gauge", "Test-only metric.", ("source",), "", "test")


class Probe(Collector):
    def __init__(self, name, behaviour="ok", delay=0.0):
        self.name = name
        super().__init__(compose(load(None)))
        self.behaviour, self.delay, self.calls = behaviour, delay, 0
        self.release = threading.Event()

    def collect(self, out):
        self.calls += 1
        time.sleep(self.delay)
        if self.behaviour == "raise":
            raise OSError("source vanished")
        if self.behaviour == "hang":
            self.release.wait(HANG_GUARD_S)  # far beyond any deadline under test: until released
        out.add(PROBE, 1, source=self.name)


def test_failing_and_hanging_collectors_do_not_take_others_down(caplog):
    good, bad, hung = Probe("good"), Probe("bad", "raise"), Probe("hung", "hang")
    r = Runner([good, bad, hung], deadline_s=0.3, pool=test_pool())
    t = time.monotonic()
    s = samples(scrape(r))
    assert time.monotonic() - t < DEADLINE_MARGIN_S  # the 0.3 s deadline, not the hang
    assert value(s, "gpu_health_exporter_test_probe", source="good") == 1
    assert not any(n == "gpu_health_exporter_test_probe" and ("source", "hung") in ls for n, ls in s)
    assert value(s, "gpu_health_exporter_collector_success", collector="good") == 1
    assert value(s, "gpu_health_exporter_collector_success", collector="bad") == 0
    assert value(s, "gpu_health_exporter_collector_success", collector="hung") == 0
    assert value(s, "gpu_health_exporter_collector_duration_seconds", collector="hung") >= 0.3
    # A collector still stuck is not started again on the next scrape.
    s2 = samples(scrape(r))
    assert hung.calls == 1
    assert value(s2, "gpu_health_exporter_collector_success", collector="hung") == 0
    assert value(s2, "gpu_health_exporter_collector_duration_seconds", collector="hung") == 0.3
    hung.release.set()
    # Once its stuck read returns, the collector runs again (wait for that, however loaded the host).
    deadline = time.monotonic() + START_HANG_GUARD_S
    while True:
        s3 = samples(scrape(r))
        ok = value(s3, "gpu_health_exporter_collector_success", collector="hung") == 1
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert value(s3, "gpu_health_exporter_collector_success", collector="hung") == 1
    assert hung.calls == 2
    r.close()


def test_a_hung_collector_listed_first_does_not_take_the_others_down():
    """The collectors after a hung one are still read in that scrape (on another worker)."""
    hung, good = Probe("hung", "hang"), Probe("good")
    r = Runner([hung, good], deadline_s=0.3, pool=test_pool())
    for _ in range(2):  # the scrape that finds it hung, and the next (still stuck: not started)
        s = samples(scrape(r))
        assert value(s, "gpu_health_exporter_test_probe", source="good") == 1
        assert value(s, "gpu_health_exporter_collector_success", collector="good") == 1
        assert value(s, "gpu_health_exporter_collector_success", collector="hung") == 0
    assert hung.calls == 1
    hung.release.set()
    r.close()


def test_errors_logged_on_state_change_only(caplog):
    caplog.set_level(logging.INFO)
    bad = Probe("bad", "raise")
    r = Runner([bad], deadline_s=1, pool=test_pool())
    for _ in range(5):
        scrape(r)
    errors = [rec for rec in caplog.records if "collector bad failed" in rec.getMessage()]
    assert len(errors) == 1
    bad.behaviour = "ok"
    scrape(r)
    assert any("collector bad recovered" in rec.getMessage() for rec in caplog.records)
    r.close()


def test_twenty_concurrent_scrapes_share_one_collection():
    slow = Probe("slow", delay=0.3)
    r = Runner([slow], deadline_s=5, pool=test_pool())
    results, barrier = [], threading.Barrier(20)

    def one():
        barrier.wait()
        results.append(scrape(r))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert slow.calls == 1
    assert len(results) == 20
    for text in results:
        s = samples(text)
        assert value(s, "gpu_health_exporter_test_probe", source="slow") == 1
        assert value(s, "gpu_health_exporter_collections_total") == 1
    r.close()


def test_ready_after_first_collection():
    r = Runner([Probe("a")], deadline_s=1, pool=test_pool())
    assert not r.ready.is_set()
    scrape(r)
    assert r.ready.is_set()
    r.close()


def test_problem_log_says_each_change_once(caplog):
    from exporter.collector import ProblemLog

    caplog.set_level(logging.INFO)
    p = ProblemLog(logging.getLogger("test.problems"))
    for _ in range(3):
        p.report("GPU 3", "Timeout")
    p.report("GPU 3", "GPU is lost")
    p.report("GPU 3", "")
    p.report("GPU 3", "")
    p.report("mount /fsx", "statvfs failed")
    p.forget(lambda subject: subject.startswith("mount "))
    p.report("mount /fsx", "")  # forgotten: nothing to clear, nothing logged
    assert [r.getMessage() for r in caplog.records if r.name == "test.problems"] == [
        "GPU 3: Timeout", "GPU 3: GPU is lost", "GPU 3: fine again", "mount /fsx: statvfs failed"]


# --- derived collectors: explicit dependencies within one collection ----------------------------
class Source(Probe):
    """A probe that returns a reading: which collection of its own it is."""

    def collect(self, out):
        super().collect(out)
        if self.behaviour == "fail-with-reading":
            raise Failed("source unusable", f"failure reading {self.calls}")
        return f"reading {self.calls}"


class Verdict(Derived):
    depends_on = ("src",)

    def __init__(self, name="verdict"):
        self.name = name
        super().__init__(compose(load(None)))
        self.seen, self.started = [], []

    def derive(self, out, inputs):
        self.started.append(time.monotonic())
        self.seen.append(inputs["src"])
        out.add(PROBE, 1, source=self.name)
        return f"verdict from {inputs['src']}"


def test_derived_collector_gets_its_dependency_s_reading_of_the_same_collection():
    src, v = Source("src", delay=0.2), Verdict()
    r = Runner([v, src], deadline_s=2, pool=test_pool())  # listed first: the runner still waits for its input
    for _ in range(3):
        t = time.monotonic()
        s = samples(scrape(r))
        assert value(s, "gpu_health_exporter_collector_success", collector="verdict") == 1
        # started once the source was done, not after a poll or a timer
        assert 0.2 <= v.started[-1] - t < 0.2 + 0.5
    assert v.seen == ["reading 1", "reading 2", "reading 3"]
    assert r.readings == {"src": "reading 3", "verdict": "verdict from reading 3"}
    r.close()


def test_derived_collector_inputs_when_the_dependency_fails_hangs_or_is_absent():
    # raised: None; raised with Failed(reading): that reading
    src, v = Source("src", "raise"), Verdict()
    r = Runner([src, v], deadline_s=2, pool=test_pool())
    s = samples(scrape(r))
    assert v.seen == [None] and value(s, "gpu_health_exporter_collector_success", collector="verdict") == 1
    src.behaviour = "fail-with-reading"
    s = samples(scrape(r))
    assert v.seen[-1] == "failure reading 2"
    assert value(s, "gpu_health_exporter_collector_success", collector="src") == 0
    r.close()
    # missed its deadline: None, and the verdict is still served within its own deadline
    hung, v = Source("src", "hang"), Verdict()
    # the scrape's own deadline is a hang guard: only the source's 0.3 s deadline keeps it short
    r = Runner([hung, v], deadline_s=START_HANG_GUARD_S, deadlines={"src": 0.3}, pool=test_pool())
    t = time.monotonic()
    s = samples(scrape(r))
    assert time.monotonic() - t < DEADLINE_MARGIN_S
    assert v.seen == [None] and value(s, "gpu_health_exporter_collector_success", collector="verdict") == 1
    s = samples(scrape(r))  # still stuck from the first collection: None at once, not an old reading
    assert v.seen == [None, None] and hung.calls == 1
    hung.release.set()
    r.close()
    # not enabled (not built): None
    v = Verdict()
    r = Runner([v], deadline_s=1, pool=test_pool())
    scrape(r)
    assert v.seen == [None]
    r.close()
