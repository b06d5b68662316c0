"""Building blocks shared by the four dashboards: the templated datasource, the `cluster` and
`instance` variables every query honours, label selectors that carry both, panel factories that make
a unit, a description and a series bound mandatory, and the links between the dashboards.

A panel is one call, e.g.::

    timeseries("PCIe replays per second", "What it tells the operator.", "short", "8 GPUs",
               query(f"rate(gpu_pcie_replays_total{sel()}[$__rate_interval])", "GPU {{gpu}}"))

`sel()` returns the label selector with `cluster=~"$cluster"` and `instance=~"$instance"` (plus
any extra matchers), so a query cannot forget either.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

TAG = "gpu-health-exporter"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Targets of this project, as rules/exporter.yml recognises them.
JOB = 'job=~".*gpu-health-exporter.*"'

UIDS = {
    "fleet": "gpu-health-fleet",
    "node": "gpu-health-node",
    "efa": "gpu-health-efa",
    "fsx": "gpu-health-fsx",
    "job": "gpu-health-job",
}
TITLES = {
    "fleet": "GPU health / Fleet",
    "node": "GPU health / Node",
    "efa": "GPU health / EFA fabric",
    "fsx": "GPU health / FSx for Lustre clients",
    "job": "GPU health / Training job",
}

# Colours of the verdicts, healthy to worst (exporter/xid/verdict.py).
VERDICT_COLOURS = {
    "healthy": "green",
    "degraded": "yellow",
    "unknown": "purple",  # the GPU could not be read (NVML did not answer)
    "reset_required": "orange",
    "reboot_required": "red",
    "replace_required": "dark-red",
}


def sel(*matchers: str) -> str:
    """`{cluster=~"$cluster", instance=~"$instance", <matchers>}`: every selector of every query."""
    return "{" + ", ".join(['cluster=~"$cluster"', 'instance=~"$instance"', *matchers]) + "}"


def since(expr: str) -> str:
    """When `expr` (a filter, 1 while active) became true within the last day, in ms for Grafana's
    dateTimeFromNow; a condition newer than the subquery's last minute step shows as now."""
    return f"min_over_time(timestamp({expr})[1d:1m]) * 1000 or timestamp({expr}) * 1000"


def workload_join(expr: str) -> str:
    """`expr` (one series per GPU, with `cluster`, `instance` and `gpu`) once per workload holding
    the GPU, with the workload's labels (hpc_job for a Slurm job; namespace, pod and container for
    a pod): a join on gpu_workload_info, the workload source's series (one per GPU and workload;
    no data where the source does not run)."""
    return f"({expr}) * on (cluster, instance, gpu) group_right () gpu_workload_info{sel()}"


WORKLOAD = "cluster, hpc_job, namespace, pod"  # a workload's labels, for `by (...)`
WORKLOAD_LEGEND = "{{hpc_job}}{{namespace}} {{pod}}"


def job_url(field: str) -> str:
    """Data link from a table row (with `cluster` and the job's name in column `field`) to the job
    dashboard."""
    return (f"/d/{UIDS['job']}/?var-datasource=${{datasource}}&var-cluster=${{__data.fields.cluster}}"
            f"&var-job=${{__data.fields.{field}}}&var-instance=All&${{__url_time_range}}")


def node_url(with_gpu: bool = False) -> str:
    """Data link from a table row (with `cluster` and `instance` columns) to the node dashboard."""
    url = (f"/d/{UIDS['node']}/?var-datasource=${{datasource}}&var-cluster=${{__data.fields.cluster}}"
           "&var-instance=${__data.fields.instance}&${__url_time_range}")
    return url + ("&var-gpu=${__data.fields.gpu}" if with_gpu else "")


class Query:
    """One PromQL target; `instant` and `table` for tables and stats of current values."""

    def __init__(self, expr: str, legend: str = "", *, instant: bool = False, name: str = "") -> None:
        self.expr, self.legend, self.instant, self.name = expr, legend, instant, name

    def build(self, ref: str) -> pb.Dataquery:
        q = pb.Dataquery().expr(self.expr).ref_id(ref).datasource(DS)
        if self.legend:
            q = q.legend_format(self.legend)
        if self.instant:
            q = q.instant().format(pm.PromQueryFormat.TABLE)
        return q


