"""Simulated nodes: generated sysfs/procfs/debugfs trees and kernel logs plus the fake NVML
backend, so the exporter runs end to end on a machine without GPUs, EFA or Lustre.

Each source contributes a `SimSource` in a module of this package (discovered automatically):
it builds its part of the tree, names the fault scenarios it understands, and advances its
counters on each tick of the simulation clock.

The simulation stays at the edge: the composition root (exporter.cli, a test, a bench) makes
it, takes what `prepare()` hands over once (`SimulatedSources`: the roots of its tree and kernel
log, the fake NVML, the statvfs of its mounts, its fake IMDS, the name and state file of its
kernel log), and runs its clock. No product module reads a Simulation.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import pkgutil
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from exporter.dmi import PRODUCT_NAME
from exporter.profiles import PROFILES, SIMULATED
from exporter.tools.simulate.source import Shape, SimSource

if TYPE_CHECKING:
    from exporter.collector import Context
    from exporter.config import Config
    from exporter.nvml.fake import FakeBackend
    from exporter.xid.store import AcksFile

log = logging.getLogger("exporter.tools.simulate")


def source_classes() -> list[type[SimSource]]:
    out = []
    for mod in pkgutil.iter_modules(__path__):
        m = importlib.import_module(f"{__name__}.{mod.name}")
        cls = getattr(m, "SOURCE", None)
        if cls is not None:
            out.append(cls)
    return sorted(out, key=lambda c: c.name)


def all_scenarios() -> dict[str, str]:
    out: dict[str, str] = {}
    for cls in source_classes():
        out.update(cls.scenarios)
    return out


ROOT_PREFIX = "ghe-sim-"
OWNER_FILE = "owner"  # "pid starttime" of the process that made the root


def _process_identity(pid: int) -> str:
    """pid and start time (clock ticks since boot, /proc/PID/stat field 22): a reused pid differs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        start = "?"
    return f"{pid} {start}"


