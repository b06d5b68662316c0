"""asyncio for the HTTP server's event loop (exporter/web/httpd.py), without ssl unless TLS is on.

asyncio imports ssl when it loads (base_events, selector_events, sslproto: `try: import ssl`),
about 4.6 MiB of RSS on every node (docs/performance.md), though only a TLS listener uses it.
When ssl is not loaded yet, asyncio is imported with `ssl` marked missing in sys.modules (its
modules then hold `ssl = None`, as on a Python built without it), and the mark is removed at
once: any later `import ssl` (the Kubernetes client, requests) loads it as usual. A TLS listener
hands asyncio the real module first (`with_ssl`, called by HttpServer with an SSLContext; the
daemon loads its web config, and ssl with it, before it imports the server: exporter/serve.py).
tests/test_runtime_imports.py checks that the served exporter loads ssl with TLS on and not with
it off, and that a TLS listener made after asyncio loaded without ssl serves.

The mark is process-wide for the few milliseconds of the import: the daemon imports this module
from its main thread at start-up, before its other threads exist.
"""

from __future__ import annotations

import sys

if "asyncio" not in sys.modules and "ssl" not in sys.modules:
    sys.modules["ssl"] = None  # type: ignore[assignment]  # `import ssl` raises ImportError
    try:
        import asyncio
    finally:
        del sys.modules["ssl"]

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