def query(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


def instant(expr: str, name: str = "") -> Query:
    """An instant query for a table; `name` titles its value column."""
    return Query(expr, instant=True, name=name)


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in pairs])


OK_RED = steps((None, "green"), (1, "red"))          # any non-zero count is bad
UP_DOWN = steps((None, "red"), (1, "green"))         # 1 is good, 0 bad
NEUTRAL = steps((None, "blue"))                      # no healthy range: one colour


def override(name: str, **properties: object) -> db.DashboardFieldConfigSourceOverrides:
    """Field properties for the field (series, table column) called `name`; property ids with dots
    are spelt with double underscores (custom__cellOptions)."""
    props = [dm.DynamicConfigValue(id_val=k.replace("__", "."), value=v) for k, v in properties.items()]
    return (db.DashboardFieldConfigSourceOverrides()
            .matcher(dm.MatcherConfig(id_val="byName", options=name)).properties(props))


def colour(name: str, c: str) -> db.DashboardFieldConfigSourceOverrides:
    return override(name, color={"mode": "fixed", "fixedColor": c})


def coloured_cells(name: str, thresholds: db.ThresholdsConfig) -> db.DashboardFieldConfigSourceOverrides:
    """A table column whose cells take the colour of their threshold."""
    return override(name, thresholds=thresholds.build(), custom__cellOptions={"type": "color-background"})


def value_text(mapping: dict[str, tuple[str, str]]) -> list[dm.ValueMap]:
    """Value mapping {raw value: (text, colour)}."""
    return [dm.ValueMap(options={k: dm.ValueMappingResult(text=t, color=c, index=i)
                                 for i, (k, (t, c)) in enumerate(mapping.items())})]


