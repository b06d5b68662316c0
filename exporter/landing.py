"""The landing page at `/`: the node's verdict and reasons and the GPUs that need something, from
the health collector's last reading (exporter.xid.verdict.NodeVerdict, what the runner handed
over), and the problems of each source, read from the last collection's metric families (no
coupling to the collectors beyond the metric names in the catalog)."""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.catalog import all_specs
from exporter.metric import Metric

if TYPE_CHECKING:
    from exporter.xid.verdict import NodeVerdict  # read by attribute: verdict, reasons, gpus

# Gauges whose 1 means a problem, and how to say it.
_BAD_WHEN_ONE = {"gpu_lost": "lost (fell off the bus): needs a reset or reboot",
                 "gpu_fabric_health_problem": "NVLink fabric health problem"}
# State gauges (1 for the current state) whose states other than these are problems.
_GOOD_STATES = {"lustre_client_health_status": ("status", {"healthy"})}
# Series whose presence is the news.
_PRESENT = {"ec2_scheduled_event_start_timestamp_seconds": "EC2 scheduled event"}
# Status gauges (1 good, 0 bad) with their own wording; any other gauge ending in _up, _ok or _success
# at 0 is reported by its name.
_BAD_WHEN_ZERO = {
    "gpu_read_success": "NVML reads failed or timed out",
    "gpu_activity_measured": "SM, tensor and DRAM activity not measured",  # + its reason label
    "efa_device_up": "EFA device not readable (down, removed or failing admin commands)",
    "lustre_client_source_up": "Lustre source not readable",
    "gpu_health_exporter_kmsg_up": "kernel log not readable (XIDs from the log are missed)",
    "gpu_health_exporter_nvml_event_watcher_up": "NVML event watcher not running",
    "gpu_health_exporter_state_file_ok": "XID state file corrupt, unreadable or unwritable",
    "gpu_health_exporter_workload_source_up": "could not tell which workload holds some GPUs (see the log)",
}
_HAVE_VS_EXPECTED = {"gpu_devices": "gpu_devices_expected", "efa_devices": "efa_devices_expected"}
_SUBJECT_LABELS = ("gpu", "pci_bus_id", "device", "port", "mount", "fsname", "source", "link", "problem",
                   "code", "event_id")


@dataclass
class Summary:
    verdict: str | None = None  # the node verdict; None when the health collector gave none
    reasons: list[str] = field(default_factory=list)
    gpus: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (gpu, verdict, reasons)
    problems: dict[str, list[str]] = field(default_factory=dict)  # source (collector) -> problems


_VERDICT_FAMILIES = {"gpu_node_health_verdict", "gpu_node_health_reason", "gpu_health_verdict",
                     "gpu_health_reason"}  # shown from the reading itself


def summarise(metrics: Iterable[Metric], verdict: NodeVerdict | None) -> Summary:
    owner = {s.name: s.collector for s in all_specs()}
    s = Summary()
    if verdict is not None:
        s.verdict, s.reasons = verdict.verdict, sorted(verdict.reasons)
        s.gpus = [(g.gpu, g.verdict, sorted(g.reasons)) for g in verdict.gpus if g.verdict != "healthy"]
        s.gpus.sort(key=lambda x: int(x[0]) if x[0].isdigit() else -1)
    values: dict[str, float] = {}
    problems: dict[str, list[str]] = defaultdict(list)
    for m in metrics:
        if m.name in _VERDICT_FAMILIES:
            continue
        for smp in m.samples:
            name, labels, v = smp.name, smp.labels, smp.value
            if name == "gpu_health_exporter_collector_success":
                continue  # reported per collector from the runner's status, with the error
            else:
                problem = _problem(name, m.type, labels, v)
                if problem:
                    problems[owner.get(name, "exporter")].append(problem)
            if not labels:
                values[name] = v
    for have, want in _HAVE_VS_EXPECTED.items():
        if have in values and want in values and values[have] < values[want]:
            problems[owner.get(have, "exporter")].append(
                f"{values[have]:g} of {values[want]:g} expected devices found ({have})")
    s.problems = dict(problems)
    return s


