"""What the node should have: expected GPU and EFA counts from config, else the instance type
(config, else the DMI product name, else instance metadata)."""

from __future__ import annotations

from exporter.collector import Context
from exporter.profiles import Profile, lookup


def instance_type(ctx: Context) -> str | None:
    """The instance type from config, else the DMI product name, else instance metadata, as known
    now (the daemon's background lookup is started at start-up, IdentitySource.start; a one-shot
    command asks IMDS itself, IdentitySource.lookup_now)."""
    return ctx.identity.current().instance_type


def profile(ctx: Context) -> Profile | None:
    return lookup(instance_type(ctx))


def expected_gpus(ctx: Context) -> int | None:
    if ctx.config.node.expected_gpus is not None:
        return ctx.config.node.expected_gpus
    p = profile(ctx)
    return p.gpus if p else None
