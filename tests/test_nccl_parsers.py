"""The RAS report parsers (exporter.nccl.parse_json, parse_text) against every fixture in both
formats, agreeing with each other on what they name, and on hostile replies: size, depth,
garbage ranks, zeroed communicators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.nccl import findings, parse_json, parse_text
from exporter.nccl.model import ReplyError
from tests.helpers import START_HANG_GUARD_S

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
CASES = (
    "01-healthy-4node",
    "02-missing-unresponsive",
    "03-dead-process",
    "04-lagging-rank",
    "05-init-transition",
)
# What fixtures/nccl/README.md says a parser must conclude.
EXPECTED = {
    "01-healthy-4node": ({}, {}),
    "02-missing-unresponsive": ({}, {("10.1.2.12", 3487984): "unresponsive"}),
    "03-dead-process": ({}, {("10.1.2.12", 3487984): "dead"}),
    "04-lagging-rank": ({("10.1.2.11", 118457): 1}, {}),
    "05-init-transition": ({}, {}),  # NOCOMM ranks are not missing peers
}


def read(name: str) -> findings.Findings:
    data = (FIXTURES / name).read_bytes()
    return findings.summarise((parse_json if name.endswith(".json") else parse_text).parse(data))


@pytest.mark.parametrize("case", CASES)
def test_both_formats_name_the_same_ranks(case: str) -> None:
    behind, missing = EXPECTED[case]
    j, t = read(case + ".json"), read(case + ".txt")
    assert (j.behind, j.missing) == (behind, missing)
    assert (t.behind, t.missing) == (behind, missing)
    assert (j.size, j.reporting) == (t.size, t.reporting)
    for peer in (*behind, *missing):  # the same rank, GPU and node either way
        assert j.ranks[peer] == t.ranks[peer]


def test_json_reads_every_rank_and_the_job_progress() -> None:
    f = read("04-lagging-rank.json")
    assert len(f.ranks) == 32 and f.ranks[("10.1.2.11", 118457)].rank == 13
    assert f.ranks[("10.1.2.11", 118457)].gpu == 5
    assert f.ops_max == f.ops_min + 1
    assert f.lowest_host() == "10.1.2.10"
    healthy = read("01-healthy-4node.json")
    assert healthy.ops_max == healthy.ops_min and not healthy.behind


def test_versions_and_timeouts() -> None:
    assert read("02-missing-unresponsive.json").version == "2.29.7"
    assert read("01-healthy-4node.txt").version == "2.27.5"
    assert read("02-missing-unresponsive.txt").timeouts == 2
    assert read("02-missing-unresponsive.json").timeouts == 2


OLD_TEXT = b"""NCCL version 2.24.3 compiled with CUDA 12.6
CUDA runtime version 12060, driver version 12060

