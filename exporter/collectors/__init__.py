"""One collector per source, one module each. A collector module defines `COLLECTOR`, a
Collector subclass whose `name` is also its config section (with an `enabled` key)."""

from __future__ import annotations

import importlib
import pkgutil

from exporter.collector import Collector, Context


def collector_classes() -> dict[str, type[Collector]]:
    out: dict[str, type[Collector]] = {}
    for mod in pkgutil.iter_modules(__path__):
        m = importlib.import_module(f"{__name__}.{mod.name}")
        cls = getattr(m, "COLLECTOR", None)
        if cls is not None:
            out[cls.name] = cls
    return dict(sorted(out.items()))


def build(ctx: Context, only: list[str] | None = None) -> list[Collector]:
    """The enabled collectors (or just `only`), built from the context's config."""
    out = []
    for name, cls in collector_classes().items():
        enabled = getattr(ctx.config, name).enabled if hasattr(ctx.config, name) else True
        if (only is None and enabled) or (only is not None and name in only):
            out.append(cls(ctx))
    return out
