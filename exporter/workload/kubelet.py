"""Kubernetes pods on the GPUs: the kubelet's pod-resources API, v1 `List`, over its unix socket
(/var/lib/kubelet/pod-resources/kubelet.sock), as dcgm-exporter reads it.

The call is one unary gRPC call made on the `h2` library in the calling thread
(exporter.workload.grpc_h2: no grpcio, no thread) and its answer is decoded under fixed limits
(exporter.workload.podresources_wire); the messages are those of podresources/api.proto, the
kubelet's own v1 API, whose generated protobuf module is committed beside it (the tests' kubelet and
the simulated node encode with it).

Device-plugin device ids are matched to GPUs (`GpuIndex.find`, pure) in the shapes the plugins
write them:
- a GPU UUID `GPU-<uuid>`: the NVIDIA device plugin's default (`deviceIDStrategy: uuid`);
- `MIG-<uuid>`: that plugin's MIG devices (`migStrategy: single|mixed`), resolved to their GPU
  through NVML; the old form `MIG-GPU-<uuid>/<gi>/<ci>` (drivers before R470) names its GPU;
- a plain NVML index `N`, or `N:M` for MIG instance M of GPU N (`deviceIDStrategy: index`);
- any of these with `::N`: the NVIDIA plugin's time-slicing and MPS replicas
  (NVIDIA/k8s-device-plugin internal/rm/devices.go, `NewAnnotatedID`: `fmt.Sprintf("%s::%d", id,
  replica)`; EKS reports `MIG-<uuid>::7`);
- GKE's plugin (GoogleCloudPlatform/container-engine-accelerators pkg/gpu/nvidia): `nvidia<N>` for
  the GPU whose device node is /dev/nvidia<N> (NVML's minor number), `nvidia<N>/gi<G>` for its MIG
  GPU instance G, and `/vgpu<K>` after either for time-sharing (`nvidia1/vgpu0`,
  `nvidia3/gi2/vgpu0`).
Only resources whose name matches `workload.kubelet_resource_names` count (nvidia.com/gpu and
nvidia.com/mig-* by default).

Dynamic Resource Allocation (`ContainerResources.dynamic_resources`, served by default since
Kubernetes 1.34): a claim's device counts when its driver matches `workload.kubelet_dra_drivers`
(gpu.nvidia.com, NVIDIA's DRA driver, by default). The driver names its devices after the GPU's minor
number (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go, `CanonicalName`):
`gpu-<minor>`, `gpu-<minor>-mig-<profile>-<start>-<size>` for a MIG device of that GPU, and
`gpu-vfio-<index>` for a GPU passed through to a VM, which NVML does not see and which is ignored. Its
CDI device names (cdi.go) are `k8s.gpu.nvidia.com/device=<device name>` and, with claim-specific
edits, `k8s.gpu.nvidia.com/claim=<claim UID>-<device name>`; a claim device without a device name is
matched by its CDI names, whose part after `=` may also be any device-plugin shape above (the
container toolkit's `nvidia.com/gpu=GPU-<uuid>`, `=0`, `=0:1`, `=all`).

A device that matches no GPU is a problem of the reading, and then no GPU is reported idle (its pod
may be on any of them). The connection is kept between readings and made again when the socket is
replaced (a kubelet restart creates a new socket file), after a failure, or when the kubelet stops
answering."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.nvml.backend import NvmlBackend, NvmlError
from exporter.nvml.session import DeviceIdentity
from exporter.workload.model import Workload
from exporter.workload.podresources_wire import AnswerTooLarge, ClaimDevice, Device, Malformed, decode_list

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-*"]
DEFAULT_DRA_DRIVERS = ["gpu.nvidia.com"]
# The receive limit the kubelet's own clients use on a pod-resources answer (kubernetes
# test/e2e_node/util.go, defaultPodResourcesMaxSize; dcgm-exporter the same): a longer length prefix
# is refused before the answer is read; what is read is decoded under the counts of
# exporter.workload.podresources_wire.
MAX_MESSAGE_BYTES = 16 << 20
MAX_PROBLEMS = 5  # unmatched device ids named in one reading's problems
LIST = "/v1.PodResourcesLister/List"

_MIG_OLD = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/[0-9]+/[0-9]+")
_INDEX = re.compile(r"([0-9]{1,4})(?::[0-9]{1,4})?")
# GKE: nvidia<minor>, its MIG GPU instance /gi<G>, a time-sharing share /vgpu<K> after either
_GKE = re.compile(r"nvidia([0-9]{1,4})(?:/gi[0-9]{1,4})?(?:/vgpu[0-9]{1,6})?")
# NVIDIA's DRA driver: gpu-<minor>, gpu-<minor>-mig-<profile>-<start>-<size>; gpu-vfio-<index>
_DRA = re.compile(r"gpu-([0-9]{1,4})(?:-mig-[0-9]{1,4}-[0-9]{1,4}-[0-9]{1,4})?")
_DRA_VFIO = re.compile(r"gpu-vfio-[0-9]{1,4}")
_CLAIM_UID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}-(.+)")

__all__ = ["ClaimDevice", "Device", "GpuIndex", "KubeletClient", "KubeletError", "Listing", "assign",
           "gpu_index", "wanted"]


class KubeletError(Exception):
    """The kubelet could not be asked (the message says why, naming the socket)."""


@dataclass(frozen=True)
class Listing:
    """What one List call returned: device-plugin devices and DRA claim devices."""

    devices: list[Device]
    claims: list[ClaimDevice]


def wanted(resource: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(resource, p) for p in patterns)


@dataclass
class GpuIndex:
    """How device ids find GPUs: by UUID, by minor number (nvidia<N>, gpu-<N>), by NVML index, and
    MIG device UUID -> its GPU's UUID."""

    by_uuid: dict[str, str]  # lower-case UUID -> UUID
    by_minor: dict[int, str]
    by_index: dict[int, str]
    mig_parent: dict[str, str]  # lower-case MIG-... UUID -> GPU UUID

    def find(self, device_id: str) -> str | None:
        """The GPU of a device-plugin device id (the shapes in the module docstring)."""
        d = device_id.strip().split("::", 1)[0]
        low = d.lower()
        if low in self.by_uuid:
            return self.by_uuid[low]
        if low.startswith("mig-"):
            m = _MIG_OLD.fullmatch(d)
            if m:
                return self.by_uuid.get(m.group(1).lower())
            return self.mig_parent.get(low)
        if m := _GKE.fullmatch(d):
            return self.by_minor.get(int(m.group(1)))
        if m := _INDEX.fullmatch(d):
            return self.by_index.get(int(m.group(1)))
        return None

    def find_claim(self, claim: ClaimDevice) -> set[str] | None:
        """The GPUs of a DRA claim device: by its device name, else by its CDI device names;
        an empty set for a device that is no NVML GPU (vfio passthrough); None when nothing matches."""
        if claim.device:
            return self._dra_name(claim.device)
        found: set[str] = set()
        for cdi in claim.cdi_devices:
            name = cdi.rsplit("=", 1)[-1]
            if m := _CLAIM_UID.fullmatch(name):  # <vendor>/claim=<claim UID>-<device name>
                name = m.group(1)
            if name == "all":
                found.update(self.by_uuid.values())
                continue
            got = self._dra_name(name)
            if got is None:
                return None
            found |= got
        return found if claim.cdi_devices else None

    def _dra_name(self, name: str) -> set[str] | None:
        if m := _DRA.fullmatch(name):
            uuid = self.by_minor.get(int(m.group(1)))
            return {uuid} if uuid else None
        if _DRA_VFIO.fullmatch(name):
            return set()
        uuid = self.find(name)
        return {uuid} if uuid else None


