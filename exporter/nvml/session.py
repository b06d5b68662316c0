"""The one NVML session of the process, shared by the GPU collector and the XID/event code.

The composition root creates it once (Context.nvml) from the backend the process asks for: the
real library (`NvmlSession.real()`), a capture to replay (`for_capture`), or any backend or
backend factory (a simulated node's fake, exporter.tools.simulate); the backend is only loaded (pynvml
imported, a capture read) on the first `ensure()`, so a process that never uses NVML never pays
for it. `ensure()` initialises NVML and reads each GPU's identity once.
When NVML cannot be initialised (no driver, no library) the session still exists with `.error`
saying why, so callers can report the reason; `ensure()` retries the initialisation on later
scrapes with exponential back-off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from exporter.deadline import Deadlines, Pool
from exporter.nvml.backend import (
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_UNINITIALIZED,
    NvmlBackend,
    NvmlError,
)

log = logging.getLogger("exporter.nvml")

RETRY_FIRST_S = 10.0
RETRY_MAX_S = 300.0
IDENTITY_TIMEOUT_S = 3.0  # a GPU whose identity calls hang is left unidentified, not waited for


@dataclass(frozen=True)
class DeviceIdentity:
    index: int
    uuid: str  # "" when it could not be read (GPU lost at start)
    pci_bus_id: str  # as NVML reports it: 00000000:53:00.0
    name: str


def pci_key(addr: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address in any of the forms NVML and the kernel log use:
    "00000000:53:00.0", "0000:53:00.0", "PCI:0000:53:00", "0000:53:00", "53:00.0"."""
    s = addr.strip().lower()
    if s.startswith("pci:"):
        s = s[4:]
    parts = s.split(":")
    try:
        if len(parts) == 3:
            domain, bus, devfn = int(parts[0], 16), int(parts[1], 16), parts[2]
        elif len(parts) == 2:
            domain, bus, devfn = 0, int(parts[0], 16), parts[1]
        else:
            return None
        return domain, bus, int(devfn.split(".")[0], 16)
    except ValueError:
        return None


