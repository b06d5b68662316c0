"""The composition root: every part of the process is built here, once, and handed its
dependencies through its constructor; nothing is wired after construction.

- `compose(config, ...)`: a Context from a validated config and the backends it is handed (the
  simulated node, the tests and exporter.startup.build_context (a command line's config and
  backends) build theirs here, so a fake goes through the same wiring; the daemon's
  collectors, runner, server and signals are built by exporter.serve);
- `xid_service(...)`: the XID service's parts (exporter.xid.service lists them).
Process start-up (malloc arenas, the open-file limit, signals) is exporter.lifecycle's."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter import dmi
from exporter.attribution.fault import FaultAttribution, fresh_reading
from exporter.attribution.history import WorkloadHistory
from exporter.collector import Context
from exporter.collectors.nvswitch import NvswitchSection
from exporter.collectors.workload import from_config
from exporter.collectors.xid import XidSection
from exporter.deadline import Pool
from exporter.imds import IdentitySource
from exporter.nvml.session import NvmlSession

if TYPE_CHECKING:
    from exporter.config import Config
    from exporter.workload.model import WorkloadReading
    from exporter.xid.kmsg import Record
    from exporter.xid.service import XidService
    from exporter.xid.store import AcksFile

FreshReading = Callable[[float], "WorkloadReading | None"]


def compose(config: Config, *, nvml: NvmlSession | None = None,
            statvfs: Callable[[str], os.statvfs_result] = os.statvfs, imds_url: str | None = None,
            pool: Pool | None = None, xid_source: str | None = None,
            xid_acks_file: type[AcksFile] | None = None, read_only: bool = False,
            fresh: FreshReading | None = None) -> Context:
    """Every part of a process, built once and wired:

    - `pool`: the threads of every read under a deadline (None: a new one; the caller closes it);
    - `nvml`: the NVML session (None: the real library, loaded on first use);
    - `statvfs`: how a mount's capacity is read; `imds_url`: the IMDS base URL (a simulated
      node's fake on 127.0.0.1; None: config's `instance.imds_endpoint`);
    - the instance identity (config, the DMI product name under the sysfs root, then IMDS; its
      background lookup is started by the daemon, `IdentitySource.start`, never by a scrape);
    - the workload source from the config's `workload` section (None when no kind is set),
      telling the `WorkloadHistory` each of its readings;
    - the XID service (None without an xid section): see xid_service for `xid_source`,
      `xid_acks_file` and `read_only`; its fault attribution asks the workload source for a
      fresh reading when it counts a fault (`fresh`, None: that; a test's stand-in otherwise)."""
    pool = pool if pool is not None else Pool()
    nvml = nvml if nvml is not None else NvmlSession.real(pool)
    identity = IdentitySource(config, imds_url=imds_url,
                              dmi_instance_type=dmi.instance_type(config.paths.sysfs),
                              on_ec2=dmi.on_ec2(config.paths.sysfs) if imds_url is None else None)
    workloads = WorkloadHistory()
    # the workload section's source (None without a kind); fault attribution hears its every reading
    workload = from_config(config, nvml, pool, listeners=[workloads.observe])
    if fresh is None and workload is not None:  # and asks for one when a fault is counted
        fresh = fresh_reading(workload, nvml)
    xid = None
    if config.find(XidSection) is not None:
        xid = xid_service(config, nvml, source=xid_source, workloads=workloads, fresh=fresh,
                          acks_file=xid_acks_file, read_only=read_only)
    return Context(config=config, nvml=nvml, statvfs=statvfs, identity=identity, workload=workload,
                   xid=xid, workloads=workloads, pool=pool)


def xid_service(config: Config, nvml: NvmlSession, *, source: str | None = None,
                workloads: WorkloadHistory | None = None, fresh: FreshReading | None = None,
                acks_file: type[AcksFile] | None = None, read_only: bool = False) -> XidService:
    """The XID service and its parts. `source` names the kernel log the state's counts come from
    (None: paths.kmsg; a simulated node or a replayed capture has its own); `workloads`: what the
    workload source observed (None: an empty history, so every event is attributed as unknown);
    `fresh`: a workload reading taken after a fault (None: none); `acks_file`: the acks file's
    kind (None: the product's; the simulated node shares acks across its kernel logs,
    exporter.tools.simulate.acks); `read_only` (`check`): corrupt state files are reported and left in
    place for the daemon, which sets them aside and records the recovery.

    `xid.enabled: false` builds no XID counter (no XID is counted, no NVML event watcher) and
    `nvswitch.enabled: false` no SXid counter; the state files are still read for the verdict."""
    from exporter.state.file import read_boot_id
    from exporter.xid.clock import KernelClock
    from exporter.xid.counter import SxidCounter, XidCounter
    from exporter.xid.follower import KmsgFollower
    from exporter.xid.identities import GpuIdentities
    from exporter.xid.persistence import XidPersistence
    from exporter.xid.policy import Policy
    from exporter.xid.service import XidService
    from exporter.xid.store import XID_EVENTS, AcksFile, EventStore
    from exporter.xid.sxid_catalog import SxidPolicy
    from exporter.xid.sxid_state import SXID_EVENTS

    cfg = config.section(XidSection)
    nvswitch = config.find(NvswitchSection)
    sxid_enabled = nvswitch is None or bool(nvswitch.enabled)
    policy = Policy(cfg.policy)
    sxid_policy = SxidPolicy(nvswitch.policy, nvswitch.fatal_tier) if nvswitch else SxidPolicy()
    clock = KernelClock()
    boot_id = read_boot_id(config.paths.procfs)
    identities = GpuIdentities(nvml)
    store, sxids = EventStore(XID_EVENTS, cfg.merge_window_seconds), EventStore(SXID_EVENTS)
    # Each counted event records the workloads on its GPU(s) then (exporter.attribution).
    attribution = FaultAttribution(workloads or WorkloadHistory(), identities, fresh=fresh,
                                   kernel_offset=lambda: clock.offset_s)
    counter = XidCounter(store, identities, policy, clock, cfg.kmsg, attribution=attribution) \
        if cfg.enabled else None
    sxid_counter = SxidCounter(sxids, sxid_policy, clock, attribution=attribution) if sxid_enabled else None
    consumers: dict[str, Callable[[Record, bool], None]] = {
        name: c.handle_record for name, c in (("xid", counter), ("sxid", sxid_counter)) if c is not None}
    follower = KmsgFollower(config.paths.kmsg, consumers, clock, enabled=cfg.kmsg)
    persistence = XidPersistence(
        config.paths.state_dir, boot_id, source or config.paths.kmsg, store, identities, sxids, follower,
        attribution.ledger, read_only=read_only, acks_kind=acks_file or AcksFile,
        write_xids=counter is not None, sxids_enabled=sxid_enabled)
    return XidService(cfg, kmsg_path=config.paths.kmsg, policy=policy, sxid_policy=sxid_policy, clock=clock,
                      identities=identities, store=store, sxids=sxids, counter=counter,
                      sxid_counter=sxid_counter, attribution=attribution, follower=follower,
                      persistence=persistence)
