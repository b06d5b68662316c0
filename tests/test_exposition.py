"""/metrics' metric model and renderer: collectors' families are prometheus_client's, rendered
directly from the runner's collection; the cached fast renderer is byte for byte prometheus_client's renderers
(`generate_latest` and the OpenMetrics one) on a few simulated scenarios that together touch every
kind of family, and on generated edge cases (the property test covers every value and label);
escaping, number formatting and content negotiation are right."""

import gzip

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as ClientSample

from exporter import catalog, collectors
from exporter.arguments import build_parser
from exporter.catalog import Families, MetricSpec, all_specs, define
from exporter.collection import Collection
from exporter.exposition import encode, negotiate, render
from exporter.metric import Sample
from exporter.runner import Runner
from exporter.startup import build_context
from exporter.tools.simulate import all_scenarios
from exporter.web.server import families
from tests.helpers import promtool_check_metrics, test_pool

GAUGE = MetricSpec("gpu_test_tricky", "gauge", 'help with \\ backslash, "quotes"\nand a newline',
                   ("path", "n"), "", "test")
COUNTER = MetricSpec("gpu_test_things_total", "counter", "Things.", ("k",), "", "test")


def _samples(fams):
    # repr: NaN equals only itself as text.
    return sorted((s.name, tuple(sorted(s.labels.items())), repr(float(s.value)))
                  for f in fams for s in f.samples)


def _tricky():
    out = Families()
    out.add(GAUGE, 1234567.0, path='C:\\dir "x"\nnext', n=1)
    out.add(GAUGE, 0.000125, path="plain", n=2)
    out.add(GAUGE, 2.0**64, path="big", n=3)
    out.add(GAUGE, -3.0, path="neg", n=4)
    out.add(GAUGE, float("inf"), path="inf", n=5)
    out.add(GAUGE, float("nan"), path="nan", n=6)
    out.add(GAUGE, 999999.9999999999, path="below 1e6", n=7)
    out.add(GAUGE, 1e6, path="1e6", n=8)
    out.add(COUNTER, 7, k="a")
    out.add(COUNTER, 12.5, k="b")
    out.add_samples(COUNTER, [Sample(COUNTER.name, {"k": "prepared"}, 3)])  # an int value, as prepared
    return list(out)


def assert_same_as_prometheus_client(fams) -> None:
    """Our renderer's bytes are prometheus_client's, through a real CollectorRegistry."""

    class Fixed:
        def collect(self):
            return fams

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Fixed())
    assert render(fams) == generate_latest(reg)
    assert render(fams, openmetrics=True) == om_generate_latest(reg)


def test_collectors_families_are_prometheus_clients():
    """The model is prometheus_client's: Families makes its Metrics; Sample is its Sample."""
    assert Sample is ClientSample
    fams = _tricky()
    assert all(type(f) is prometheus_client.Metric for f in fams)
    assert all(type(s) is ClientSample for f in fams for s in f.samples)
    assert [f.name for f in fams] == ["gpu_test_tricky", "gpu_test_things"]  # counters without _total
    assert {s.name for s in fams[1].samples} == {"gpu_test_things_total"}


def test_byte_identical_to_prometheus_client_on_edge_cases():
    fams = _tricky()
    assert_same_as_prometheus_client(fams)
    # and the parsers agree on what the text means
    assert _samples(text_string_to_metric_families(render(fams).decode())) == _samples(fams)
    assert _samples(om_parse(render(fams, openmetrics=True).decode())) == _samples(fams)


@given(st.floats() | st.integers()
       | st.sampled_from([1e6, 1e7, 12345678.0, 1e16, 1.5e22, -1e7, 5e-324, -0.0, 999999.9999999999]),
       st.text(max_size=20))
def test_any_value_and_label_value_render_as_prometheus_client_does(v, label):
    out = Families()
    out.add(GAUGE, v if not isinstance(v, int) else float(v), path=label, n=0)
    out.add_samples(COUNTER, [Sample(COUNTER.name, {"k": label}, v)])  # prepared: any number type
    assert_same_as_prometheus_client(list(out))


@pytest.mark.parametrize("first, then", [(0.0, -0.0), (-0.0, 0.0), (1, 1.0), (1.0, 1), (0, 0.0),
                                         (2.0, 2.0), (2.0, 3.0), (float("nan"), float("nan"))])
def test_a_family_rendered_again_shows_its_new_values_however_they_compare(first, then):
    """A family whose samples equal its last rendering's reuses that text, but not when a value
    compares equal and is spelled differently (0.0 and -0.0, 1 and 1.0)."""
    for v in (first, then, first):
        out = Families()
        out.add_samples(COUNTER, [Sample(COUNTER.name, {"k": "a"}, v)])
        out.add_samples(GAUGE, [Sample(GAUGE.name, {"path": "p", "n": "1"}, v)])
        assert_same_as_prometheus_client(list(out))


