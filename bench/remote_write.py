"""A minimal Prometheus remote-write client for the benches: encodes a WriteRequest by hand (the
three protobuf messages it needs) and frames it as snappy literals, so no protobuf or snappy
library is needed. Used to put synthetic history into Prometheus' head block, where a live
Prometheus keeps the last hours the rules read (blocks made by `promtool tsdb create-blocks-from`
are read through their on-disk index, which costs several times more per series).

Prometheus must run with `--web.enable-remote-write-receiver`; samples of one series must come in
time order, and none older than an hour before the newest sample in the head.
"""

from __future__ import annotations

import struct
import urllib.request
from collections.abc import Iterable, Sequence


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def encode_labels(labels: dict[str, str]) -> bytes:
    """The `labels` fields of a TimeSeries (sorted by name, as Prometheus requires)."""
    return b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode()))
                    for k, v in sorted(labels.items()))


class SampleEncoder:
    """Encodes `samples` fields (value, timestamp in ms), caching the timestamp varints a history
    repeats for every series."""

    def __init__(self) -> None:
        self._ts: dict[int, bytes] = {}

    def encode(self, timestamps_s: Sequence[int], values: Sequence[float]) -> bytes:
        out = []
        for t, v in zip(timestamps_s, values, strict=True):
            ts = self._ts.get(t)
            if ts is None:
                ts = self._ts[t] = b"\x10" + _varint(t * 1000)
            body = b"\x09" + struct.pack("<d", v) + ts
            out.append(b"\x12" + _varint(len(body)) + body)
        return b"".join(out)


def snappy_block(data: bytes) -> bytes:
    """`data` as a snappy block made of one literal (valid snappy; nothing is compressed)."""
    if not data:
        return b"\x00"
    return _varint(len(data)) + b"\xfc" + struct.pack("<I", len(data) - 1) + data


def push(url: str, series: Iterable[bytes], batch_bytes: int = 8 << 20) -> int:
    """POST encoded TimeSeries bodies (labels + samples fields) to a remote-write `url` in requests
    of about `batch_bytes`; returns the number of series sent."""
    sent = 0
    buf: list[bytes] = []
    size = 0

    def flush() -> None:
        nonlocal buf, size
        if not buf:
            return
        body = b"".join(buf)
        req = urllib.request.Request(url, data=snappy_block(body), headers={
            "Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
        buf, size = [], 0

    for ts in series:
        item = _field(1, ts)
        buf.append(item)
        size += len(item)
        sent += 1
        if size >= batch_bytes:
            flush()
    flush()
    return sent
