"""What the node should have: expected GPU and EFA counts from config, else the instance type
(config, else the DMI product name, else instance metadata)."""

from __future__ import annotations

from exporter.collector import Context
from exporter.profiles import Profile, lookup


def instance_type(ctx: Context) -> str | None:
    """The instance type from config, else the DMI product name, else instance metadata (the
    background lookup is started here on first need, so the verdict has it whatever collectors
    run; a one-shot command asks IMDS itself, see IdentitySource.lookup_now)."""
    found = ctx.identity.current().instance_type
    if found is None:
        ctx.identity.start_lookup()
    return found


def profile(ctx: Context) -> Profile | None:
    return lookup(instance_type(ctx))


def expected_gpus(ctx: Context) -> int | None:
    if ctx.config.node.expected_gpus is not None:
        return ctx.config.node.expected_gpus
    p = profile(ctx)
    return p.gpus if p else None
