"""asyncio for the HTTP server's event loop (exporter/web/httpd.py), without ssl unless TLS is on.

asyncio imports ssl when it loads (base_events, selector_events, sslproto), though only a TLS
listener uses it: it is imported without ssl (exporter/without_ssl.py) when ssl is not loaded yet.
A TLS listener hands asyncio the real module first (`with_ssl`, called by HttpServer with an
SSLContext; the daemon loads its web config, and ssl with it, before it imports the server:
exporter/serve.py). tests/test_runtime_imports.py checks that the served exporter loads ssl with
TLS on and not with it off, and that a TLS listener made after asyncio loaded without ssl serves.
The daemon imports this module from its main thread at start-up, before its other threads exist.
"""

from __future__ import annotations

from exporter.without_ssl import import_without_ssl

import_without_ssl("asyncio")

import asyncio  # noqa: E402 - the module httpd uses, re-exported

__all__ = ["asyncio", "with_ssl"]


def with_ssl() -> None:
    """Gives asyncio the ssl module, if it was imported without it (idempotent)."""
    import ssl
    from asyncio import base_events, selector_events, sslproto

    if getattr(sslproto, "ssl", None) is ssl:
        return
    for module in (base_events, selector_events, sslproto):
        module.ssl = ssl  # type: ignore[attr-defined]
    # sslproto's module-level names made only when it found ssl (Python 3.11+; unused by 3.10).
    sslproto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)  # type: ignore[attr-defined]