def remove_abandoned_roots(tmp: str | None = None) -> list[Path]:
    """Remove simulated-node roots whose owner process is gone (SIGKILLed, so close() never ran).
    A root whose owner file is missing (being made, or made by an older version) is left alone."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(ROOT_PREFIX + "*"):
        try:
            if d.is_symlink() or d.stat().st_uid != os.getuid():
                continue
            owner = (d / OWNER_FILE).read_text().split()
            if len(owner) != 2 or _process_identity(int(owner[0])) == " ".join(owner):
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


@dataclass(frozen=True)
class SimulatedSources:
    """What a simulated node hands the composition root (exporter.startup.build_context), once."""

    sysfs: str  # the roots of its generated trees
    procfs: str
    debugfs: str
    kmsg: str  # its kernel log, a file of /dev/kmsg records
    state_dir: str
    settings: Mapping[str, Any]  # other config keys its sources set (IMDS, `lfs`, ioctl off...)
    nvml: Callable[[], FakeBackend]  # makes its fake NVML (one per session)
    statvfs: Callable[[str], os.statvfs_result]  # answers for its mounts
    imds_url: str | None  # its fake IMDS on 127.0.0.1; None: IMDS off
    kmsg_source: str  # what names its kernel log in the state files
    xid_acks_file: type[AcksFile]  # keeps its acks across scenario flags (exporter.tools.simulate.acks)

    def config(self) -> dict[str, Any]:
        """The config layer it makes, between the file and the flags: its roots and settings."""
        return {"paths.sysfs": self.sysfs, "paths.procfs": self.procfs, "paths.debugfs": self.debugfs,
                "paths.kmsg": self.kmsg, "paths.state_dir": self.state_dir, **self.settings}


class Simulation:
    """A simulated node under `root` (a temporary directory unless given)."""

    def __init__(self, instance_type: str, scenarios: list[str] | None = None,
                 root: str | Path | None = None, tick_s: float = 1.0, shape: Shape | None = None) -> None:
        if instance_type not in SIMULATED:
            raise ValueError(f"unknown simulated instance type {instance_type!r}; expected one of "
                             + ", ".join(SIMULATED))
        known = all_scenarios()
        unknown = [s for s in scenarios or [] if s not in known]
        if unknown:
            raise ValueError(f"unknown scenario {unknown[0]!r}; expected one of " + ", ".join(sorted(known)))
        self.shape = shape or Shape()
        base = PROFILES[instance_type]
        self.profile = replace(base, gpus=base.gpus if self.shape.gpus is None else self.shape.gpus,
                               efa_devices=base.efa_devices if self.shape.efa_devices is None
                               else self.shape.efa_devices)
        self.scenarios = set(scenarios or [])
        self._own_root = root is None
        if root is None:
            remove_abandoned_roots()
            root = tempfile.mkdtemp(prefix=ROOT_PREFIX)
            # Written whole, then renamed: a process killed in between leaves no empty owner file,
            # which remove_abandoned_roots would leave alone for ever.
            (Path(root) / f"{OWNER_FILE}.tmp").write_text(_process_identity(os.getpid()))
            (Path(root) / f"{OWNER_FILE}.tmp").rename(Path(root) / OWNER_FILE)
        self.root = Path(root)
        self.tick_s = tick_s
        self.sources = [cls(self.root, self.profile, self.scenarios) for cls in source_classes()]
        for src in self.sources:
            src.configure(self.shape)
        self._fake_nvml: list[FakeBackend] = []  # the fakes handed out, whose clocks play() moves
        self._played: float | None = None
        self._built = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    def build(self) -> Simulation:
        """Write the node's trees and start its servers (once: again does nothing)."""
        if self._built:
            return self
        self._built = True
        for d in ("sys", "proc", "sys/kernel/debug", "dev", "state"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        # what EC2 firmware says: the instance type is the DMI product name (exporter/dmi.py)
        dmi_file = self.root / "sys" / PRODUCT_NAME
        dmi_file.parent.mkdir(parents=True, exist_ok=True)
        dmi_file.write_text(self.profile.instance_type + "\n")
        for s in self.sources:
            s.build()
        return self

    def prepare(self, nvml_latencies: bool = False) -> SimulatedSources:
        """Build the node (unless built) and return what it hands the composition root."""
        from exporter import collectors
        from exporter.tools.simulate.acks import SharedAcksFile

        collectors.collector_classes()  # every section its settings are in is declared
        self.build()
        settings: dict[str, Any] = {
            "instance.imds": self.imds_url is not None,
            # its FSx mount is files in a tree: no `lfs` to run, no ioctl to make on it
            "lustre.lfs_command": "",
            "lustre.use_ioctl": False,
        }
        for src in self.sources:
            settings.update(src.settings())
        # a shape that is not the profile's: the expected counts follow it
        if self.shape.gpus is not None:
            settings["node.expected_gpus"] = self.profile.gpus
        if self.shape.efa_devices is not None:
            settings["efa.expected_devices"] = self.profile.efa_devices
        return SimulatedSources(
            sysfs=str(self.root / "sys"), procfs=str(self.root / "proc"),
            debugfs=str(self.root / "sys/kernel/debug"), kmsg=self.kmsg_path,
            state_dir=str(self.root / "state"), settings=MappingProxyType(settings),
            nvml=functools.partial(self.nvml_backend, nvml_latencies), statvfs=self.statvfs,
            imds_url=self.imds_url,
            # each set of scenario flags is its own kernel log, whose counts are kept apart; the
            # node's acks hold across them (its root is a temporary directory: not in the name)
            kmsg_source=f"simulated:{self.profile.instance_type}:{','.join(sorted(self.scenarios))}",
            xid_acks_file=SharedAcksFile)

    # -- the backends the composition root hands to the Context ------------------------------
    def nvml_backend(self, latencies: bool = False) -> FakeBackend:
        """A fake NVML of this node's GPUs with its `gpu-*` scenarios (one per NVML session)."""
        from exporter.tools.simulate.nvml import fake_backend

        fake = fake_backend(self.profile, sorted(self.scenarios), latencies=latencies)
        if self._played is not None:
            fake.advance_to(self._played)
        self._fake_nvml.append(fake)
        return fake

    def statvfs(self, path: str) -> os.statvfs_result:
        """What statvfs answers for the simulated node's mounts (written by its Lustre source)."""
        from exporter.tools.simulate.lustre import fake_statvfs

        return fake_statvfs(self.root)(path)

    def context(self, config: Config, nvml_latencies: bool = False) -> Context:
        """The Context build_context makes of this node's sources (tests and benches): `config`
        loaded with prepare()'s `config()`, the backends, kernel-log name and state file it hands in."""
        from exporter.compose import compose
        from exporter.deadline import Pool
        from exporter.nvml.session import NvmlSession

        sources, pool = self.prepare(nvml_latencies), Pool()
        return compose(config, nvml=NvmlSession(make=sources.nvml, pool=pool), statvfs=sources.statvfs,
                       imds_url=sources.imds_url, pool=pool, xid_source=sources.kmsg_source,
                       xid_acks_file=sources.xid_acks_file)

    @property
    def kmsg_path(self) -> str:
        return str(self.root / "dev" / "kmsg")

    def play(self, elapsed_s: float) -> None:
        """Freeze the node at `elapsed_s` seconds after its start, past the scenarios' onsets, for
        a one-shot command (`check`, `ack`) that must see what the daemon sees a few seconds in:
        its trees and kernel log, and its fake NVML's clock (now, and for fakes made later)."""
        self._played = elapsed_s
        self.advance(elapsed_s)
        for fake in self._fake_nvml:
            fake.advance_to(elapsed_s)

    def advance(self, elapsed_s: float | None = None) -> None:
        t = time.monotonic() - self._t0 if elapsed_s is None else elapsed_s
        for s in self.sources:
            s.advance(t)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.tick_s):
                try:
                    self.advance()
                except Exception:  # noqa: BLE001 - a tick that failed; the next one tries again
                    log.exception("simulation: advancing the simulated node failed")

        self._thread = threading.Thread(target=loop, name="simulation", daemon=True)
        self._thread.start()

    @property
    def imds_url(self) -> str | None:
        """The simulated IMDS (scenario ec2-scheduled-reboot) on 127.0.0.1, else None: IMDS off."""
        return next((s.url for s in self.sources if getattr(s, "url", None)), None)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the clock's thread, then the sources, then remove the tree: a tick still writing
        into the tree while it is deleted leaves files behind (and the thread a traceback)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():  # a tick stuck in a write: the tree cannot be removed safely
                log.error("simulation: the clock thread did not stop within %gs; leaving %s",
                          timeout_s, self.root)
                return
        for s in self.sources:
            s.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
