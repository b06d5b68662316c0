"""The collector registry. A collector is one module in this package that defines `COLLECTOR`,
a Collector subclass declaring, besides its `name`:

- `config_section`: its typed config section (an exporter.config.Section dataclass, named as
  the collector, with an `enabled` key);
- `prefix`: the domain prefix of its metrics (each of its metrics starts with it, or with the
  exporter's own `gpu_health_exporter_` for the health of its sources);
- `docs_group`: the heading its metrics go under in docs/metrics.md.

Registering a collector adds its section to the config schema (exporter.config owns that
registry, so the config imports no collector). The composition root discovers the collectors
(`discover`, or `collector_classes`) before it loads a config: exporter.cli, exporter.tools.docs, the
test suite's conftest, the benchmarks. The docs and the command line (--collector.<name>) read
this registry too, so adding a collector is its module and its tests; tests/test_registry.py
registers a toy one.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from exporter import catalog, config
from exporter.collector import Collector, Context
from exporter.config import CollectorSection

OWN_PREFIX = "gpu_health_exporter_"  # any collector may report its sources' health under it

_REGISTRY: dict[str, type[Collector]] = {}
_discovered = False


def register(cls: type[Collector]) -> type[Collector]:
    """Add a collector class (its module's COLLECTOR is added by discovery). Checks what it
    declares, and that every metric it has defined so far carries its prefix; later ones are
    checked by catalog.define."""
    name = cls.name
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name or ""):
        raise ValueError(f"collector {cls.__name__}: name {name!r} must be a lower-case identifier")
    old = _REGISTRY.get(name)
    if old is not None and old is not cls:
        raise ValueError(f"collector {name!r} registered twice ({old.__module__}, {cls.__module__})")
    sec = cls.config_section
    if not (isinstance(sec, type) and issubclass(sec, CollectorSection)) or sec.name != name:
        raise ValueError(f"collector {name!r}: config_section must be a CollectorSection named {name!r}")
    if not cls.prefix or not cls.prefix.endswith("_") or not cls.docs_group:
        raise ValueError(f"collector {name!r}: declare its metric prefix (ending in _) and its docs group")
    catalog.own_prefixes(name, (cls.prefix, OWN_PREFIX))
    config.add_section(sec)
    _REGISTRY[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a collector (tests that register their own)."""
    _REGISTRY.pop(name, None)
    config.remove_section(name)
    catalog.own_prefixes(name, None)


def discover() -> None:
    """Import every module of this package once; each module's COLLECTOR registers."""
    global _discovered
    if _discovered:
        return
    for mod in pkgutil.iter_modules(__path__):
        m = importlib.import_module(f"{__name__}.{mod.name}")
        cls = getattr(m, "COLLECTOR", None)
        if cls is not None:
            register(cls)
    _discovered = True


def collector_classes() -> dict[str, type[Collector]]:
    discover()
    return dict(sorted(_REGISTRY.items()))


def build(ctx: Context, only: list[str] | None = None) -> list[Collector]:
    """The enabled collectors (or just `only`), built from the context's config."""
    out = []
    for name, cls in collector_classes().items():
        sec = ctx.config.find(cls.config_section) if cls.config_section else None
        enabled = sec.enabled if sec is not None else True
        if (only is None and enabled) or (only is not None and name in only):
            out.append(cls(ctx))
    return out
