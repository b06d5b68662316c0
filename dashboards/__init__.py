"""The Grafana dashboards of gpu-health-exporter, as code (grafana-foundation-sdk).

`dashboards.build.dashboards()` returns every dashboard's JSON model (file stem -> dict);
`python -m dashboards.build` writes them to dashboards/*.json, the files Grafana imports.
"""
