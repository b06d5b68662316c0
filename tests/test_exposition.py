"""The /metrics renderer: the same samples as prometheus_client's renderers, in both formats,
with escaping, number formatting and content negotiation right."""

import gzip

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families

from exporter import collectors
from exporter.cli import build_context, build_parser
from exporter.exposition import encode, negotiate, render
from exporter.runner import Runner
from tests.helpers import promtool_check_metrics


def _samples(families):
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in families for s in f.samples)


def _oracle(metrics, openmetrics=False):
    class Fixed:
        def collect(self):
            return metrics

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Fixed())
    return (om_generate_latest if openmetrics else generate_latest)(reg).decode()


def _tricky():
    g = GaugeMetricFamily("gpu_test_tricky", 'help with \\ backslash, "quotes"\nand a newline',
                          labels=["path", "n"])
    g.add_metric(['C:\\dir "x"\nnext', "1"], 1234567.0)
    g.add_metric(["plain", "2"], 0.000125)
    g.add_metric(["big", "3"], 2.0**64)
    g.add_metric(["neg", "4"], -3.0)
    g.add_metric(["inf", "5"], float("inf"))
    c = CounterMetricFamily("gpu_test_things", "Things.", labels=["k"])
    c.add_metric(["a"], 7)
    c.add_metric(["b"], 12.5)
    return [g, c]


def test_same_samples_as_prometheus_client_on_edge_cases():
    metrics = _tricky()
    assert _samples(text_string_to_metric_families(render(metrics).decode())) == \
        _samples(text_string_to_metric_families(_oracle(metrics)))
    assert _samples(om_parse(render(metrics, openmetrics=True).decode())) == \
        _samples(om_parse(_oracle(metrics, openmetrics=True)))


def test_same_samples_as_prometheus_client_on_a_simulated_p5(tmp_path):
    every = tmp_path / "all.yml"
    every.write_text("efa:\n  counters: all\ngpu:\n  detail: all\n")
    ctx = build_context(build_parser().parse_args(["--simulate", "p5.48xlarge", "--config", str(every)]))
    runner = Runner(collectors.build(ctx), 5.0)
    try:
        metrics = runner.collect()
        ours = render(metrics).decode()
        assert len(_samples(text_string_to_metric_families(ours))) > 1500
        assert _samples(text_string_to_metric_families(ours)) == \
            _samples(text_string_to_metric_families(_oracle(metrics)))
        assert _samples(om_parse(render(metrics, openmetrics=True).decode())) == \
            _samples(om_parse(_oracle(metrics, openmetrics=True)))
        assert promtool_check_metrics(ours) == ""
    finally:
        runner.close()
        ctx.simulation.close()


def test_negotiation_and_gzip():
    prometheus_accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                         "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    assert negotiate(prometheus_accept)
    assert not negotiate("text/plain;version=0.0.4")
    assert not negotiate("")
    body, headers = encode(_tricky(), prometheus_accept, "gzip, deflate")
    h = dict(headers)
    assert h["Content-Type"].startswith("application/openmetrics-text")
    assert h["Content-Encoding"] == "gzip" and int(h["Content-Length"]) == len(body)
    assert gzip.decompress(body).decode().endswith("# EOF\n")
