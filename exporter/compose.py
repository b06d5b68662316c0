"""The composition root's one builder: a Context from a validated config and the backends it is
handed. exporter.cli.build_context (the daemon and the one-shot commands), the simulated node
and the tests all build their Context here, so a fake goes through the same wiring as the real
backend and nothing else constructs a part of the process."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter import dmi
from exporter.attribution.fault import fresh_reading
from exporter.attribution.history import WorkloadHistory
from exporter.collector import Context
from exporter.deadline import Pool
from exporter.imds import IdentitySource
from exporter.nvml.session import NvmlSession

if TYPE_CHECKING:
    from exporter.config import Config
    from exporter.xid.store import AcksFile


def compose(config: Config, *, nvml: NvmlSession | None = None,
            statvfs: Callable[[str], os.statvfs_result] = os.statvfs, imds_url: str | None = None,
            pool: Pool | None = None, xid_source: str | None = None,
            xid_acks_file: type[AcksFile] | None = None) -> Context:
    """Every part of a process, built once and wired:

    - `pool`: the threads of every read under a deadline (None: a new one; the caller closes it);
    - `nvml`: the NVML session (None: the real library, loaded on first use);
    - `statvfs`: how a mount's capacity is read; `imds_url`: the IMDS base URL (a simulated
      node's fake on 127.0.0.1; None: config's `instance.imds_endpoint`);
    - the instance identity (config, the DMI product name under the sysfs root, then IMDS; its
      background lookup is started by the daemon, `IdentitySource.start`, never by a scrape);
    - the workload source from the config's `workload` section (None when no kind is set) and
      the `WorkloadHistory` that hears each of its readings;
    - the XID service (None without an xid section), told which kernel log its counts come from
      and its acks file's kind (`xid_source`, `xid_acks_file`, None: paths.kmsg and the
      product's AcksFile; see XidService) and asking the workload source for a fresh reading
      when it counts a fault."""
    pool = pool if pool is not None else Pool()
    nvml = nvml if nvml is not None else NvmlSession.real(pool)
    identity = IdentitySource(config, imds_url=imds_url,
                              dmi_instance_type=dmi.instance_type(config.paths.sysfs),
                              on_ec2=dmi.on_ec2(config.paths.sysfs) if imds_url is None else None)
    workloads = WorkloadHistory()
    workload = None
    if getattr(config, "workload", None) is not None:
        from exporter.workload.source import from_config

        workload = from_config(config, nvml, pool)
    xid = None
    if getattr(config, "xid", None) is not None:
        from exporter.xid.service import XidService

        kind = {"acks_file": xid_acks_file} if xid_acks_file is not None else {}
        xid = XidService(config, nvml, source=xid_source, workloads=workloads, **kind)
    if workload is not None:  # fault attribution hears every reading the source takes
        workload.listeners.append(workloads.observe)
        if xid is not None:  # and asks for one when a fault is counted
            xid.fresh_readings(fresh_reading(workload, nvml))
    return Context(config=config, nvml=nvml, statvfs=statvfs, identity=identity, workload=workload,
                   xid=xid, workloads=workloads, pool=pool)
