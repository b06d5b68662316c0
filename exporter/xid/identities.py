"""Which GPU sits at a PCI address: what NVML lists, and what this boot saw before (the state
file, `NVRM: GPU at PCI` lines). Bounded: at most MAX_IDENTITIES addresses are remembered, so
kernel-log lines cannot grow it (or the series and state file built on it) without limit.

Used by the XID counter (is an address a GPU? its cardinality guard spares those), the
collectors (labels) and the verdict. Never blocks on NVML except in `session()`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from exporter.state.values import MAX_INDEX, storable_uuid
from exporter.xid.parser import pci_key, pci_label

log = logging.getLogger("exporter.xid")

OTHER = "other"  # the shared bucket of PCI addresses beyond the limits (exporter.xid.store)
# An 8-GPU node uses 8; beyond this a `GPU at` line is dropped (an NVML GPU takes the place of
# one known only from such a line), so those lines cannot make addresses "listed".
MAX_IDENTITIES = 64


@dataclass
class Identity:
    index: int | None
    uuid: str


class GpuIdentities:
    """PCI key -> Identity, bounded, plus the NVML session's listing. Thread-safe."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.lock = threading.Lock()
        self.known: dict[str, Identity] = {}
        self.dropped = 0  # identities refused by MAX_IDENTITIES
        self.version = 0  # bumps when an identity changes (worth writing)
        self._listed: Any = None  # the NVML session whose GPUs were last recorded

    # -- NVML --------------------------------------------------------------------------------------
    def session(self) -> Any:
        """The process's NVML session, or None when NVML is not usable."""
        s = self.nvml
        if s is None:
            return None
        try:
            if not s.ensure():
                return None
        except Exception as e:  # noqa: BLE001 - NVML problems never take the XID counts down
            log.debug("NVML session unavailable: %s", e)
            return None
        self.note_listed(s)
        return s

    def note_listed(self, s: Any) -> None:
        """Record the GPUs an initialised NVML session lists."""
        if s.ok and self._listed is not s:
            self._listed = s
            for d in s.devices:
                k = pci_key(d.pci_bus_id)
                if k is not None:
                    self.identify(k, d.index, d.uuid)

    # -- the map -----------------------------------------------------------------------------------
    def identify(self, pci: str, index: int | None = None, uuid: str = "") -> None:
        uuid = storable_uuid(uuid)  # the state file holds it
        if index is not None and not 0 <= index <= MAX_INDEX:
            index = None
        with self.lock:
            cur = self.known.get(pci)
            if cur is None:
                if pci == OTHER or not self._room(index is not None):
                    self.dropped += 1
                    return
                self.known[pci] = Identity(index, uuid)
                self.version += 1
                return
            if index is not None and cur.index != index:
                cur.index = index
                self.version += 1
            if uuid and cur.uuid != uuid:
                cur.uuid = uuid
                self.version += 1

    def _room(self, nvml: bool) -> bool:
        """Whether a new identity fits; one NVML lists may replace one known only from a line."""
        if len(self.known) < MAX_IDENTITIES:
            return True
        if nvml:
            victim = next((p for p, i in self.known.items() if i.index is None), None)
            if victim is not None:
                del self.known[victim]
                return True
        return False

    def get(self, pci: str) -> Identity | None:
        with self.lock:
            cur = self.known.get(pci)
            return None if cur is None else Identity(cur.index, cur.uuid)

    def by_index(self, index: int) -> str | None:
        with self.lock:
            return next((p for p, i in self.known.items() if i.index == index), None)

    def is_listed(self, pci: str) -> bool:
        """Whether a GPU sits at `pci`: NVML lists it (now, or earlier this boot, as kept in the
        state file) or the driver named it in a `GPU at PCI` line. Never blocks on NVML."""
        ident = self.known.get(pci)
        if ident is not None and (ident.index is not None or ident.uuid):
            return True
        s = self._listed
        return s is not None and s.by_pci(pci) is not None

    def labels(self, pci: str, ask_nvml: bool = True) -> tuple[str, str, str]:
        """(gpu, uuid, pci_bus_id) for a PCI key: from NVML when it lists the GPU, else from what
        this boot saw of it before (state file, `GPU at PCI` lines), else just the address.
        `ask_nvml=False` never initialises NVML (for a log line from the follower thread)."""
        if pci == OTHER:
            return "", "", OTHER
        if ask_nvml:
            s = self.session()
        else:  # what an already initialised session lists, without calling NVML
            if self.nvml is not None and getattr(self.nvml, "ok", False):
                self.note_listed(self.nvml)
            s = self._listed
        dev = s.by_pci(pci) if s is not None else None
        if dev is not None:
            self.identify(pci, dev.index, dev.uuid)
            return str(dev.index), dev.uuid, dev.pci_bus_id or pci_label(pci)
        ident = self.get(pci)
        if ident is not None:
            return ("" if ident.index is None else str(ident.index)), ident.uuid, pci_label(pci)
        return "", "", pci_label(pci)

    # -- state file ----------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        with self.lock:
            return {p: {"index": i.index, "uuid": i.uuid} for p, i in self.known.items()}

    def load(self, gpus: dict[str, Any]) -> None:
        """Take a validated state file's `gpus` (within the limit; what is known stays)."""
        for p, ident in dict(gpus or {}).items():
            with self.lock:
                if p in self.known or p == OTHER or not self._room(ident.get("index") is not None):
                    continue
                self.known[str(p)] = Identity(ident.get("index"), str(ident.get("uuid") or ""))
                self.version += 1