def assign(devices: Iterable[Device], gpus: Sequence[DeviceIdentity], resources: Sequence[str],
           index: GpuIndex, claims: Iterable[ClaimDevice] = (), drivers: Sequence[str] = ()
           ) -> tuple[dict[str, tuple[Workload, ...]], list[str]]:
    """Each GPU's containers (by UUID) and the GPU devices that matched no GPU. With an unmatched
    device, only the GPUs that matched are observed (none is reported idle)."""
    held: dict[str, set[Workload]] = {}
    unmatched: list[str] = []
    more = 0

    def miss(what: str) -> None:
        nonlocal more
        if len(unmatched) < MAX_PROBLEMS:
            unmatched.append(what)
        else:
            more += 1

    for d in devices:
        if not wanted(d.resource, resources):
            continue
        uuid = index.find(d.device_id)
        if uuid is None:
            miss(f"{d.resource} device {d.device_id[:100]!r} of pod {d.namespace}/{d.pod} matches no GPU")
            continue
        held.setdefault(uuid, set()).add(Workload(namespace=d.namespace, pod=d.pod, container=d.container))
    for c in claims:
        if not wanted(c.driver, drivers):
            continue
        found = index.find_claim(c)
        if found is None:
            what = c.device or ", ".join(c.cdi_devices) or "(no device name)"
            miss(f"DRA device {what[:100]!r} ({c.driver}) of claim {c.claim} of pod {c.namespace}/{c.pod} "
                 "matches no GPU")
            continue
        w = Workload(namespace=c.namespace, pod=c.pod, container=c.container)
        for uuid in found:
            held.setdefault(uuid, set()).add(w)
    out = {g.uuid: tuple(sorted(held.get(g.uuid, ()))) for g in gpus
           if g.uuid and (not unmatched or g.uuid in held)}
    if more:
        unmatched.append(f"and {more} more devices that match no GPU")
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


