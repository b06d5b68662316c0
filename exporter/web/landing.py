"""The landing page at `/`: what an on-call engineer opens the node's port for (issue 37).

For the node: its verdict and reasons, each reason linked to its runbook section. For every GPU,
healthy ones included: its verdict, its reasons (linked to their runbooks), the workload holding it
now (gpu_workload_info), the faults it logged since boot with the workloads they hit
(gpu_xid_workload_last_seen_timestamp_seconds, kept after the workload ended), and how to clear
them: the `ack` command for the sticky XID reasons, or "clears with the state" for NVML's. Then
each source's problems. The verdict is the health collector's own reading (exporter.xid.verdict.
NodeVerdict, what the runner handed over); workloads, faults' workloads and problems are read from
the last collection's metric families (no coupling to the collectors beyond the metric names in
the catalog). Plain HTML, no script: it renders the same with JavaScript off (a text browser, a
locked-down jump host), which tests/test_landing_page.py checks in headless Chromium. Runbook links
go to the exporter's own /runbooks.html (exporter.web.server), which the node always has."""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter import __version__
from exporter.catalog import all_specs
from exporter.metric import Metric
from exporter.runbooks import anchor
from exporter.xid.verdict import ACKABLE, RUNBOOK

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
    workloads: dict[str, list[str]] = field(default_factory=dict)  # GPU index -> workloads on it now
    # (pci_bus_id, xid) -> the workloads that fault hit, and (switch pci_bus_id, sxid) -> those an SXid hit
    hits: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    sxid_hits: dict[tuple[str, str], list[str]] = field(default_factory=dict)


_VERDICT_FAMILIES = {"gpu_node_health_verdict", "gpu_node_health_reason", "gpu_health_verdict",
                     "gpu_health_reason"}  # shown from the reading itself
_WORKLOAD_NOW = "gpu_workload_info"
_XID_HIT = "gpu_xid_workload_last_seen_timestamp_seconds"
_SXID_HIT = "gpu_nvswitch_sxid_workload_last_seen_timestamp_seconds"


def _workload(labels: dict[str, str]) -> str:
    """A workload's short name from its labels (exporter.workload.model.Workload.describe's form)."""
    if labels.get("hpc_job"):
        return f"Slurm job {labels['hpc_job']}"
    if labels.get("pod"):
        return f"pod {labels.get('namespace', '')}/{labels['pod']}" + (
            f" container {labels['container']}" if labels.get("container") else "")
    return ""


def _add(d: dict[Any, list[str]], key: object, item: str) -> None:
    if item and item not in d.setdefault(key, []):
        d[key].append(item)


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
        if m.name == _WORKLOAD_NOW:
            for smp in m.samples:
                _add(s.workloads, smp.labels.get("gpu", ""), _workload(smp.labels))
            continue
        if m.name in (_XID_HIT, _SXID_HIT):
            target, code = (s.hits, "xid") if m.name == _XID_HIT else (s.sxid_hits, "sxid")
            for smp in m.samples:
                when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(smp.value))
                _add(target, (smp.labels.get("pci_bus_id", ""), smp.labels.get(code, "")),
                     f"{_workload(smp.labels)} (at {when})")
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


def _reason(r: str, runbooks: str) -> str:
    """A reason as a link to its runbook section."""
    e = html.escape
    section = RUNBOOK.get(r)
    if section is None:
        return f"<code>{e(r)}</code>"
    return f'<a href="{e(runbooks)}#{e(anchor(section))}"><code>{e(r)}</code></a>'


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts)) if ts else "?"