class NvmlSession:
    """An NVML backend plus what every user needs: the GPUs' identities and who is lost."""

    def __init__(self, backend: NvmlBackend | None = None, clock: Any = time.monotonic,
                 identity_timeout_s: float = IDENTITY_TIMEOUT_S,
                 make: Callable[[], NvmlBackend] | None = None, *, pool: Pool) -> None:
        """Give the backend, or `make`, which makes it on the first ensure(); `pool`: the
        process's (exporter.deadline), where the GPUs' identities are read."""
        self._make = make
        self.backend: NvmlBackend = backend if backend is not None else UnavailableBackend("not loaded yet")
        self.identity_timeout_s = identity_timeout_s
        # a GPU whose identity calls hang is not waited for past the deadline
        self._ids = Deadlines(pool)
        self.devices: list[DeviceIdentity] = []
        self.lost: set[int] = set()
        self.error = "not initialised yet"
        self.driver_version = ""
        self.nvml_version = ""
        self.cuda_driver_version = ""
        self._ok = False
        self._lock = threading.Lock()
        self._clock = clock
        self._next_try = 0.0
        self._retry_s = RETRY_FIRST_S
        self._by_pci: dict[tuple[int, int, int], DeviceIdentity] = {}
        self._by_uuid: dict[str, DeviceIdentity] = {}

    @classmethod
    def for_capture(cls, path: str, latencies: bool, pool: Pool) -> NvmlSession:
        """A session replaying a capture file (made by `capture`); an unreadable file leaves NVML
        unavailable, saying why."""
        def make() -> NvmlBackend:
            from exporter.nvml.fake import FakeBackend

            try:
                return FakeBackend.from_file(path, latencies=latencies)
            except (OSError, ValueError, KeyError) as e:
                return UnavailableBackend(f"cannot load NVML capture {path}: {e}")
        return cls(make=make, pool=pool)

    @classmethod
    def real(cls, pool: Pool) -> NvmlSession:
        """A session on the real NVML library (pynvml), loaded on the first ensure()."""
        def make() -> NvmlBackend:
            from exporter.nvml.pynvml_backend import PynvmlBackend

            return PynvmlBackend()
        return cls(make=make, pool=pool)

    @property
    def ok(self) -> bool:
        return self._ok

    def ensure(self) -> bool:
        """Initialise NVML if it is not yet (at most once per back-off period); True when usable."""
        if self._ok:
            return True
        with self._lock:
            if self._ok:
                return True
            now = self._clock()
            if now < self._next_try:
                return False
            if self._make is not None:
                self.backend, self._make = self._make(), None
            try:
                self.backend.init()
                count = self.backend.device_count()
                self.driver_version = str(self._system("nvmlSystemGetDriverVersion"))
                self.nvml_version = str(self._system("nvmlSystemGetNVMLVersion"))
                cuda = self._system("nvmlSystemGetCudaDriverVersion")
                if isinstance(cuda, int):
                    self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
                self._set_devices(self._identities(count))
            except NvmlError as e:
                self.error = f"NVML could not be initialised: {e} (NVML error {e.code})"
                self._next_try = now + self._retry_s
                self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)
                return False
            self.error = ""
            self._ok = True
            self._retry_s = RETRY_FIRST_S
            log.info("NVML %s, driver %s: %d GPU(s)", self.nvml_version, self.driver_version,
                     len(self.devices))
            return True

    def _system(self, fn: str) -> Any:
        try:
            return self.backend.system(fn)
        except NvmlError:
            return ""

    def _identity(self, index: int) -> DeviceIdentity:
        def read(fn: str) -> Any:
            try:
                return self.backend.call(index, fn)
            except NvmlError as e:
                if e.gpu_lost:
                    self.lost.add(index)
                return None
        pci = read("nvmlDeviceGetPciInfo") or {}
        return DeviceIdentity(index, read("nvmlDeviceGetUUID") or "", pci.get("busId", "") or "",
                              read("nvmlDeviceGetName") or "")

    def _identities(self, count: int) -> list[DeviceIdentity]:
        """Every GPU's identity, one after another, each under the identity deadline: a GPU whose
        calls hang (they cannot be interrupted) costs it once and is listed with empty uuid and
        address, to be read again once it answers (refresh_identity), instead of holding up the
        whole node."""
        outcomes = self._ids.each(range(count), self._identity, timeout=self.identity_timeout_s)
        missing = [i for i, o in enumerate(outcomes) if not o.ok]
        if missing:
            log.warning("NVML did not answer identity calls of GPU(s) %s within %gs", missing,
                        self.identity_timeout_s)
        return [o.value if o.ok else DeviceIdentity(i, "", "", "") for i, o in enumerate(outcomes)]

    def _set_devices(self, devices: list[DeviceIdentity]) -> None:
        self.devices = devices
        self._by_pci = {k: d for d in devices if (k := pci_key(d.pci_bus_id)) is not None}
        self._by_uuid = {d.uuid.lower(): d for d in devices if d.uuid}

    def refresh_identity(self, index: int) -> DeviceIdentity:
        """Read a GPU's identity again (it was lost when first read and came back)."""
        with self._lock:
            devs = list(self.devices)
            devs[index] = self._identity(index)
            self._set_devices(devs)
            return devs[index]

    def by_pci(self, addr: str) -> DeviceIdentity | None:
        k = pci_key(addr)
        return self._by_pci.get(k) if k else None

    def by_uuid(self, uuid: str) -> DeviceIdentity | None:
        return self._by_uuid.get(uuid.strip().lower())

    def mark_lost(self, index: int) -> None:
        self.lost.add(index)

    def clear_lost(self, index: int) -> None:
        self.lost.discard(index)

    def close(self) -> None:
        if self._ok:
            try:
                self.backend.shutdown()
            except NvmlError:
                pass
            self._ok = False


class UnavailableBackend(NvmlBackend):
    """Stands in when no backend could be built (an unreadable capture file): init says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def init(self) -> None:
        raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND, self.reason)

    def shutdown(self) -> None: ...

    def _fail(self, *args: object, **kwargs: object) -> NoReturn:
        raise NvmlError(NVML_ERROR_UNINITIALIZED, self.reason)

    system = device_count = call = field_values = _fail
    event_set_create = register_events = event_wait = event_set_free = _fail
