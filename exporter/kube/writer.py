"""Keeps the verdict on the exporter's own Node, on a thread of its own (never a scrape's).

The Kubernetes collector (exporter.collectors.kubernetes), a derived collector that depends on the
verdict, hands each collection's `Desired` (exporter.kube.condition) to `Writer.offer`, which only
stores it and wakes the thread. The thread writes:

- the `GpuHealthy` condition through `PATCH nodes/NAME/status` (a strategic merge patch: the
  condition's `type` is the merge key, other agents' conditions are untouched), when it changes and
  on the heartbeat (`kubernetes.heartbeat_seconds`, a new `lastHeartbeatTime`).
  `lastTransitionTime` changes only when the status does: the writer learns the condition on the
  server from its first call (an empty patch of the status, so no `get nodes` is needed) and from
  every answer after; an exporter restart keeps the time.
- with `kubernetes.taint` / `kubernetes.hyperpod_label` on, the NoSchedule taint and HyperPod's
  replacement label, through a merge patch of the Node guarded by its resourceVersion (409 when
  another writer got there first: read again and retry). What this exporter set is recorded in
  the annotation `OWNER_ANNOTATION`; it removes only what that names and what still has the value
  it set, so a taint or label another agent owns is never touched.

The verdict reaches the Node within seconds whether or not anything scrapes: the XID service
notifies `poke` (exporter.xid.service `on_change`: an XID counted, an ack taken, a GPU lost), and
the thread asks for a collection (`collect`), whose verdict it writes at once when it changed.
Pokes that come while one is being served are folded into one more collection at most every
`poke_min_s` (an XID 13 flood pokes on every kernel-log read). Nothing polls: the thread sleeps on
its condition variable until a poke, an offer, the heartbeat or a retry is due. When no verdict
came for a heartbeat (nothing scraped), the heartbeat collects too, so it never repeats a stale one.

A failed call (server away, slow, 401/403/409/5xx) is counted, `up` goes to 0 and the thread
retries after a backoff (doubling from `retry_min_s` to `retry_max_s`); scrapes never wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.kube.client import ERROR_KINDS, ApiError, Client
from exporter.kube.condition import CONDITION_TYPE, Desired

log = logging.getLogger("exporter.kubernetes")

TAINT_KEY = "gpu-health-exporter/action-required"
LABEL_KEY = "sagemaker.amazonaws.com/node-health-status"
LABEL_VALUE = "UnschedulablePendingReplacement"
# What we set, comma-separated: "taint", and "label" (it was absent) or "label=Schedulable" (we
# replaced HyperPod's healthy value, and put it back on removal).
OWNER_ANNOTATION = "gpu-health-exporter/owns"
HYPERPOD_HEALTHY = "Schedulable"  # the value HyperPod's health agent keeps on a healthy node


@dataclass(frozen=True)
class Options:
    taint: bool = False
    hyperpod_label: bool = False
    heartbeat_s: float = 300.0
    retry_min_s: float = 1.0
    retry_max_s: float = 60.0
    poke_min_s: float = 1.0  # at most one poked collection this often (a flood pokes continuously)


@dataclass
class State:
    """What the collector exports: `up` (the last call succeeded), the unix time of the last
    success (0: none yet) and the failures by kind."""

    up: bool = False
    last_success: float = 0.0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class Writer:
    """`offer` from any thread; `start` and `close` once. `make_client` builds the client (it may
    raise ApiError("config"): retried like any failure, so a fixed file is picked up).
    `collect`, when set, asks for a collection: the thread calls it when no verdict came for a
    heartbeat (nothing scraped the exporter), so the heartbeat never repeats a stale verdict, and
    after a `poke` (what the verdict is made of changed)."""

    def __init__(self, make_client: Callable[[], Client], opts: Options,
                 wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic) -> None:
        self.make_client = make_client
        self.opts = opts
        self.wall, self.mono = wall, mono
        self.collect: Callable[[], Any] | None = None
        self.state = State()
        self._cv = threading.Condition()
        self._want: Desired | None = None
        self._offered_at = mono()
        self._poked = False
        self._poke_due = 0.0  # monotonic: the earliest the next poked collection may run
        self._closed = False
        self._thread: threading.Thread | None = None
        self._client: Client | None = None
        self._written: Desired | None = None  # the last Desired the server accepted whole
        self._due = 0.0  # monotonic: next heartbeat, or next retry after a failure
        self._retry_s = 0.0  # 0: the last attempt succeeded
        # our condition on the server: (status, lastTransitionTime); None: read it first
        self._server: tuple[str, str] | None = None
        self._last_error = ""

    # --- the collector's side -------------------------------------------------------------
    def offer(self, want: Desired) -> None:
        with self._cv:
            self._want = want
            self._offered_at = self.mono()
            self._cv.notify()

    def poke(self) -> None:
        """What the verdict is made of changed: collect now (never waits; any thread)."""
        with self._cv:
            self._poked = True
            self._cv.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kubernetes-writer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 2.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._client is not None:
            self._client.close()

    # --- the thread -----------------------------------------------------------------------
    def _next(self) -> Desired | None:
        """Wait until there is something to write (a changed Desired, the heartbeat, the retry
        after a failure) and return it; None when closed."""
        with self._cv:
            while not self._closed:
                now = self.mono()
                want = self._want
                if want is not None:
                    if self._retry_s:  # failing: the next try at its time, whatever was offered
                        if now >= self._due:
                            return want
                    elif want != self._written or now >= self._due:  # a change, or the heartbeat
                        return want
                if self.collect is not None and self._poked and now >= self._poke_due:
                    self._poked = False
                    self._poke_due = now + self.opts.poke_min_s
                    self._collect_now()
                    continue
                if self.collect is not None and now - self._offered_at >= self.opts.heartbeat_s:
                    self._collect_now()
                    continue
                waits = [self._offered_at + self.opts.heartbeat_s - now] if self.collect else []
                if self.collect is not None and self._poked:
                    waits.append(self._poke_due - now)
                if want is not None:
                    waits.append(self._due - now)
                self._cv.wait(max(0.01, min(waits)) if waits else None)
        return None

    def _collect_now(self) -> None:
        """A poke, or no verdict for a heartbeat: ask for a collection (outside the lock: it
        offers; the loop then writes what it offered)."""
        self._offered_at = self.mono()  # one request per heartbeat even if it fails
        self._cv.release()
        try:
            self.collect()  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - a failed collection is the runner's to report
            log.exception("collection for the Kubernetes condition failed")
        finally:
            self._cv.acquire()

    def _run(self) -> None:
        while True:
            want = self._next()
            if want is None:
                return
            try:
                self.sync(want)
            except ApiError as e:
                self._failed(e)
            except Exception as e:  # noqa: BLE001 - the thread must outlive any surprise
                log.exception("Kubernetes writer")
                self._failed(ApiError("other", f"{type(e).__name__}: {e}"))

    def _failed(self, e: ApiError) -> None:
        self.state.errors[e.kind] = self.state.errors.get(e.kind, 0) + 1
        self.state.up = False
        self._server = None  # read the Node again before the next write
        if e.kind in ("connection", "timeout", "config") and self._client is not None:
            self._client.close()
            self._client = None  # a new connection (and endpoint, token file, CA) next time
        self._retry_s = min(self.opts.retry_max_s, max(self.opts.retry_min_s, self._retry_s * 2))
        self._due = self.mono() + self._retry_s
        msg = str(e)
        if msg != self._last_error:
            log.warning("cannot update the Node (retrying in %gs): %s", self._retry_s, msg)
            self._last_error = msg

    def sync(self, want: Desired) -> None:
        """One write of `want` (the condition, then the actions); raises ApiError."""
        if self._client is None:
            self._client = self.make_client()
        c = self._client
        if self._server is None:
            self._server = _ours(c.read_status())
        now = self.wall()
        server = self._server
        same = server is not None and server[0] == want.status and server[1]
        cond = {"type": CONDITION_TYPE, "status": want.status, "reason": want.reason,
                "message": want.message, "lastHeartbeatTime": rfc3339(now),
                "lastTransitionTime": server[1] if server is not None and same else rfc3339(now)}
        self._server = _ours(c.patch_status({"status": {"conditions": [cond]}}))
        acts = self.opts.taint or self.opts.hyperpod_label
        if acts and (want.taint is not None or want.replace is not None):
            self._act(c, want)  # an Unknown leaves the taint and label as they are: nothing to read
        old = self._written
        if self._last_error or not self.state.up or old is None or (old.status, old.reason) != (
                want.status, want.reason):
            log.info("Node %s: condition %s=%s (%s)", c.node, CONDITION_TYPE, want.status, want.reason)
        self._last_error = ""
        self.state.up = True
        self.state.last_success = now
        self._retry_s = 0.0
        with self._cv:
            self._written = want
            self._due = self.mono() + self.opts.heartbeat_s

    def _act(self, c: Client, want: Desired, tries: int = 3) -> None:
        """The taint and label `want` asks for, guarded by the Node's resourceVersion."""
        for attempt in range(tries):
            node = c.get_node()
            patch = plan(node, want, self.opts)
            if patch is None:
                return
            try:
                c.patch_node(patch)
                return
            except ApiError as e:
                if e.kind != "conflict" or attempt == tries - 1:
                    raise


