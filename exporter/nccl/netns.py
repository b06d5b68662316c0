"""A TCP socket in a job process's network namespace: the seam between the collector and the
kernel's namespaces (tests hand in their own opener; their namespace is the test's own).

RAS listens on the loopback of the process's network namespace. A pod that is not hostNetwork
has a loopback of its own, which the exporter can reach only by creating its socket in that
namespace: setns(2) on <procfs>/PID/ns/net from a short-lived thread (only that thread
switches), socket(2), and back. A socket keeps the namespace it was created in. This needs the
host PID namespace (hostPID: true, to see the pod's processes) and CAP_SYS_ADMIN (setns); the
DaemonSet in deploy/ grants neither by default: docs/nccl.md says what to add. Where the
process shares the exporter's namespace (Slurm, hostNetwork pods) no setns is made."""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from typing import Protocol

CLONE_NEWNET = 0x40000000


class Opener(Protocol):
    def __call__(self, procfs: str, pid: int, family: int) -> socket.socket: ...


def same_namespace(procfs: str, pid: int) -> bool:
    """Whether process `pid` is in this thread's network namespace (compared by inode)."""
    theirs = os.stat(f"{procfs}/{pid}/ns/net")
    ours = os.stat("/proc/thread-self/ns/net")
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def open_socket(procfs: str, pid: int, family: int) -> socket.socket:
    """A TCP socket in process `pid`'s network namespace (raises OSError when it cannot)."""
    if same_namespace(procfs, pid):
        return socket.socket(family, socket.SOCK_STREAM)
    result: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            target = os.open(f"{procfs}/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(target)
                try:
                    result.append(socket.socket(family, socket.SOCK_STREAM))
                finally:
                    _setns(own)  # if this fails the thread ends here, in the wrong namespace, harmless
            finally:
                os.close(own)
                os.close(target)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            result.append(e)

    t = threading.Thread(target=enter, name="nccl-setns", daemon=True)
    t.start()
    t.join(5.0)  # setns and socket do not block; a bound only so that nothing here can hang
    if not result:
        raise OSError(f"entering the network namespace of process {pid} did not finish")
    if isinstance(result[0], BaseException):
        raise OSError(f"cannot enter the network namespace of process {pid}: {result[0]}")
    return result[0]