class KubeletClient:
    """The pod-resources v1 client on one socket; `list()` raises KubeletError. Each call is made
    in the calling thread; the connection is kept between calls and made again when the socket file
    is replaced or after a failure (exporter.workload.grpc_h2.Channel). Not for use from two threads
    at once (the workload source serialises its readings)."""

    def __init__(self, socket_path: str, timeout_s: float, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        from exporter.workload import grpc_h2  # h2 is imported only when this kind is enabled

        self._h2 = grpc_h2
        self._channel = grpc_h2.Channel(socket_path)
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    def close(self) -> None:
        self._channel.close()

    def list(self) -> Listing:
        where = f"kubelet at {self.socket_path}"
        grpc_h2 = self._h2
        try:
            answer = self._channel.unary(LIST, b"", self.timeout_s, self.max_bytes)
        except FileNotFoundError:
            raise KubeletError(f"kubelet socket {self.socket_path} does not exist (kubelet not running, or "
                               "its pod-resources directory not mounted)") from None
        except OSError as e:
            raise KubeletError(f"kubelet socket {self.socket_path}: {e.strerror or e}") from None
        except grpc_h2.TooLarge as e:
            raise KubeletError(f"{where}: List answer refused: {e.message} (16 MiB, the limit Kubernetes' "
                               "own pod-resources clients use)") from None
        except grpc_h2.GrpcError as e:
            if e.code == "UNIMPLEMENTED":
                raise KubeletError(f"{where} does not serve pod-resources v1 List (Unimplemented: a kubelet "
                                   "older than Kubernetes 1.20, or not the kubelet)") from None
            if e.code == "DEADLINE_EXCEEDED":
                raise KubeletError(f"{where} did not answer List within {self.timeout_s:g}s") from None
            if e.code == "UNAVAILABLE":
                raise KubeletError(f"{where} cannot be reached: {e.message}") from None
            raise KubeletError(f"{where}: List failed: {e.code}: {e.message}") from None
        try:
            devices, claims = decode_list(answer)
        except AnswerTooLarge as e:
            raise KubeletError(f"{where}: List answer refused: {e}") from None
        except Malformed as e:
            raise KubeletError(f"{where}: List answer is not a ListPodResourcesResponse: {e}") from None
        return Listing(devices, claims)
