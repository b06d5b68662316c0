"""The /metrics renderer: the same samples as prometheus_client's renderers, in both formats,
with escaping, number formatting and content negotiation right."""

import gzip

import prometheus_client
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from exporter import collectors
from exporter.catalog import MetricSpec
from exporter.cli import build_context, build_parser
from exporter.exposition import encode, negotiate, render
from exporter.metric import go_float
from exporter.runner import Runner
from tests.helpers import promtool_check_metrics


def _samples(families):
    # repr: NaN equals only itself as text.
    return sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value))
                  for f in families for s in f.samples)


def _oracle(metrics, openmetrics=False):
    """prometheus_client's rendering of our metrics, as its own Metric and Sample types."""
    theirs = []
    for m in metrics:
        t = prometheus_client.Metric(m.name, m.documentation, m.type, m.unit)
        for s in m.samples:
            t.add_sample(s.name, s.labels, s.value)
        theirs.append(t)

    class Fixed:
        def collect(self):
            return theirs

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Fixed())
    return (om_generate_latest if openmetrics else generate_latest)(reg).decode()


def _tricky():
    from exporter.catalog import Families

    g = MetricSpec("gpu_test_tricky", "gauge", 'help with \\ backslash, "quotes"\nand a newline',
                   ("path", "n"), "", "test")
    c = MetricSpec("gpu_test_things_total", "counter", "Things.", ("k",), "", "test")
    out = Families()
    out.add(g, 1234567.0, path='C:\\dir "x"\nnext', n=1)
    out.add(g, 0.000125, path="plain", n=2)
    out.add(g, 2.0**64, path="big", n=3)
    out.add(g, -3.0, path="neg", n=4)
    out.add(g, float("inf"), path="inf", n=5)
    out.add(g, float("nan"), path="nan", n=6)
    out.add(c, 7, k="a")
    out.add(c, 12.5, k="b")
    return list(out)


@given(st.floats() | st.sampled_from([1e6, 1e7, 12345678.0, 1e16, 1.5e22, -1e7, 5e-324]))
def test_values_are_spelled_as_prometheus_clients_floatToGoString(v):
    assert go_float(v) == floatToGoString(v)


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
    body, headers = encode(_tricky(), prometheus_accept, "gzip")
    h = dict(headers)
    assert h["Content-Type"].startswith("application/openmetrics-text")
    assert h["Content-Encoding"] == "gzip" and "Content-Length" not in h  # the server sets it once
    assert gzip.decompress(body).decode().endswith("# EOF\n")
