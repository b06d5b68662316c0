"""Finding Lustre mounts and their llite instance (`<fsname>-<hex id>`).

Mount to instance, in order: `lfs getname <mnt>`, then the OBD_IOC_GETMDNAME ioctl on the mount
directory, then the fsname when exactly one mount has it. Both probes touch the mount, which can
hang when the file system is unreachable, so the collector runs them under a timeout.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
from dataclasses import dataclass

OBD_IOC_GETMDNAME = 0x80806683  # _IOR('f', 131, char[128]); stable in 2.10, 2.12, 2.15

_INSTANCE = re.compile(r"^(?P<fs>.+)-(?P<id>[0-9a-fA-F]+)$")
_DEVICE = re.compile(
    r"^(?P<fs>.+)-(?P<tgt>(?:OST|MDT)[0-9a-fA-F]{4})-(?P<type>osc|mdc)-(?P<id>[0-9a-fA-F]+)$")
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    source: str  # e.g. 172.31.12.34@tcp:/abcdefgh or nid1:nid2:/fsname/subdir
    mountpoint: str
    fsname: str
    network: str  # LNet network type of the first NID: tcp, efa, o2ib, ... ("" if unknown)
    subdir: str = ""
    device: str = ""  # major:minor from mountinfo: bind mounts of one mount share it
    root: str = "/"  # the directory of the file system mounted here (mountinfo; "/" unless a bind)


@dataclass(frozen=True)
class Device:
    """An osc or mdc device directory name: <fsname>-<OSTxxxx|MDTxxxx>-<osc|mdc>-<id>."""

    name: str
    fsname: str
    target: str
    component: str
    instance_id: str


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_source(source: str) -> tuple[str, str, str] | None:
    """(fsname, subdir, network) of a Lustre mount source `<nid>[:<nid>...]:/<fsname>[/sub]`."""
    nids, sep, path = source.partition(":/")
    if not sep or not nids:
        return None
    fsname, _, subdir = path.partition("/")
    if not fsname:
        return None
    first = re.split(r"[:,]", nids)[0]
    net = first.rpartition("@")[2] if "@" in first else ""
    return fsname, subdir, re.sub(r"\d+$", "", net)


def parse_mounts(text: str) -> tuple[list[Mount], int]:
    """Lustre mounts from a /proc/mounts-format text, and the number of malformed lustre lines."""
    out: list[Mount] = []
    bad = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[2] != "lustre":
            continue
        parsed = parse_source(_unescape(fields[0]))
        if parsed is None:
            bad += 1
            continue
        fsname, subdir, net = parsed
        out.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fsname, net, subdir))
    return out, bad


def parse_mountinfo(text: str) -> tuple[list[Mount], int]:
    """Lustre mounts from a /proc/PID/mountinfo text: `id parent major:minor root mountpoint
    options [optional...] - fstype source superoptions`."""
    out: list[Mount] = []
    bad = 0
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        after = post.split()
        if not sep or len(after) < 2 or after[0] != "lustre":
            continue
        fields = pre.split()
        parsed = parse_source(_unescape(after[1]))
        if len(fields) < 5 or parsed is None:
            bad += 1
            continue
        fsname, subdir, net = parsed
        out.append(Mount(_unescape(after[1]), _unescape(fields[4]), fsname, net, subdir,
                         device=fields[2], root=_unescape(fields[3])))
    return out, bad


def distinct_mounts(mounts: list[Mount]) -> list[Mount]:
    """One entry per mounted client instance: of bind mounts (same device in mountinfo) the one
    with the shortest root (the original mount, root "/"), first on ties; of mounts stacked on
    one mount point, the last (the visible one)."""
    by_point: dict[str, Mount] = {}
    for m in mounts:
        by_point.pop(m.mountpoint, None)
        by_point[m.mountpoint] = m
    best: dict[str, Mount] = {}
    for m in by_point.values():
        if not m.device:
            continue
        cur = best.get(m.device)
        if cur is None or len(m.root) < len(cur.root):
            best[m.device] = m
    keep = set(map(id, best.values()))
    return [m for m in by_point.values() if not m.device or id(m) in keep]


def split_instance(name: str) -> tuple[str, str] | None:
    """(fsname, id) of a llite instance; splits on the last dash since fsnames may contain dashes."""
    m = _INSTANCE.match(name)
    return (m["fs"], m["id"].lower()) if m else None


def parse_device(name: str) -> Device | None:
    m = _DEVICE.match(name)
    if not m:
        return None
    return Device(name, m["fs"], m["tgt"].upper(), m["type"], m["id"].lower())


def instance_from_mdname(mdname: str) -> str | None:
    """`<fsname>-clilmv-<id>` (the ioctl's answer) -> `<fsname>-<id>`."""
    fs, sep, ident = mdname.strip("\x00 \n").rpartition("-clilmv-")
    return f"{fs}-{ident}" if sep and fs and ident else None


def lfs_getname(lfs: str, mountpoint: str, timeout_s: float) -> str | None:
    """`lfs getname <mnt>` prints `<fsname>-<id> <mnt>`; None when lfs is absent or fails."""
    try:
        r = subprocess.run([lfs, "getname", mountpoint], capture_output=True, text=True,
                           timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    for line in r.stdout.splitlines():
        parts = line.split()
        if parts and split_instance(parts[0]):
            return parts[0]
    return None


def ioctl_getmdname(path: str) -> str | None:
    """The llite instance via OBD_IOC_GETMDNAME on the mount directory; None on any error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        buf = bytearray(128)
        fcntl.ioctl(fd, OBD_IOC_GETMDNAME, buf, True)
        return instance_from_mdname(bytes(buf).split(b"\x00", 1)[0].decode("ascii", "replace"))
    except OSError:
        return None
    finally:
        os.close(fd)


def map_by_fsname(mounts: list[Mount], instances: list[str]) -> dict[str, str]:
    """mountpoint -> instance where the fsname identifies both sides uniquely."""
    by_fs: dict[str, list[str]] = {}
    for inst in instances:
        parts = split_instance(inst)
        if parts:
            by_fs.setdefault(parts[0], []).append(inst)
    mounts_per_fs: dict[str, int] = {}
    for m in mounts:
        mounts_per_fs[m.fsname] = mounts_per_fs.get(m.fsname, 0) + 1
    return {m.mountpoint: by_fs[m.fsname][0] for m in mounts
            if mounts_per_fs[m.fsname] == 1 and len(by_fs.get(m.fsname, [])) == 1}
