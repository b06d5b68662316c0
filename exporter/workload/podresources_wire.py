"""A bounded decoder of the kubelet's pod-resources v1 `ListPodResourcesResponse` (protobuf wire
format, the messages of exporter/workload/podresources/api.proto) into the few fields the exporter
reads: each container's device-plugin devices and its DRA claims' devices.

Why not protobuf's own parser: it allocates the whole message before any count can be checked,
and an answer of one-character device ids costs ~10x its size there and ~100x once turned into
Python objects (issue 35: a 4 MiB answer took the daemon to 571 MiB, past the 256 MiB that the
systemd unit and the DaemonSet allow). This decoder counts while it decodes, keeps only the fields
it needs, skips every other field by its length without looking inside, and stops with
`AnswerTooLarge` at the first count over its limit. tests/test_workload_kubelet.py checks that it
decodes what protobuf's encoder (the committed api_pb2) writes exactly as protobuf decodes it.

Limits (per answer, before anything is allocated for the entry over the limit):
- pods, containers, devices (device ids, DRA claim devices and CDI device names together), and
  fields visited (every field of every message descended into, kept or skipped): MAX_* below;
- a kept string (pod, namespace, container, resource, device id, claim, driver, pool, device or CDI
  name) is at most MAX_STRING bytes: Kubernetes names are at most 253, device ids far less.
The bytes themselves are bounded by the caller (the gRPC length prefix; exporter.workload.grpc_h2)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

MAX_PODS = 4096  # kubelet max-pods is 110 by default, 737 on the largest EKS instances
MAX_CONTAINERS = 16384
MAX_DEVICES = 16384  # 8 GPUs x 7 MIG instances x 48 time-slicing replicas is 2,688
MAX_FIELDS = 262144  # every field visited: bounds the CPU of one decode (about 0.2 s in Python)
MAX_STRING = 1024


class AnswerTooLarge(ValueError):
    """The answer holds more of something than the exporter reads (the message says what)."""


class Malformed(ValueError):
    """The bytes are not a ListPodResourcesResponse."""


@dataclass(frozen=True)
class Device:
    """One device id given to one container by a device plugin, as the kubelet lists it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a DRA claim given to one container: the driver/pool/device triplet that names
    it in the ResourceSlice, and its CDI device names (either may be empty)."""

    namespace: str
    pod: str
    container: str
    claim: str  # namespace/name of the ResourceClaim
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]


class _Budget:
    __slots__ = ("pods", "containers", "devices", "fields")

    def __init__(self) -> None:
        self.pods = self.containers = self.devices = self.fields = 0


def _over(what: str, limit: int) -> AnswerTooLarge:
    return AnswerTooLarge(f"the answer lists more than {limit:,} {what}: not read")


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= end or shift > 63:
            raise Malformed("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: memoryview, start: int, end: int, budget: _Budget) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of the message buf[start:end];
    every other wire type is skipped (counted as visited)."""
    i = start
    while i < end:
        budget.fields += 1
        if budget.fields > MAX_FIELDS:
            raise _over("fields", MAX_FIELDS)
        key = buf[i]  # one byte for field numbers up to 15, as every field here
        i += 1
        if key >= 0x80:
            key, i = _varint(buf, i - 1, end)
        number, wire = key >> 3, key & 7
        if wire == 2:
            n = buf[i] if i < end else 0x80
            if n < 0x80:
                i += 1
            else:
                n, i = _varint(buf, i, end)
            if i + n > end:
                raise Malformed("a field runs past the end of its message")
            yield number, i, i + n
            i += n
        elif wire == 0:
            _, i = _varint(buf, i, end)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:  # groups (3, 4) are not in this proto3 API; 6 and 7 do not exist
            raise Malformed(f"wire type {wire} in field {number}")
        if i > end:
            raise Malformed("a field runs past the end of its message")


def _str(buf: memoryview, start: int, end: int) -> str:
    if end - start > MAX_STRING:
        raise AnswerTooLarge(f"a name of {end - start:,} bytes (at most {MAX_STRING:,} are read): not read")
    return bytes(buf[start:end]).decode("utf-8", "replace")


