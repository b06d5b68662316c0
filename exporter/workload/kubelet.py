"""Kubernetes pods on the GPUs: the kubelet's pod-resources API, v1 `List`, over its unix socket
(/var/lib/kubelet/pod-resources/kubelet.sock), as dcgm-exporter reads it.

grpcio is imported only when this kind is enabled (`workload.kubelet_socket`); the protobuf
modules are generated from podresources/api.proto and committed.

Device ids are matched to GPUs (`assign`, pure) the ways device plugins name them:
- a GPU UUID (`GPU-...`, the NVIDIA device plugin's default);
- `nvidia<N>`: the GPU whose device node is /dev/nvidia<N> (NVML's minor number);
- a plain NVML index `N` (the plugin's `index` strategy; `N:M` for a MIG instance of GPU N);
- `MIG-<uuid>`: a MIG device, resolved to its GPU through NVML; the old form
  `MIG-GPU-<uuid>/<gi>/<ci>` names its GPU;
- any of these with a `::N` suffix (time-slicing replicas; EKS reports `MIG-<uuid>::7`).
Only resources whose name matches `workload.kubelet_resource_names` count (nvidia.com/gpu and
nvidia.com/mig-* by default). A device id that matches no GPU is a problem of the reading, and
then no GPU is reported idle (its pod may be on any of them).

The connection is kept between readings and made again when the socket is replaced (a kubelet
restart creates a new socket file), after a failure, or when the kubelet stops answering."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.nvml.backend import NvmlBackend, NvmlError
from exporter.nvml.session import DeviceIdentity
from exporter.workload.model import Workload

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-*"]
MAX_MESSAGE_BYTES = 16 << 20  # a node's pods and devices; the kubelet's own limit is 16 MiB
MAX_PROBLEMS = 5  # unmatched device ids named in one reading's problems

_MIG_OLD = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/[0-9]+/[0-9]+")
_INDEX = re.compile(r"([0-9]{1,4})(?::[0-9]{1,4})?")
_MINOR = re.compile(r"nvidia([0-9]{1,4})")


@dataclass(frozen=True)
class Device:
    """One device id given to one container, as the kubelet lists it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


class KubeletError(Exception):
    """The kubelet could not be asked (the message says why, naming the socket)."""


def wanted(resource: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(resource, p) for p in patterns)


@dataclass
class GpuIndex:
    """How device ids find GPUs: by UUID, by minor number (nvidia<N>), by NVML index, and MIG
    device UUID -> its GPU's UUID."""

    by_uuid: dict[str, str]  # lower-case UUID -> UUID
    by_minor: dict[int, str]
    by_index: dict[int, str]
    mig_parent: dict[str, str]  # lower-case MIG-... UUID -> GPU UUID

    def find(self, device_id: str) -> str | None:
        d = device_id.strip().split("::", 1)[0]
        low = d.lower()
        if low in self.by_uuid:
            return self.by_uuid[low]
        if low.startswith("mig-"):
            m = _MIG_OLD.fullmatch(d)
            if m:
                return self.by_uuid.get(m.group(1).lower())
            return self.mig_parent.get(low)
        if m := _MINOR.fullmatch(d):
            return self.by_minor.get(int(m.group(1)))
        if m := _INDEX.fullmatch(d):
            return self.by_index.get(int(m.group(1)))
        return None


def assign(devices: Iterable[Device], gpus: Sequence[DeviceIdentity], resources: Sequence[str],
           index: GpuIndex) -> tuple[dict[str, tuple[Workload, ...]], list[str]]:
    """Each GPU's containers (by UUID) and the GPU device ids that matched no GPU. With an
    unmatched id, only the GPUs that matched are observed (none is reported idle)."""
    held: dict[str, set[Workload]] = {}
    unmatched: list[str] = []
    for d in devices:
        if not wanted(d.resource, resources):
            continue
        uuid = index.find(d.device_id)
        if uuid is None:
            unmatched.append(f"{d.resource} device {d.device_id!r} of pod {d.namespace}/{d.pod} "
                             "matches no GPU")
            continue
        held.setdefault(uuid, set()).add(Workload(namespace=d.namespace, pod=d.pod, container=d.container))
    out = {g.uuid: tuple(sorted(held.get(g.uuid, ()))) for g in gpus
           if g.uuid and (not unmatched or g.uuid in held)}
    if len(unmatched) > MAX_PROBLEMS:
        unmatched[MAX_PROBLEMS:] = [f"and {len(unmatched) - MAX_PROBLEMS} more device ids that match no GPU"]
    return out, unmatched


