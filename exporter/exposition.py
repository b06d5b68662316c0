"""Rendering a collection as Prometheus text (0.0.4) or OpenMetrics (1.0.0).

The families are the runner's collection (exporter.collection) and process_*, rendered directly.
prometheus_client's own renderers (`generate_latest`, and
`prometheus_client.openmetrics.exposition.generate_latest`) sort and escape every label of every
sample on every scrape, about 6 times the cost of this one on a p5 (docs/performance.md). Our
series are the same from scrape to scrape, only their values change, so `render` caches each
series' `name{labels} ` prefix and formats only the value. Its output is byte for byte
prometheus_client's (tests/test_exposition.py checks simulated scenarios in both formats, and a
property test generated values and labels). It renders gauges and counters, the only types the
catalog lets a metric have (exporter.catalog.define).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from math import copysign

from exporter.metric import Metric, Sample, go_float

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

# Series prefixes kept, sized to the node: cleared when they reach PREFIX_SERIES_FACTOR times the
# series of the last render (at least PREFIX_FLOOR). Series come and go with workloads (a job's
# labels on gpu_workload_info and the attribution series): a fixed bound of 200,000 let a node with
# short jobs grow this cache by tens of MiB over weeks (issue 36 item 3, docs/performance.md); at
# 4x the live series a clear costs one render's prefixes again, once per 3x the node's series of churn.
PREFIX_FLOOR = 4096
PREFIX_SERIES_FACTOR = 4
_prefix_limit = PREFIX_FLOOR
_prefixes: dict[tuple[str, ...], str] = {}
_MAX_CHUNKS = 4096  # families whose last rendering is kept; cleared when exceeded
# family (name, type, help, unit, format) -> (samples, text)
_chunks: dict[tuple[str, str, str, str, bool], tuple[list[Sample], str]] = {}


def _escape_label(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


def _prefix(name: str, labels: dict[str, str]) -> str:
    # A metric's label names are fixed by its catalog entry, so the values identify the series.
    key = (name, *labels.values())
    p = _prefixes.get(key)
    if p is None:
        if len(_prefixes) >= _prefix_limit:
            _prefixes.clear()
        if labels:
            inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(labels.items()))
            p = f"{name}{{{inner}}} "
        else:
            p = name + " "
        _prefixes[key] = p
    return p


def _header(m: Metric, openmetrics: bool) -> str:
    if openmetrics:
        family = m.name
        help_ = m.documentation.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        h = f"# HELP {family} {help_}\n# TYPE {family} {m.type}\n"
        return h + f"# UNIT {family} {m.unit}\n" if m.unit else h
    family = m.name + "_total" if m.type == "counter" else m.name
    help_ = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {family} {help_}\n# TYPE {family} {m.type}\n"


def _same(old: list[Sample], new: list[Sample]) -> bool:
    """The same samples, spelled the same: equal, and no value that compares equal but is
    written differently (0.0 and -0.0, 1 and 1.0)."""
    if len(old) != len(new):
        return False
    for a, b in zip(old, new, strict=True):
        if a is b:
            continue
        if a != b:
            return False
        x, y = a[2], b[2]
        if x.__class__ is not y.__class__ or (not x and copysign(1.0, x) != copysign(1.0, y)):
            return False
    return True


def render(metrics: Iterable[Metric], openmetrics: bool = False) -> bytes:
    global _prefix_limit
    out: list[str] = []
    append = out.append
    get = _prefixes.get
    series = 0
    for m in metrics:
        # A family whose samples are what they were last time (most of a healthy node's: info
        # series, error counters at 0, thresholds) reuses its text; comparing costs about a
        # quarter of formatting.
        head = (m.name, m.type, m.documentation, m.unit, openmetrics)
        samples = m.samples
        series += len(samples)
        last = _chunks.get(head)
        if last is not None and _same(last[0], samples):
            append(last[1])
            continue
        start = len(out)
        append(_header(m, openmetrics))
        for s in samples:
            p = get((s.name, *s.labels.values())) or _prefix(s.name, s.labels)
            v = s.value
            # A finite float below 1e6 is spelled as Python's repr ("3.0", "1e-05"); from 1e6 up
            # Go (and floatToGoString) switch to exponents, and infinities and NaN need Go's spelling.
            if v.__class__ is float and v < 1e6 and v - v == 0:
                append(f"{p}{v!r}\n")
            else:
                append(f"{p}{go_float(v)}\n")
        if len(_chunks) >= _MAX_CHUNKS:
            _chunks.clear()
        chunk = "".join(out[start:])
        del out[start:]
        append(chunk)
        _chunks[head] = (list(samples), chunk)
    if openmetrics:
        append("# EOF\n")
    _prefix_limit = max(PREFIX_FLOOR, PREFIX_SERIES_FACTOR * series)
    return "".join(out).encode()


def negotiate(accept: str) -> bool:
    """True when the Accept header asks for OpenMetrics (as Prometheus does by default)."""
    for part in accept.split(","):
        if part.split(";")[0].strip() == "application/openmetrics-text":
            return True
    return False


def choose_encoding(accept_encoding: str) -> str | None:
    """'gzip' or 'identity' for an Accept-Encoding header (RFC 9110 12.5.3: q-values, `*`, q=0
    excludes), None when the client accepts neither. gzip wins a tie: it is what Prometheus asks for."""
    q: dict[str, float] = {}
    for part in accept_encoding.split(","):
        coding, *params = (x.strip() for x in part.split(";"))
        if not coding:
            continue
        weight = 1.0
        for prm in params:
            k, _, v = prm.partition("=")
            if k.strip().lower() == "q":
                try:
                    weight = min(1.0, max(0.0, float(v)))
                except ValueError:
                    weight = 0.0
        q[coding.lower()] = weight
    star = q.get("*")
    gz = q.get("gzip", q.get("x-gzip", star if star is not None else 0.0))
    ident = q.get("identity", star if star is not None else 1.0)
    if gz > 0 and gz >= ident:
        return "gzip"
    return "identity" if ident > 0 else None


def encode(metrics: Iterable[Metric], accept: str, coding: str) -> tuple[bytes, list[tuple[str, str]]]:
    """The body and headers of a /metrics response: the format from the Accept header, `coding`
    as choose_encoding returned it ('gzip' or 'identity'). The server adds Content-Length."""
    om = negotiate(accept)
    body = render(metrics, openmetrics=om)
    headers = [("Content-Type", OPENMETRICS_CONTENT_TYPE if om else TEXT_CONTENT_TYPE),
               ("Vary", "Accept-Encoding")]
    if coding == "gzip":
        # zlib writes the gzip header and CRC itself, in the same pass (gzip.compress makes a
        # second pass for the CRC): 20% less time for a p5's body
        # (compressobj: zlib.compress takes wbits from Python 3.11 only)
        z = zlib.compressobj(1, wbits=31)
        body = z.compress(body) + z.flush()
        headers.append(("Content-Encoding", "gzip"))
    return body, headers
