"""The two ways issue 48 names to keep the XID path's state in one store, measured on what matters
on a node: one versioned JSON document written atomically (temporary file, fsync, rename, fsync of
the directory: exporter.state.file.write_json_atomic, today's writer) against SQLite (stdlib
sqlite3, WAL, synchronous=FULL: as durable as the rename; gpud keeps its events so).

The state is a storm's: 500 XIDs over 8 GPUs and 10 XID codes, 25 SXids, 2 acks, and each
event's attribution record (at most 64 a GPU, as exporter.attribution.ledger keeps). Measured:

- write latency per event (each event made durable on its own) and per batch (the storm's 500
  events written at once; the daemon writes at most once a second, exporter.xid.persistence);
- bytes on disk after the storm written event by event (SQLite: the database + its WAL + its
  shared memory: the WAL grows to about 4 MB before SQLite checkpoints it);
- startup load time (read and decode everything back);
- RSS the served process gains: `import sqlite3`, a connection, a write and a read, measured in a
  fresh interpreter that has already imported exporter.state.file (json and the writer are
  loaded by the exporter either way);
- crash safety: a writer process killed (SIGKILL) at a random moment while writing in a loop,
  KILLS times; then a torn file (the store's file cut in half, as a writer without rename or a
  lost page would leave it). Counted: loads that fail, and whether the failure is detected.

    python bench/bench_state_store.py [--dir DIR] [--kills N]   # DIR: on the disk state_dir is on
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.state.file import read_state_file, write_json_atomic  # noqa: E402

GPUS = [f"00000000:{b:02x}:00" for b in (0x53, 0x64, 0x75, 0x86, 0x97, 0xA8, 0xB9, 0xCA)]
CODES = [13, 31, 43, 45, 48, 63, 74, 79, 94, 119]
STORM = 500
PER_GPU = 64

Event = tuple[str, int, float, float]  # pci, xid, kernel seconds, unix time


def storm(n: int = STORM) -> list[Event]:
    rnd = random.Random(48)
    return [(rnd.choice(GPUS), rnd.choice(CODES), 1000.0 + i * 0.01, 1.8e9 + i * 0.01) for i in range(n)]


class JsonStore:
    """The whole state as one document, rewritten atomically on every write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc: dict[str, Any] = {"version": 2, "boot_id": "b", "kmsg": "/dev/kmsg", "xid": {"counts": {}},
                                    "sxid": {"counts": [[f"00000000:0{s}:00", 20001, "non_fatal", 12, 1.8e9]
                                                        for s in (8, 9)]},
                                    "acks": [], "workload": {"records": []}}

    def add(self, ev: Event) -> None:
        pci, xid, kernel_s, wall = ev
        c = self.doc["xid"]["counts"].setdefault(pci, {}).setdefault(str(xid), [0, 0.0, 0.0])
        c[0], c[1], c[2] = c[0] + 1, kernel_s, wall
        recs = self.doc["workload"]["records"]
        recs.append([pci, "xid", xid, "", wall, [["4242", "", "", ""]]])
        mine = [r for r in recs if r[0] == pci]
        if len(mine) > PER_GPU:
            recs.remove(mine[0])

    def write(self) -> None:
        write_json_atomic(self.path, self.doc)

    @staticmethod
    def load(path: Path) -> int:
        doc = json.loads(read_state_file(path))
        return sum(c[0] for ks in doc["xid"]["counts"].values() for c in ks.values())

    def files(self) -> list[Path]:
        return [self.path]