def _ours(node: dict[str, Any]) -> tuple[str, str] | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == CONDITION_TYPE:
            return str(cond.get("status", "")), str(cond.get("lastTransitionTime", ""))
    return None


def plan(node: dict[str, Any], want: Desired, opts: Options) -> dict[str, Any] | None:
    """The merge patch that brings the Node's taint, label and ownership annotation to what `want`
    asks for (None: nothing to change). Never adds, changes or removes a taint or label this
    exporter does not own; `want.taint`/`want.replace` None leaves ours as they are."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    taints = list((node.get("spec") or {}).get("taints") or [])
    owned = {x for x in annotations.get(OWNER_ANNOTATION, "").split(",") if x}
    new_owned = set(owned)
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion", "")}}

    ours_t = {"key": TAINT_KEY, "value": want.reason, "effect": "NoSchedule"}
    found = [t for t in taints if t.get("key") == TAINT_KEY and t.get("effect") == "NoSchedule"]
    if "taint" in owned and not found:
        new_owned.discard("taint")  # removed by someone else: no longer ours
    new_taints = taints
    if want.taint is not None:
        set_it = bool(want.taint) and opts.taint
        if set_it and not found:
            new_taints = [*taints, ours_t]
            new_owned.add("taint")
        elif set_it and "taint" in owned and found[0].get("value") != want.reason:
            new_taints = [ours_t if t is found[0] else t for t in taints]  # ours: a new reason
        elif not set_it and "taint" in owned and found:
            new_taints = [t for t in taints if t is not found[0]]
            new_owned.discard("taint")
    if new_taints is not taints:
        patch["spec"] = {"taints": new_taints}

    have = labels.get(LABEL_KEY)
    label = next((x for x in owned if x.split("=", 1)[0] == "label"), None)  # "label" or "label=WAS"
    if label is not None and have != LABEL_VALUE:
        new_owned.discard(label)  # changed or removed by someone else (HyperPod): theirs now
    if want.replace is not None:
        set_it = bool(want.replace) and opts.hyperpod_label
        if set_it and (have is None or have == HYPERPOD_HEALTHY) and label is None:
            patch["metadata"]["labels"] = {LABEL_KEY: LABEL_VALUE}
            new_owned.add("label" if have is None else f"label={have}")
        elif not set_it and label is not None and have == LABEL_VALUE:
            was = label.partition("=")[2]
            patch["metadata"]["labels"] = {LABEL_KEY: was or None}  # back to what HyperPod had
            new_owned.discard(label)

    if new_owned != owned:
        patch["metadata"]["annotations"] = {
            OWNER_ANNOTATION: ",".join(sorted(new_owned)) if new_owned else None}
    if len(patch) == 1 and len(patch["metadata"]) == 1:
        return None
    return patch
