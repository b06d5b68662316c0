"""A reload runs with exactly the files it validated.

On SIGHUP the running exporter validates the configuration (the config file, the web config, the
certificate, key and CA files it names) while `recording()`: every file read through
exporter.config.read_config_bytes is kept, byte for byte. If all is valid, `hand_over()` writes
those bytes to an anonymous memory file (memfd) that the re-exec'd process inherits, and names
its descriptor in the environment; the new process `take_over()`s them first thing, so its
start-up reads the validated bytes instead of the files, whatever their size and whatever was
edited on disk since the check (an edit racing the reload can then neither stop the exporter nor
run a configuration nobody validated). Once it serves, `release()` drops them: the next reload
reads the files again.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

ENV = "GPU_HEALTH_EXPORTER_RELOAD_FD"  # the inherited descriptor of the validated files

_recording: dict[str, bytes] | None = None
_replay: dict[str, bytes] = {}


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))


def read(path: Path, reader: Callable[[], bytes]) -> bytes:
    """The bytes of `path`: the validated ones during a reload's start-up, else `reader()`'s
    (recorded while a reload validates)."""
    k = _key(path)
    data = _replay[k] if k in _replay else reader()
    if _recording is not None:
        _recording[k] = data
    return data


@contextlib.contextmanager
def recording() -> Iterator[dict[str, bytes]]:
    """Record the bytes of every config file read within (path -> bytes)."""
    global _recording
    _recording = {}
    try:
        yield _recording
    finally:
        _recording = None


def hand_over(files: dict[str, bytes]) -> None:
    """Put `files` where the process this one execs finds them (an inheritable memfd named in
    the environment)."""
    fd = os.memfd_create("gpu-health-exporter-reload", 0)  # not close-on-exec: the exec keeps it
    doc = json.dumps({k: base64.b64encode(v).decode("ascii") for k, v in files.items()}).encode()
    with open(fd, "wb", closefd=False) as f:
        f.write(doc)
    os.environ[ENV] = str(fd)


def take_over() -> None:
    """Take the files the reload that exec'd this process validated (no-op otherwise)."""
    fd_text = os.environ.pop(ENV, None)
    if fd_text is None:
        return
    try:
        fd = int(fd_text)
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:gpu-health-exporter-reload"):
            return  # not a descriptor we made (a stray variable): read the files
        with open(fd, "rb") as f:  # closes the descriptor
            f.seek(0)
            doc = json.loads(f.read())
        _replay.update({k: base64.b64decode(v) for k, v in doc.items()})
    except (OSError, ValueError):
        pass  # not readable: read the files


def release() -> None:
    """Start-up is done: later loads read the files again."""
    _replay.clear()