def _gpu_table(verdict: NodeVerdict, s: Summary, runbooks: str) -> list[str]:
    """Every GPU, healthy or not: verdict, reasons, workload now, faults and whom they hit, how to clear."""
    e = html.escape
    out = ["<h3>GPUs</h3>",
           "<table border=1><tr><th>GPU</th><th>PCI bus id</th><th>verdict</th><th>reasons (runbook)</th>"
           "<th>workload now</th><th>faults since boot, and the workloads they hit</th>"
           "<th>to clear</th></tr>"]
    gpus = sorted(verdict.gpus, key=lambda g: (not g.gpu.isdigit(), int(g.gpu) if g.gpu.isdigit() else 0))
    for g in gpus:
        cls = "good" if g.verdict == "healthy" else "bad"
        reasons = ", ".join(_reason(r, runbooks) for r in g.reasons) or "none"
        now = ", ".join(e(w) for w in s.workloads.get(g.gpu, [])) or "idle, or not observed"
        faults = []
        for x in g.xids:
            hit = s.hits.get((g.pci_bus_id, str(x.xid)), [])
            text = (f"XID {x.xid} &times;{x.count} ({e(x.tier)}{', acknowledged' if x.acknowledged else ''}"
                    f"{f', {x.undecoded} undecoded' if x.undecoded else ''}; last {e(_when(x.last_seen))})")
            if x.meaning:
                text += f": {e(x.meaning)}"
            whom = ", ".join(e(h) for h in hit) if hit else "no workload recorded"
            text += "<br>&nbsp;&nbsp;hit: " + whom
            faults.append(text)
        out.append(f"<tr><td>{e(g.gpu or '-')}</td><td>{e(g.pci_bus_id)}</td><td class=\"{cls}\">"
                   f"{e(g.verdict)}</td><td>{reasons}</td><td>{now}</td>"
                   f"<td>{'<br>'.join(faults) or 'none'}</td><td>{_clear(g)}</td></tr>")
    out.append("</table>")
    if verdict.sxids:
        out.append("<h3>NVSwitch SXids since boot</h3><ul>")
        for sx in verdict.sxids:
            hit = s.sxid_hits.get((sx.pci_bus_id, str(sx.sxid)), [])
            out.append(f"<li>NVSwitch {e(sx.switch or '?')} ({e(sx.pci_bus_id)}): SXid {sx.sxid} "
                       f"&times;{sx.count} {e(sx.severity)}, tier {e(sx.tier)}, "
                       f"last {e(_when(sx.last_seen))}; "
                       "hit: "
                       f"{', '.join(e(h) for h in hit) or 'no workload recorded'}</li>")
        out.append("</ul>")
    return out


def _clear(g: object) -> str:
    """How the GPU's reasons clear: `ack` (with the daemon's --config and --path.state-dir) for the
    sticky XID reasons, after the repair; NVML's own state clears when the state does."""
    e = html.escape
    reasons = list(getattr(g, "reasons", []))
    if not reasons:
        return "nothing to clear"
    parts = []
    if any(r in ACKABLE for r in reasons):
        who = g.gpu if g.gpu else g.pci_bus_id  # type: ignore[attr-defined]
        parts.append(f"after the repair: <code>gpu-health-exporter ack --gpu {e(who)}</code> (with the "
                     "daemon's --config and --path.state-dir)")
    state = [r for r in reasons if r not in ACKABLE]
    if state:
        parts.append(f"{e(', '.join(state))}: clears when NVML's state does (after the reset or reboot "
                     "the runbook gives); no ack")
    return "<br>".join(parts)


def render_page(metrics: list[Metric] | None, status: dict[str, Any], collected_at: float | None,
                verdict: NodeVerdict | None = None, telemetry_path: str = "/metrics",
                runbooks: str = "/runbooks.html") -> str:
    """`status`: collector name -> an object with ok (None/True/False), error and duration;
    `verdict`: the health collector's reading of that collection (None when it gave none);
    `runbooks`: where the runbook page is (the exporter serves it)."""
    e = html.escape
    out = ["<!doctype html><html><head><meta charset=utf-8><title>gpu-health-exporter</title>",
           "<style>body{font-family:sans-serif}td,th{padding:4px 8px;text-align:left;vertical-align:top}"
           ".bad{color:#b00020;font-weight:bold}.good{color:#1b5e20;font-weight:bold}</style></head><body>",
           f"<h1>gpu-health-exporter {e(__version__)}</h1>",
           f'<p><a href="{e(telemetry_path)}">Metrics</a> &middot; <a href="{e(runbooks)}">Runbooks</a> '
           '&middot; <a href="/healthz">healthz</a> &middot; <a href="/readyz">readyz</a></p>']
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
            out.append("<p>Reasons (each links to its runbook): "
                       + ", ".join(_reason(r, runbooks) for r in s.reasons) + "</p>")
    if verdict is not None:
        out += _gpu_table(verdict, s, runbooks)
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