def test_the_catalog_makes_the_checks_a_registry_would():
    """What direct rendering relies on (docs/design.md): a metric name is declared once, and is a
    gauge or a counter, the types the renderer handles."""
    spec = define("gpu_test_once", "gauge", "Declared once.", collector="gpu")
    try:
        with pytest.raises(ValueError, match="declared twice"):
            define("gpu_test_once", "gauge", "Again.", collector="gpu")
    finally:
        catalog.forget(spec.name)
    for kind in ("info", "histogram", "summary", "stateset", "unknown"):
        with pytest.raises(ValueError, match="gauge or counter"):
            define("gpu_test_kind", kind, "Not rendered.", collector="gpu")


def _collect_scenario(scenario: str | None, config) -> Collection:
    """One collection of a simulated p5.48xlarge with every detail on, after the scenario's onset."""
    argv = ["--simulate", "p5.48xlarge", "--config", str(config)]
    if scenario:
        argv += ["--scenario", scenario]
    ctx, sim = build_context(build_parser().parse_args(argv))
    runner = Runner(collectors.build(ctx), 1.0, pool=test_pool())
    try:
        ctx.nvml.ensure()
        sim.play(60.0)  # every scenario's onset is behind us (its fake NVML's too)
        return runner.collect()
    finally:
        runner.close()
        release = getattr(ctx.nvml.backend, "release", None)
        if release is not None:
            release()  # a hung fake NVML call (gpu-nvml-hang) returns, so its thread can end
        sim.close()


@pytest.fixture(scope="module")
def every_detail(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "all.yml"
    cfg.write_text("efa:\n  counters: all\ngpu:\n  detail: all\nlustre:\n  per_target: true\n")
    return cfg


# A healthy node with every detail on, and faults that add or remove families: a lost GPU, counted
# XIDs and SXids, an evicted Lustre client, Slurm jobs on the GPUs. Each builds a simulated node:
# the rest of the scenarios add values, not shapes, which the property test above covers.
SCENARIOS = [None, "gpu-lost", "xid-94", "sxid-fatal", "lustre-eviction", "slurm-job"]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_byte_identical_to_prometheus_client_on_simulated_scenarios(scenario, every_detail):
    assert scenario is None or scenario in all_scenarios()
    fams = families(_collect_scenario(scenario, every_detail))  # as /metrics renders it
    assert sum(len(f.samples) for f in fams) > 500
    assert_same_as_prometheus_client(fams)


@pytest.mark.slow
def test_a_simulated_p5_passes_promtool_and_parses_to_the_collected_samples(every_detail):
    collection = _collect_scenario(None, every_detail)
    # What a prometheus_client registry's duplicate check would see: each family once, in the part
    # of the collector the catalog gives it (collect[] filters by part).
    owner = {spec.name.removesuffix("_total"): spec.collector for spec in all_specs()}
    assert len(collection.parts) > 5
    for part, fams in collection.parts.items():
        assert {owner[f.name] for f in fams} <= {part}, part
    fams = families(collection)
    names = [f.name for f in fams]
    assert len(names) == len(set(names))
    ours = render(fams).decode()
    assert len(_samples(fams)) > 1500
    assert _samples(text_string_to_metric_families(ours)) == _samples(fams)
    assert _samples(om_parse(render(fams, openmetrics=True).decode())) == _samples(fams)
    assert promtool_check_metrics(ours) == ""


def test_metrics_renders_each_collectors_part_of_the_collection_it_serves():
    from tests.test_runner import Probe

    runner = Runner([Probe("alpha"), Probe("broken", "raise"), Probe("beta")], deadline_s=1, pool=test_pool())
    try:
        first = runner.collect()
        second = runner.collect()
        assert first is not second
        order = [(f.name, *(s.labels.get("source", "") for s in f.samples)) for f in families(first)]
        probe = "gpu_health_exporter_test_probe"
        assert order[:2] == [(probe, "alpha"), (probe, "beta")]  # the failed collector has no part
        assert list(first.parts) == ["alpha", "beta", "exporter"]
        assert order[2][0] == "gpu_health_exporter_collector_success"
        assert order[-1][0].startswith("process_")
        # a scrape serving the first collection renders that one, though a later one has finished
        served = {s.name: s.value for f in families(first) for s in f.samples if not s.labels}
        assert served["gpu_health_exporter_collections_total"] == 1
        # collect[]: the wanted collectors' parts, the runner's own series, success only for them
        beta = families(second, {"beta"})
        assert [s.labels["source"] for f in beta if f.name == probe for s in f.samples] == ["beta"]
        success = {s.labels["collector"]: s.value for f in beta for s in f.samples
                   if s.name == "gpu_health_exporter_collector_success"}
        assert success == {"beta": 1}
        assert {f.name for f in beta} >= {"gpu_health_exporter_build_info", "process_resident_memory_bytes"}
        assert len(next(f for f in second if f.name == "gpu_health_exporter_collector_success").samples) == 3
    finally:
        runner.close()


def test_negotiation_and_gzip():
    prometheus_accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                         "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    assert negotiate(prometheus_accept)
    assert not negotiate("text/plain;version=0.0.4")
    assert not negotiate("")
    body, headers = encode(_tricky(), prometheus_accept, "gzip")
    h = dict(headers)
    assert h["Content-Type"].startswith("application/openmetrics-text")
    assert h["Content-Encoding"] == "gzip" and "Content-Length" not in h  # the server sets it once
    assert gzip.decompress(body).decode().endswith("# EOF\n")