def gpu_index(backend: NvmlBackend, gpus: Sequence[DeviceIdentity]) -> GpuIndex:
    """Read from NVML what `GpuIndex` needs: each GPU's minor number (its NVML index where the
    driver does not say) and its MIG devices' UUIDs."""
    by_minor, mig = {}, {}
    for g in gpus:
        if not g.uuid:
            continue
        try:
            by_minor[int(backend.call(g.index, "nvmlDeviceGetMinorNumber"))] = g.uuid
        except (NvmlError, TypeError, ValueError):
            by_minor.setdefault(g.index, g.uuid)
        try:
            for m in backend.mig_device_uuids(g.index):
                mig[str(m).lower()] = g.uuid
        except NvmlError:
            pass  # MIG devices unknown: their ids stay unmatched (a problem), never guessed
    return GpuIndex({g.uuid.lower(): g.uuid for g in gpus if g.uuid}, by_minor,
                    {g.index: g.uuid for g in gpus if g.uuid}, mig)


def devices_of(response: Any) -> list[Device]:
    """A ListPodResourcesResponse as Devices."""
    return [Device(p.namespace, p.name, c.name, d.resource_name, i)
            for p in response.pod_resources for c in p.containers for d in c.devices for i in d.device_ids]


class KubeletClient:
    """The pod-resources v1 client on one socket; `list()` raises KubeletError. Not for use from
    two threads at once (the workload source serialises its readings)."""

    def __init__(self, socket_path: str, timeout_s: float) -> None:
        # gRPC's C core logs to stderr past the exporter's log format (a kubelet restart's GOAWAY
        # at INFO); its errors still show, and our own messages name the socket.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        import grpc  # only when this kind is enabled

        from exporter.workload.podresources import api_pb2, api_pb2_grpc

        self._grpc, self._pb2, self._pb2_grpc = grpc, api_pb2, api_pb2_grpc
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._stub: Any = None
        self._inode: tuple[int, int] | None = None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = self._inode = None

    def _connect(self) -> None:
        try:
            st = os.stat(self.socket_path)
        except FileNotFoundError:
            self.close()
            raise KubeletError(f"kubelet socket {self.socket_path} does not exist (kubelet not running, or "
                               "its pod-resources directory not mounted)") from None
        except OSError as e:
            self.close()
            raise KubeletError(f"kubelet socket {self.socket_path}: {e.strerror or e}") from None
        inode = (st.st_dev, st.st_ino)
        if self._channel is not None and inode != self._inode:
            self.close()  # the kubelet restarted: a new socket file; the old connection is dead
        if self._channel is None:
            self._channel = self._grpc.insecure_channel(
                f"unix://{os.path.abspath(self.socket_path)}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.enable_retries", 0)])
            self._stub = self._pb2_grpc.PodResourcesListerStub(self._channel)
            self._inode = inode

    def list(self) -> list[Device]:
        self._connect()
        grpc = self._grpc
        try:
            response = self._stub.List(self._pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            self.close()  # the next reading connects again
            where = f"kubelet at {self.socket_path}"
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise KubeletError(f"{where} does not serve pod-resources v1 List (Unimplemented: a kubelet "
                                   "older than Kubernetes 1.20, or not the kubelet)") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise KubeletError(f"{where} did not answer List within {self.timeout_s:g}s") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise KubeletError(f"{where} cannot be reached: {_details(e)}") from None
            name = code.name if code else "error"
            raise KubeletError(f"{where}: List failed: {name}: {_details(e)}") from None
        return devices_of(response)


def _details(e: Any) -> str:
    try:
        return str(e.details() or "")[:200]
    except Exception:  # noqa: BLE001 - only for the message
        return str(e)[:200]
