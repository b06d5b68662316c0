"""Find the EFA devices among <sysfs>/class/infiniband entries, by PCI identity, never by name."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from exporter.efa.parse import is_efa, parse_hex_id
from exporter.efa.sysfs import SysfsReader


@dataclass(frozen=True)
class EfaDevice:
    name: str  # the RDMA device name (efa_0, rdmap16s27, ...): the `device` label
    path: str  # <sysfs>/class/infiniband/<name>
    pci_address: str  # e.g. 0000:10:1b.0 ("" when the device link cannot be resolved)
    pci_device_id: str  # e.g. 0xefa1 ("" when unreadable but the driver link says efa)


RECHECK_S = 5.0  # class/infiniband is listed again at least this often
RACY_NS = 2_000_000_000  # a directory changed this recently may change again unseen in the same tick


class Discovery:
    """Finds the EFA devices. `discover` lists class/infiniband; `devices` lists it only when the
    device set may have changed: its directory's stat changed (a file system that stamps it; sysfs
    may not), `recheck` was asked (after a read error), or RECHECK_S passed since the last listing.
    The identity of entries that are symlinks is kept, keyed by their target: the target names
    the PCI function, whose vendor/device never change, so only new entries cost PCI reads."""

    def __init__(self, sysfs: str, reader: SysfsReader) -> None:
        self.class_dir = os.path.join(sysfs, "class", "infiniband")
        self.reader = reader
        self._known: dict[tuple[str, str], EfaDevice | None] = {}
        self._found: list[EfaDevice] = []
        self._key: tuple[int, int, int] | None = None  # the class directory's stat when listed
        self._listed_at = -RECHECK_S
        self._racy = True

    def devices(self, recheck: bool = False) -> list[EfaDevice]:
        try:
            st = self.reader.stat(self.class_dir)
            key: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None
        now = time.monotonic()
        if recheck or self._racy or key != self._key or now - self._listed_at >= RECHECK_S:
            self._found = self.discover()
            self._key, self._listed_at = key, now
            recent = time.time_ns() - RACY_NS
            self._racy = key is not None and (key[1] >= recent or key[2] >= recent)
        return self._found

    def discover(self) -> list[EfaDevice]:
        try:
            names = self.reader.listdir(self.class_dir)
        except FileNotFoundError:
            return []  # no RDMA device at all (or no ib core loaded)
        found: list[EfaDevice] = []
        live: dict[tuple[str, str], EfaDevice | None] = {}
        for name in sorted(names):
            path = os.path.join(self.class_dir, name)
            target = self.reader.readlink_or_none(path)
            key = (name, target) if target is not None else None
            if key is not None and key in self._known:
                dev = self._known[key]
            else:
                try:
                    dev = self._identify(name, path)
                except FileNotFoundError:
                    continue  # vanished while we looked
                if dev is not None and not dev.pci_device_id:
                    key = None  # identified by the driver link alone: read the PCI id again next time
            if key is not None:
                live[key] = dev
            if dev is not None:
                found.append(dev)
        self._known = live  # forget entries that went away
        return found

    def _identify(self, name: str, path: str) -> EfaDevice | None:
        pci = os.path.join(path, "device")
        vendor = device = None
        try:
            vendor = parse_hex_id(self.reader.read(os.path.join(pci, "vendor")))
            device = parse_hex_id(self.reader.read(os.path.join(pci, "device")))
        except ValueError:
            pass
        except FileNotFoundError:
            if not self.reader.exists(path):
                raise
        except OSError:
            pass  # unreadable PCI identity (EACCES): the driver link still tells
        driver_link = self.reader.readlink_or_none(os.path.join(pci, "driver"))
        driver = os.path.basename(driver_link) if driver_link else None
        if not is_efa(vendor, device, driver):
            return None
        pci_link = self.reader.readlink_or_none(pci)
        address = os.path.basename(pci_link) if pci_link else os.path.basename(self.reader.realpath(pci))
        return EfaDevice(name, path, address, f"0x{device:04x}" if device is not None else "")
