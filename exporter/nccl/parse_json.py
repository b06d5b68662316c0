"""The JSON STATUS report (NCCL 2.28.7+, `SET FORMAT json`), parsed strictly.

Hostile input: the byte cap is the client's; here the nesting depth is bounded by the schema
(json's C decoder raises RecursionError long before a deep document exhausts anything, and the
schema is four levels deep), duplicate keys are refused, every key NCCL always writes must be
there with its type, numbers in range, strings of the shape NCCL writes (IPs, hex, a version).
Keys NCCL does not write are ignored (a later NCCL may add some). A zeroed communicator (hash 0,
size 0: NVIDIA/nccl#2346) is dropped; anything else wrong discards the whole reply."""

from __future__ import annotations

import json
import re
from typing import Any

from exporter.nccl import validate
from exporter.nccl.model import MAX_COUNT, MAX_RANKS, OPS, Communicator, Missing, Rank, ReplyError, Report

MAX_COMMUNICATORS = 65536
_HASH = re.compile(r"0x([0-9a-f]{1,16})")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ReplyError(f"duplicate key {k!r:.40}")
        out[k] = v
    return out


def _get(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict):
        raise ReplyError(f"{where}: not an object")
    if key not in obj:
        raise ReplyError(f"{where}: no {key!r}")
    v = obj[key]
    # bool is an int in Python; NCCL writes true/false only where it means a flag
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ReplyError(f"{where}.{key}: not an integer")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ReplyError(f"{where}.{key}: not a number")
    if kind in (bool, str, list, dict) and not isinstance(v, kind):
        raise ReplyError(f"{where}.{key}: not a {kind.__name__}")
    return v


def _int(obj: Any, key: str, where: str, lo: int, hi: int) -> int:
    v: int = _get(obj, key, int, where)
    if not lo <= v <= hi:
        raise ReplyError(f"{where}.{key}: {v} out of range")
    return v


def _identity(r: Any, where: str) -> tuple[int, str, int, int, int]:
    return (
        _int(r, "rank", where, 0, MAX_RANKS - 1),
        validate.host(_get(r, "host", str, where), where),
        validate.pid(_int(r, "pid", where, -1, 2**31), where),
        validate.dev(_int(r, "cuda_dev", where, -1, 2**31), where),
        validate.dev(_int(r, "nvml_dev", where, -1, 2**31), where),
    )


def _rank(r: Any, where: str) -> Rank:
    rank, host, pid, cuda, nvml = _identity(r, where)
    st = _get(r, "status", dict, where)
    counts = _get(r, "collective_counts", dict, where)
    return Rank(
        rank,
        host,
        pid,
        cuda,
        nvml,
        counts=tuple(_int(counts, op, f"{where}.collective_counts", 0, MAX_COUNT) for op in OPS),
        init_state=_int(st, "init_state", f"{where}.status", -(2**31), 2**31),
        async_error=_int(st, "async_error", f"{where}.status", -(2**31), 2**31),
        finalize=_get(st, "finalize_called", bool, where),
        destroy=_get(st, "destroy_flag", bool, where),
        abort=_get(st, "abort_flag", bool, where),
    )


def _missing(r: Any, where: str) -> Missing:
    rank, host, pid, cuda, nvml = _identity(r, where)
    st = _get(r, "status", dict, where)
    return Missing(
        rank,
        host,
        pid,
        cuda,
        nvml,
        _get(st, "unresponsive", bool, where),
        _get(st, "considered_dead", bool, where),
    )


def _communicator(c: Any, where: str) -> Communicator | None:
    h = _get(c, "hash", str, where)
    m = _HASH.fullmatch(h)
    if m is None:
        raise ReplyError(f"{where}: hash {h!r:.40} is not hex")
    size = _int(c, "size", where, 0, MAX_RANKS)
    ranks_raw = _get(c, "ranks", list, where)
    missing_raw = _get(c, "missing_ranks", list, where)
    if _int(c, "ranks_count", where, 0, MAX_RANKS) != len(ranks_raw) or _int(
        c, "missing_ranks_count", where, 0, MAX_RANKS
    ) != len(missing_raw):
        raise ReplyError(f"{where}: ranks_count or missing_ranks_count differs from its list")
    if size == 0 or int(m.group(1), 16) == 0:
        if ranks_raw or missing_raw:
            raise ReplyError(f"{where}: a zeroed communicator with ranks")
        return None  # NVIDIA/nccl#2346's zeroed entry: nothing to read
    ranks = tuple(_rank(r, f"{where}.ranks[{i}]") for i, r in enumerate(ranks_raw))
    missing = tuple(_missing(r, f"{where}.missing_ranks[{i}]") for i, r in enumerate(missing_raw))
    seen = [r.rank for r in ranks] + [r.rank for r in missing]
    if len(set(seen)) != len(seen) or any(r >= size for r in seen):
        raise ReplyError(f"{where}: rank numbers repeated or not below the size {size}")
    return Communicator(m.group(1), size, ranks, missing)


def parse(data: bytes) -> Report:
    """The report in `data` (the bytes after STATUS up to EOF); raises ReplyError."""
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReplyError(f"not a JSON document: {e}") from None
    except RecursionError:
        raise ReplyError("JSON nested too deep") from None
    where = "report"
    version = validate.version(_get(doc, "nccl_version", str, where), where)
    comms_raw = _get(doc, "communicators", list, where)
    if _int(doc, "communicators_count", where, 0, MAX_COMMUNICATORS) != len(comms_raw):
        raise ReplyError("communicators_count differs from the list")
    comms = tuple(
        comm
        for i, raw in enumerate(comms_raw)
        if (comm := _communicator(raw, f"communicators[{i}]")) is not None
    )
    ras = _get(doc, "ras", dict, where)
    collection = float(_get(ras, "collection_time_sec", float, "ras"))
    if not 0 <= collection < 1e6:
        raise ReplyError("ras.collection_time_sec out of range")
    return Report(version, "json", comms, collection, _int(ras, "timeouts_count", "ras", 0, 2**31))