Communicators... (0.01s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4       7-8        32        31   RUNNING  INCOMPLETE

Errors
======

#0-0 (b10db1a1153c041c) INCOMPLETE
  Missing communicator data from 1 rank
  The missing rank: 21

Warnings
========

"""


def test_pre_2_26_text_names_the_missing_rank_without_identity() -> None:
    f = findings.summarise(parse_text.parse(OLD_TEXT))
    assert f.version == "2.24.3"
    assert f.missing == {("", -1): "unresponsive"}  # no host: resolves to no node, names none


def test_garbage_rank_numbers_discard_the_text_report() -> None:  # NVIDIA/nccl#1762
    with pytest.raises(ReplyError, match="1762"):
        parse_text.parse(OLD_TEXT.replace(b"rank: 21", b"rank: 1057455228"))


def test_zeroed_communicators_are_dropped() -> None:  # NVIDIA/nccl#2346
    doc = json.loads((FIXTURES / "01-healthy-4node.json").read_bytes())
    doc["communicators"].append(
        {
            "hash": "0x0",
            "secondary_hash": "0x0:0x0",
            "size": 0,
            "ranks_count": 0,
            "missing_ranks_count": 0,
            "ranks": [],
            "missing_ranks": [],
        }
    )
    doc["communicators_count"] += 1
    r = parse_json.parse(json.dumps(doc).encode())
    assert len(r.communicators) == 9


def _mutated(path: list[object], value: object) -> bytes:
    doc = json.loads((FIXTURES / "04-lagging-rank.json").read_bytes())
    obj = doc
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    return json.dumps(doc).encode()


WORLD = 8  # the index of the 32-rank communicator in fixture 04 (sorted by hash)


@pytest.mark.parametrize(
    "path,value",
    [
        (["communicators", WORLD, "ranks", 3, "rank"], 32),  # not below the size
        (["communicators", WORLD, "ranks", 3, "rank"], 2),  # a repeated rank
        (["communicators", WORLD, "ranks", 3, "host"], '10.1.2.11\nevil="1"'),  # label injection
        (["communicators", WORLD, "ranks", 3, "pid"], True),  # a bool is no pid
        (["communicators", WORLD, "ranks", 3, "nvml_dev"], 999),
        (["communicators", WORLD, "ranks", 3, "collective_counts", "AllReduce"], -1),
        (["communicators", WORLD, "size"], 0),  # zeroed size with ranks
        (["communicators", WORLD, "hash"], "b10d"),
        (["communicators_count"], 3),
        (["nccl_version"], "abc"),
    ],
)
def test_a_bad_field_discards_the_whole_json_reply(path: list[object], value: object) -> None:
    with pytest.raises(ReplyError):
        parse_json.parse(_mutated(path, value))


def test_deep_nesting_and_duplicate_keys_are_refused() -> None:
    with pytest.raises(ReplyError):
        parse_json.parse(b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(ReplyError, match="duplicate"):
        parse_json.parse(b'{"nccl_version": "2.29.7", "nccl_version": "2.29.7"}')


def test_truncated_replies_never_name_a_wrong_rank() -> None:
    """JSON cut anywhere is refused. Text has no end marker: a cut report may lose the laggard
    (its line is incomplete, so it does not match) but never names another rank."""
    for name in ("04-lagging-rank.json", "04-lagging-rank.txt", "03-dead-process.txt"):
        data = (FIXTURES / name).read_bytes()
        parser = parse_json if name.endswith(".json") else parse_text
        full = findings.summarise(parser.parse(data))
        for cut in range(0, len(data) - 1, 7):
            try:
                f = findings.summarise(parser.parse(data[:cut]))
            except ReplyError:
                continue
            assert name.endswith(".txt")
            assert f.behind.items() <= full.behind.items() and f.missing.items() <= full.missing.items()


@given(st.binary(max_size=4096))
def test_any_bytes_parse_or_raise_reply_error(data: bytes) -> None:
    for parser in (parse_json, parse_text):
        try:
            findings.summarise(parser.parse(data))
        except ReplyError:
            pass


ranks = st.integers(min_value=-5, max_value=2**40)


@given(
    st.lists(
        st.tuples(
            ranks,
            st.sampled_from(["10.0.0.1", "::1", "unknown", "x"]),
            st.integers(-3, 2**33),
            st.integers(-3, 100),
            st.integers(0, 2**65),
        ),
        max_size=12,
    ),
    st.integers(-2, 70000),
    st.sampled_from(["0x0", "0x1f", "zz"]),
)
def test_hostile_json_communicators_never_name_an_invalid_rank(
    rows: list[tuple[int, str, int, int, int]], size: int, hash_: str
) -> None:
    comm = {
        "hash": hash_,
        "secondary_hash": "0x1:0x2",
        "size": size,
        "ranks_count": len(rows),
        "missing_ranks_count": 0,
        "missing_ranks": [],
        "ranks": [
            {
                "rank": r,
                "host": h,
                "pid": p,
                "cuda_dev": d,
                "nvml_dev": d,
                "status": {
                    "init_state": 0,
                    "async_error": 0,
                    "finalize_called": False,
                    "destroy_flag": False,
                    "abort_flag": False,
                },
                "collective_counts": {
                    op: c for op in ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
                },
            }
            for r, h, p, d, c in rows
        ],
    }
    doc = {
        "nccl_version": "2.29.7",
        "cuda_runtime_version": 1,
        "cuda_driver_version": 1,
        "timestamp": "",
        "communicators_count": 1,
        "communicators": [comm],
        "ras": {"collection_time_sec": 0.01, "timeouts_count": 0},
    }
    try:
        f = findings.summarise(parse_json.parse(json.dumps(doc).encode()))
    except ReplyError:
        return
    for who in f.ranks.values():
        assert 0 <= who.rank < size <= 65536
        assert -1 <= who.gpu <= 63 and (who.pid == -1 or 0 < who.pid <= 4194304)
        assert who.host in ("", "10.0.0.1", "::1")


def _serve(sock, reply: bytes, setup: bytes) -> None:
    """The server side of one session on a socketpair: answer the setup lines, then `reply`."""
    buf = b""
    try:
        answers = iter(setup.split(b"|"))
        while True:
            chunk = sock.recv(1024)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line == b"STATUS":
                    sock.sendall(reply)
                    return
                sock.sendall(next(answers) + b"\n")
    except (OSError, StopIteration):
        pass
    finally:
        sock.close()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 200_000), st.integers(1, 100_000))
def test_the_client_never_reads_past_its_byte_cap(size: int, cap: int) -> None:
    import socket
    import threading

    from exporter.nccl import client

    mine, theirs = socket.socketpair()
    t = threading.Thread(target=_serve, args=(theirs, b"x" * size, b"SERVER PROTOCOL 2|OK|OK"), daemon=True)
    t.start()
    try:
        reply = client.status(lambda _timeout: mine, timeout_s=30, max_bytes=cap)
        assert size <= cap and len(reply.data) == size and reply.format == "json"
    except client.QueryFailed as e:
        assert e.result == client.TOO_LARGE and size > cap
    t.join(START_HANG_GUARD_S)


@pytest.mark.parametrize(
    "setup,result",
    [
        (b"HTTP/1.1 400 Bad Request", "protocol_error"),  # not a RAS server
        (b"SERVER PROTOCOL 2|ERROR: Invalid timeout value 5", "protocol_error"),
        (b"SERVER PROTOCOL 2|OK|" + b"y" * 5000, "protocol_error"),  # a line longer than 1024 bytes
    ],
)
def test_the_client_refuses_what_is_not_the_protocol(setup: bytes, result: str) -> None:
    import socket
    import threading

    from exporter.nccl import client

    mine, theirs = socket.socketpair()
    threading.Thread(target=_serve, args=(theirs, b"{}", setup), daemon=True).start()
    with pytest.raises(client.QueryFailed) as e:
        client.status(lambda _timeout: mine, timeout_s=30, max_bytes=1 << 20)
    assert e.value.result == result
