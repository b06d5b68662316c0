"""Import a standard-library module without ssl, where only an unencrypted path of it is used.

asyncio and http.client import ssl when they load (`try: import ssl`), several MiB of RSS
(docs/performance.md, "Memory on a node"), though only TLS uses it. When ssl is not loaded yet,
the module is imported with `ssl` marked missing in sys.modules (it then holds `ssl = None`, as on
a Python built without it), and the mark is removed at once: any later `import ssl` loads it as
usual.

The mark is process-wide for the few milliseconds of the import: call this from the main thread at
start-up, before threads that may import ssl exist.
"""

from __future__ import annotations

import sys


def import_without_ssl(name: str) -> None:
    """Import `name` (once) without ssl, unless ssl is loaded already."""
    if name in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment]  # `import ssl` raises ImportError
    try:
        __import__(name)  # the import statement's path: -X importtime logs it (import_module's not)
    finally:
        del sys.modules["ssl"]
