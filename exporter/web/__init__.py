"""The endpoint: the HTTP/1.1 server (httpd, on asyncio imported without ssl unless TLS is on:
aio), what it serves (server: /metrics, the probes, the landing page of landing), and the web
config file (webconfig: TLS and basic auth, exporter-toolkit's format)."""