class SqliteStore:
    """The state as tables: counts upserted, attribution records inserted, in one transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript("""
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE IF NOT EXISTS counts (pci TEXT, key TEXT, count INTEGER, kernel_s REAL, wall REAL,
                                               PRIMARY KEY (pci, key));
            CREATE TABLE IF NOT EXISTS records (pci TEXT, kind TEXT, code INTEGER, switch TEXT, time REAL,
                                                workloads TEXT);
            CREATE INDEX IF NOT EXISTS records_pci ON records (pci, time);
        """)
        self.pending: list[Event] = []

    def add(self, ev: Event) -> None:
        self.pending.append(ev)

    def write(self) -> None:
        db = self.db
        db.execute("BEGIN")
        for pci, xid, kernel_s, wall in self.pending:
            db.execute("INSERT INTO counts VALUES (?, ?, 1, ?, ?) ON CONFLICT (pci, key) DO UPDATE SET "
                       "count = count + 1, kernel_s = excluded.kernel_s, wall = excluded.wall",
                       (pci, str(xid), kernel_s, wall))
            db.execute("INSERT INTO records VALUES (?, 'xid', ?, '', ?, ?)",
                       (pci, xid, wall, json.dumps([["4242", "", "", ""]])))
            db.execute("DELETE FROM records WHERE pci = ? AND rowid NOT IN (SELECT rowid FROM records "
                       "WHERE pci = ? ORDER BY time DESC LIMIT ?)", (pci, pci, PER_GPU))
        db.execute("COMMIT")
        self.pending.clear()

    @staticmethod
    def load(path: Path) -> int:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            db.execute("SELECT * FROM records").fetchall()
            return int(db.execute("SELECT coalesce(sum(count), 0) FROM counts").fetchone()[0])
        finally:
            db.close()

    def files(self) -> list[Path]:
        return [p for p in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")) if p.exists()]


KINDS: dict[str, tuple[type[JsonStore] | type[SqliteStore], str]] = {
    "json": (JsonStore, "state.json"), "sqlite": (SqliteStore, "state.db")}


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{statistics.median(xs) * 1e3:.2f} (p99 {xs[int(len(xs) * 0.99) - 1] * 1e3:.2f})"


def latencies(kind: str, d: Path) -> dict[str, str]:
    make, name = KINDS[kind]
    events = storm()
    s = make(d / f"per-event-{name}")
    per_event = []
    for ev in events:
        t = time.perf_counter()
        s.add(ev)
        s.write()
        per_event.append(time.perf_counter() - t)
    per_batch = []
    for i in range(5):
        b = make(d / f"batch{i}-{name}")
        t = time.perf_counter()
        for ev in events:
            b.add(ev)
        b.write()
        per_batch.append(time.perf_counter() - t)
    loads = []
    for _ in range(20):
        t = time.perf_counter()
        total = make.load(s.path)
        loads.append(time.perf_counter() - t)
    assert total == STORM, total
    return {"per event, ms": ms(per_event),
            "storm of 500 in one write, ms": f"{statistics.median(per_batch) * 1e3:.1f}",
            "bytes on disk": " + ".join(str(p.stat().st_size) for p in s.files()),
            "startup load, ms": f"{statistics.median(loads) * 1e3:.2f}"}


RSS_PROBE = """
import sys; sys.path.insert(0, {root!r})
import exporter.state.file
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])
before = rss()
import sqlite3
db = sqlite3.connect({path!r}, isolation_level=None)
db.execute('PRAGMA journal_mode=WAL')
db.execute('CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)')
for i in range(500):
    db.execute('INSERT INTO t VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = v + 1', (str(i % 80), i))
db.execute('SELECT * FROM t').fetchall()
print(rss() - before)
"""


def sqlite_rss_kib(d: Path) -> int:
    """Median of 5 fresh interpreters: the KiB of RSS sqlite3 adds to one that holds the JSON writer."""
    probes = [RSS_PROBE.format(root=str(ROOT), path=str(d / f"rss{i}.db")) for i in range(5)]
    runs = [int(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                               text=True).stdout) for probe in probes]
    return int(statistics.median(runs))


WRITER = """
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
from pathlib import Path
import bench_state_store as b
s = b.KINDS[{kind!r}][0](Path({path!r}))
print("ready", flush=True)
for ev in b.storm(100000):
    s.add(ev)
    s.write()
"""


def crashes(kind: str, d: Path, kills: int) -> str:
    """A writer killed mid-write `kills` times (each time the store reopened by a new writer); then
    the file torn. How many loads failed; whether the torn file is detected."""
    make, name = KINDS[kind]
    path = d / f"crash-{name}"
    rnd = random.Random(1)
    failed = 0
    for _ in range(kills):
        p = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), bench=str(ROOT / "bench"),
                                                                  kind=kind, path=str(path))],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(rnd.uniform(0.05, 0.3))  # a benchmark, not a test: a random moment mid-loop
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not path.exists():
            continue  # killed before its first write: nothing to lose yet
        try:
            make.load(path)
        except Exception:
            failed += 1
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    if kind == "sqlite":  # the WAL is where the last commits are: drop it, as a lost file would
        for extra in (Path(f"{path}-wal"), Path(f"{path}-shm")):
            extra.unlink(missing_ok=True)
    try:
        make.load(path)
        torn = "loaded (torn file not detected)"
    except Exception as e:
        torn = f"detected: {type(e).__name__}: {str(e)[:60]}"
    return f"{failed} of {kills} loads failed after SIGKILL; file cut in half: {torn}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", type=Path, help="where to write (default: a temporary directory)")
    ap.add_argument("--kills", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        rows = {k: latencies(k, d) for k in KINDS}
        rows["json"]["RSS added to the served process, KiB"] = "0 (json is imported already)"
        rows["sqlite"]["RSS added to the served process, KiB"] = str(sqlite_rss_kib(d))
        for k in KINDS:
            rows[k]["crash safety"] = crashes(k, d, args.kills)
    print(f"| measure | one JSON document | SQLite (sqlite {sqlite3.sqlite_version}) |")
    print("|---|---|---|")
    for m in rows["json"]:
        print(f"| {m} | {rows['json'][m]} | {rows['sqlite'][m]} |")


if __name__ == "__main__":
    main()