class Counter:
    """Panel ids, unique within a dashboard."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def next(self) -> int:
        return next(self._ids)


def _common(panel, title: str, description: str, unit: str, bound: str, queries: Iterable[Query],
            width: int, height: int):
    panel = (panel.title(title).description(f"{description} Bound: {bound}.").datasource(DS)
             .unit(unit).span(width).height(height))
    for ref, q in zip("ABCDEFGHIJ", queries, strict=False):
        panel = panel.with_target(q.build(ref))
    return panel


def timeseries_panel(title: str, description: str, unit: str, bound: str, *queries: Query,
                     thresholds: db.ThresholdsConfig | None = None, width: int = 12, height: int = 8,
                     minimum: float | None = None, maximum: float | None = None, bars: bool = False,
                     overrides: Iterable[db.DashboardFieldConfigSourceOverrides] = ()) -> timeseries.Panel:
    p = _common(timeseries.Panel(), title, description, unit, bound, queries, width, height)
    p = p.legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                 .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
    p = p.fill_opacity(10).show_points(cm.VisibilityMode.NEVER)
    if bars:
        p = p.draw_style(cm.GraphDrawStyle.BARS).fill_opacity(80)
    if thresholds is not None:
        p = p.thresholds(thresholds).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.LINE))
    if minimum is not None:
        p = p.min(minimum)
    if maximum is not None:
        p = p.max(maximum)
    for o in overrides:
        p = p.with_override(o.build().matcher, o.build().properties)
    return p


def stat_panel(title: str, description: str, unit: str, bound: str, *queries: Query,
               thresholds: db.ThresholdsConfig = OK_RED, width: int = 6, height: int = 4,
               mappings: list | None = None,
               text_mode: cm.BigValueTextMode = cm.BigValueTextMode.VALUE_AND_NAME,
               overrides: Iterable[db.DashboardFieldConfigSourceOverrides] = ()) -> stat.Panel:
    p = _common(stat.Panel(), title, description, unit, bound, queries, width, height)
    p = (p.thresholds(thresholds).color_mode(cm.BigValueColorMode.BACKGROUND)
         .graph_mode(cm.BigValueGraphMode.NONE).text_mode(text_mode)
         .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if mappings:
        p = p.mappings(mappings)
    for o in overrides:
        p = p.with_override(o.build().matcher, o.build().properties)
    return p


def table_panel(title: str, description: str, unit: str, bound: str, *queries: Query,
                width: int = 12, height: int = 8, node_link: bool = True, gpu_link: bool = False,
                hide: Iterable[str] = (), thresholds: db.ThresholdsConfig | None = None,
                mappings: list | None = None,
                overrides: Iterable[db.DashboardFieldConfigSourceOverrides] = ()) -> table.Panel:
    """A table of instant queries, merged into one; `instance` links to the node dashboard (and
    `gpu` to the GPU on it when gpu_link)."""
    queries = list(queries)
    p = _common(table.Panel(), title, description, unit, bound, queries, width, height)
    transformations = []
    if len(queries) > 1:
        transformations.append(dm.DataTransformerConfig(id_val="merge", options={}))
    rename = {}
    for ref, q in zip("ABCDEFGHIJ", queries, strict=False):
        if q.name:
            rename["Value" if len(queries) == 1 else f"Value #{ref}"] = q.name
    excluded = {name: True for name in ("Time", "__name__", "job", "uuid", "pci_bus_id", *hide)}
    transformations.append(dm.DataTransformerConfig(
        id_val="organize", options={"excludeByName": excluded, "renameByName": rename}))
    p = p.transformations(transformations)
    if thresholds is not None:
        p = p.thresholds(thresholds)
    if mappings:
        p = p.mappings(mappings)
    if node_link:
        p = p.override_by_name("instance", [dm.DynamicConfigValue(
            id_val="links", value=[{"title": "Open the node dashboard", "url": node_url(gpu_link)}])])
    for o in overrides:
        p = p.with_override(o.build().matcher, o.build().properties)
    return p


def bargauge_panel(title: str, description: str, unit: str, bound: str, *queries: Query,
                   thresholds: db.ThresholdsConfig = NEUTRAL, width: int = 12,
                   height: int = 8) -> bargauge.Panel:
    p = _common(bargauge.Panel(), title, description, unit, bound, queries, width, height)
    return (p.thresholds(thresholds).display_mode(cm.BarGaugeDisplayMode.BASIC)
            .orientation(cm.VizOrientation.HORIZONTAL)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))


def variables(*, node: bool = False) -> list:
    """datasource, cluster and instance; the node dashboard picks one instance and adds `gpu`."""
    cluster = (db.QueryVariable("cluster").label("Cluster").datasource(DS)
               .query("label_values(gpu_health_exporter_build_info, cluster)")
               .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
               .include_all(True).all_value(".*")
               .description("The cluster label Prometheus attaches at scrape time (docs/deploy.md); "
                            "All also matches series without one."))
    instance = (db.QueryVariable("instance").label("Node").datasource(DS)
                .query('label_values(gpu_health_exporter_build_info{cluster=~"$cluster"}, instance)')
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))
    if node:
        instance = instance.description("One node (its name, as the scrape config relabels it).")
    else:
        instance = (instance.multi(True).include_all(True).all_value(".+")
                    .description("Nodes; All for the fleet."))
    out = [db.DatasourceVariable("datasource").label("Data source").type("prometheus"), cluster, instance]
    if node:
        out.append(db.QueryVariable("gpu").label("GPU").datasource(DS)
                   .query('label_values(gpu_info{cluster=~"$cluster", instance=~"$instance"}, gpu)')
                   .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NUMERICAL_ASC)
                   .multi(True).include_all(True).all_value(".*")
                   .description("GPUs of the node (index); All includes node-level series (gpu=\"\")."))
    return out


def dashboard(key: str, description: str, *, node: bool = False) -> db.Dashboard:
    """A dashboard shell: uid, title, tags, variables, links to the other three, time settings."""
    d = (db.Dashboard(TITLES[key]).uid(UIDS[key]).description(description).tags([TAG])
         .readonly().refresh("1m").time("now-6h", "now").timezone("utc")
         .tooltip(dm.DashboardCursorSync.CROSSHAIR)
         .link(db.DashboardLink("GPU health dashboards").type(dm.DashboardLinkType.DASHBOARDS)
               .tags([TAG]).as_dropdown(True).include_vars(True).keep_time(True)))
    for v in variables(node=node):
        d = d.with_variable(v)
    return d