def decode_list(data: bytes | bytearray | memoryview) -> tuple[list[Device], list[ClaimDevice]]:
    """The devices and DRA claim devices of a ListPodResourcesResponse; raises AnswerTooLarge
    or Malformed."""
    buf = memoryview(data)
    budget = _Budget()
    devices: list[Device] = []
    claims: list[ClaimDevice] = []
    for number, s, e in _fields(buf, 0, len(buf), budget):
        if number == 1:  # ListPodResourcesResponse.pod_resources
            budget.pods += 1
            if budget.pods > MAX_PODS:
                raise _over("pods", MAX_PODS)
            _pod(buf, s, e, budget, devices, claims)
    return devices, claims


def _pod(buf: memoryview, start: int, end: int, budget: _Budget, devices: list[Device],
         claims: list[ClaimDevice]) -> None:
    name = namespace = ""
    containers: list[tuple[int, int]] = []
    for number, s, e in _fields(buf, start, end, budget):
        if number == 1:
            name = _str(buf, s, e)
        elif number == 2:
            namespace = _str(buf, s, e)
        elif number == 3:
            budget.containers += 1
            if budget.containers > MAX_CONTAINERS:
                raise _over("containers", MAX_CONTAINERS)
            containers.append((s, e))  # decoded once the pod's name is known (fields come in any order)
    for s, e in containers:
        _container(buf, s, e, budget, namespace, name, devices, claims)


def _container(buf: memoryview, start: int, end: int, budget: _Budget, namespace: str, pod: str,
               devices: list[Device], claims: list[ClaimDevice]) -> None:
    name = ""
    plugin: list[tuple[int, int]] = []
    dynamic: list[tuple[int, int]] = []
    for number, s, e in _fields(buf, start, end, budget):
        if number == 1:
            name = _str(buf, s, e)
        elif number == 2:  # ContainerResources.devices
            plugin.append((s, e))
        elif number == 5:  # ContainerResources.dynamic_resources
            dynamic.append((s, e))
    for s, e in plugin:
        resource = ""
        ids: list[str] = []
        for number, fs, fe in _fields(buf, s, e, budget):
            if number == 1:
                resource = _str(buf, fs, fe)
            elif number == 2:
                budget.devices += 1
                if budget.devices > MAX_DEVICES:
                    raise _over("devices", MAX_DEVICES)
                ids.append(_str(buf, fs, fe))
        devices.extend(Device(namespace, pod, name, resource, i) for i in ids)
    for s, e in dynamic:
        _dynamic(buf, s, e, budget, namespace, pod, name, claims)


def _dynamic(buf: memoryview, start: int, end: int, budget: _Budget, namespace: str, pod: str,
             container: str, claims: list[ClaimDevice]) -> None:
    claim_name = claim_namespace = ""
    resources: list[tuple[int, int]] = []
    for number, s, e in _fields(buf, start, end, budget):
        if number == 2:
            claim_name = _str(buf, s, e)
        elif number == 3:
            claim_namespace = _str(buf, s, e)
        elif number == 4:  # DynamicResource.claim_resources
            resources.append((s, e))
    claim = f"{claim_namespace}/{claim_name}"
    for s, e in resources:
        fields = {2: "", 3: "", 4: ""}
        cdi: list[str] = []
        for number, fs, fe in _fields(buf, s, e, budget):
            if number == 1:  # ClaimResource.cdi_devices: CDIDevice {string name = 1}
                budget.devices += 1
                if budget.devices > MAX_DEVICES:
                    raise _over("devices", MAX_DEVICES)
                cdi_name = ""
                for n, cs, ce in _fields(buf, fs, fe, budget):
                    if n == 1:
                        cdi_name = _str(buf, cs, ce)
                cdi.append(cdi_name)
            elif number in fields:
                fields[number] = _str(buf, fs, fe)
        budget.devices += 1
        if budget.devices > MAX_DEVICES:
            raise _over("devices", MAX_DEVICES)
        claims.append(ClaimDevice(namespace, pod, container, claim, fields[2], fields[3], fields[4],
                                  tuple(cdi)))