def _problem(name: str, type_: str, labels: dict[str, str], v: float) -> str:
    """What this sample says is wrong ('' when nothing)."""
    if (name in _BAD_WHEN_ONE and v == 1) or (_is_status(name, type_) and v == 0):
        what = _BAD_WHEN_ONE.get(name) or _BAD_WHEN_ZERO.get(name) or f"{name} is {v:g}"
        why = f" ({labels['reason']})" if labels.get("reason") else ""
        return f"{_subject(labels)}{what}{why}"
    if name in _GOOD_STATES and v == 1:
        label, good = _GOOD_STATES[name]
        return "" if labels[label] in good else f"{name}: {label} {labels[label]}"
    if name in _PRESENT:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(v))
        return f"{_subject(labels)}{_PRESENT[name]} from {when}"
    return ""


def _is_status(name: str, type_: str) -> bool:
    return name in _BAD_WHEN_ZERO or (type_ == "gauge" and name.endswith(("_up", "_ok", "_success")))


def _subject(labels: dict[str, str]) -> str:
    parts = [f"{k} {labels[k]}" for k in _SUBJECT_LABELS if labels.get(k)]
    return (", ".join(parts) + ": ") if parts else ""


def render_page(metrics: list[Metric] | None, status: dict, collected_at: float | None,
                verdict: NodeVerdict | None = None, telemetry_path: str = "/metrics") -> str:
    """`status`: collector name -> an object with ok (None/True/False), error and duration;
    `verdict`: the health collector's reading of that collection (None when it gave none)."""
    e = html.escape
    out = ["<!doctype html><html><head><meta charset=utf-8><title>gpu-health-exporter</title>",
           "<style>body{font-family:sans-serif}td,th{padding:4px 8px;text-align:left;vertical-align:top}"
           ".bad{color:#b00020;font-weight:bold}.good{color:#1b5e20;font-weight:bold}</style></head><body>",
           f"<h1>gpu-health-exporter {e(__version__)}</h1>",
           f'<p><a href="{e(telemetry_path)}">Metrics</a> &middot; <a href="/healthz">healthz</a> &middot; '
           '<a href="/readyz">readyz</a></p>']
    if metrics is None:
        out.append("<p>The first collection is not done yet; reload in a moment.</p></body></html>\n")
        return "".join(out)
    s = summarise(metrics, verdict)
    if s.verdict is None:
        out.append("<h2>Node verdict: <span>none</span></h2><p>The health collector is not running, "
                   "so there is no verdict; the sources' problems are below.</p>")
    else:
        cls = "good" if s.verdict == "healthy" else "bad"
        out.append(f'<h2>Node verdict: <span class="{cls}">{e(s.verdict)}</span></h2>')
        if s.reasons:
            out.append("<p>Reasons: " + ", ".join(f"<code>{e(r)}</code>" for r in s.reasons) + "</p>")
    if s.gpus:
        out.append("<h3>GPUs needing action</h3><table border=1><tr><th>GPU</th><th>verdict</th>"
                   "<th>reasons</th></tr>")
        for g, v, reasons in s.gpus:
            out.append(f'<tr><td>{e(g)}</td><td class="bad">{e(v)}</td>'
                       f"<td>{e(', '.join(reasons))}</td></tr>")
        out.append("</table>")
    out.append("<h3>Sources</h3><table border=1><tr><th>collector</th><th>last collection</th>"
               "<th>problems</th><th>duration</th></tr>")
    names = list(status) + sorted(set(s.problems) - set(status))
    for name in names:
        st = status.get(name)
        if st is None or st.ok is None:
            state, cls = "not collected yet", ""
        elif st.ok:
            state, cls = "ok", "good"
        else:
            state, cls = "failed: " + st.error, "bad"
        probs = s.problems.get(name, [])
        if probs and cls == "good":
            state, cls = "ok, with problems", "bad"
        dur = f"{st.duration * 1000:.1f} ms" if st is not None and st.ok is not None else ""
        out.append(f"<tr><td>{e(name)}</td><td class=\"{cls}\">{e(state)}</td>"
                   f"<td>{'<br>'.join(e(p) for p in probs) or 'none'}</td><td>{dur}</td></tr>")
    out.append("</table>")
    if collected_at is not None:
        out.append(f"<p>As of the last collection, {time.time() - collected_at:.0f} s ago "
                   f"({e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(collected_at)))}).</p>")
    out.append("</body></html>\n")
    return "".join(out)
