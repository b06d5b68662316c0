"""A fake NVML backend that replays a capture made by `gpu-health-exporter capture`
(exporter/capture.py; the captures in tests/fixtures/nvml were made on real GPUs with the
same format).

It answers each call with the captured result or the captured NVML error, optionally after the
captured latency, and lets tests and the simulated node script changes over time: counters that
grow, a GPU that is lost, calls that become slow or hang, and NVML events.

Latency model (with `latencies=True`): each call costs its captured `us_median`; a field batch
costs the sum of the per-field costs measured on an H100 (field_cost.json; 2.7 us for fields it
does not list). Calls on one GPU hold that GPU's lock while they "run", because NVML serialises
calls on one GPU; calls on different GPUs do not wait for each other (an assumption: it could
not be measured on a one-GPU machine). The cost is slept (releasing the GIL, as a real NVML
call does inside ctypes) through a per-thread balance: time.sleep overshoots by tens of
microseconds, so the overshoot is credited to the thread's next cheap calls and the total time
spent matches the captured latencies, while a single cheap call may cost nothing or one sleep.
A call costing SPEND_WHOLE_S or more always spends at least its own cost, on its own.

GPU Performance Monitoring (GPM): a capture's `nvmlGpmMetricsGet` entry holds what each metric
read over the capture's interval (percent, or MiB/s), {metric id: {"ret", "value"}}. The fake
replays those as the GPU's activity levels from its start: a sample records the integral of each
level up to the sample's time, so the metrics between two samples are the average level over
the interval between them, as the hardware's counters give. Scripts change the levels
(`set_gpm_levels`); the support query and a sample's errors are the capture's entries
`nvmlGpmQueryDeviceSupport` and `nvmlGpmSampleGet`.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid as uuidlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.nvml.backend import (
    EVENT_XID,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    Event,
    FieldValue,
    GpmValue,
    NvmlBackend,
    NvmlError,
)

DATA = Path(__file__).resolve().parent.parent / "data"  # shipped as package data
DEFAULT_FIELD_US = 2.7  # a cheap field, per field_cost.json
SPEND_WHOLE_S = 1e-3  # a call costing this or more sleeps its whole cost, never paid by credit
MIG_DEVICE_UUIDS = "mig_device_uuids"  # the key of NvmlBackend.mig_device_uuids' answer

# Capture keys of calls whose arguments are enums recorded by name.
_ECC_TYPE = ("corrected", "uncorrected")
_ECC_COUNTER = ("volatile", "aggregate")
_RETIRED_CAUSE = ("multiple_sbe", "dbe")

# Field name -> (call key, position in the call's list result or None): setting one sets both.
LINKS: dict[str, tuple[str, int | None]] = {
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL": ("nvmlDeviceGetTotalEccErrors/corrected/volatile", None),
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL": ("nvmlDeviceGetTotalEccErrors/uncorrected/volatile", None),
    "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": ("nvmlDeviceGetTotalEccErrors/corrected/aggregate", None),
    "NVML_FI_DEV_ECC_DBE_AGG_TOTAL": ("nvmlDeviceGetTotalEccErrors/uncorrected/aggregate", None),
    "NVML_FI_DEV_REMAPPED_COR": ("nvmlDeviceGetRemappedRows", 0),
    "NVML_FI_DEV_REMAPPED_UNC": ("nvmlDeviceGetRemappedRows", 1),
    "NVML_FI_DEV_REMAPPED_PENDING": ("nvmlDeviceGetRemappedRows", 2),
    "NVML_FI_DEV_REMAPPED_FAILURE": ("nvmlDeviceGetRemappedRows", 3),
    "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("nvmlDeviceGetTotalEnergyConsumption", None),
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER": ("nvmlDeviceGetPcieReplayCounter", None),
}


def field_ids() -> dict[str, int]:
    """NVML_FI_DEV_* name -> field id, from the pynvml binding (names alias some ids)."""
    import pynvml

    return {k: getattr(pynvml, k) for k in dir(pynvml)
            if k.startswith("NVML_FI_DEV_") and isinstance(getattr(pynvml, k), int)}


_call_keys: dict[tuple[str | int, ...], str] = {}  # (fn, *args) -> call_key(fn, args); a few hundred at most


def call_key(fn: str, args: Sequence[int]) -> str:
    """The capture's key for a call: enum arguments by name where the capture names them."""
    memo: tuple[str | int, ...] = (fn, *args)
    key = _call_keys.get(memo)
    if key is None:
        if len(_call_keys) >= 4096:
            _call_keys.clear()
        key = _call_keys[memo] = _call_key(fn, args)
    return key


def _call_key(fn: str, args: Sequence[int]) -> str:
    if fn in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetMemoryErrorCounter") and len(args) >= 2:
        rest = "".join(f"/{a}" for a in args[2:])
        return f"{fn}/{_ECC_TYPE[args[0]]}/{_ECC_COUNTER[args[1]]}{rest}"
    if fn == "nvmlDeviceGetRetiredPages" and args:
        return f"{fn}/{_RETIRED_CAUSE[args[0]]}"
    return fn + "".join(f"/{a}" for a in args)


def load_capture(path: str | Path | None = None) -> dict[str, Any]:
    """A capture file, or (None) the H200 capture shipped with the package."""
    text = (DATA / "nvml_h200.json" if path is None else Path(path)).read_text()
    capture = json.loads(text)
    if not isinstance(capture, dict):
        raise ValueError(f"{path or 'the shipped capture'}: not an NVML capture (a JSON object)")
    return capture


def load_field_cost() -> dict[str, float]:
    data = json.loads((DATA / "nvml_field_cost_h100.json").read_text())
    return dict(data["per_field_us"])


@dataclass
class _Growth:
    index: int
    key: str  # a field name (NVML_FI_DEV_*) or a call key
    base: float
    rate: float  # per second
    accel: float  # per second squared
    start: float
    step: float = 1.0  # round to this


@dataclass
class _GpmSample:
    """A fake nvmlGpmSample_t: which GPU, when, and each metric's integral up to then."""

    index: int = -1
    t: float = 0.0
    integrals: dict[int, float] = field(default_factory=dict)


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # index -> event mask
    queue: deque[Event] = field(default_factory=deque)
    freed: bool = False


class FakeBackend(NvmlBackend):
    """Replays `capture` (the parsed JSON of a capture) for all its devices."""

    def __init__(self, capture: dict[str, Any], latencies: bool = False) -> None:
        self.latencies = latencies
        self._ids = field_ids()
        cost = load_field_cost() if latencies else {}
        self._field_cost: dict[int, float] = {self._ids[n]: us for n, us in cost.items() if n in self._ids}
        self.system_calls: dict[str, dict[str, Any]] = copy.deepcopy(capture.get("system", {}))
        self.devices: list[dict[str, dict[str, Any]]] = []
        self.fields: list[dict[int, dict[str, Any]]] = []
        for dev in capture.get("devices", []):
            calls = {k: copy.deepcopy(v) for k, v in dev.items()
                     if isinstance(v, dict) and k not in ("field_values",)}
            fv: dict[int, dict[str, Any]] = {}
            for name, item in dev.get("field_values", {}).items():
                fid = self._ids.get(name)
                if fid is None and name.isdigit():
                    fid = int(name)
                if fid is not None and isinstance(item, dict) and "ret" in item:
                    fv[fid] = dict(item)
            self.devices.append(calls)
            self.fields.append(fv)
        self._locks = [threading.Lock() for _ in self.devices]
        self._tls = threading.local()
        self._state = threading.RLock()
        self._initialised = False
        self._init_error: NvmlError | None = None
        self.lost: set[int] = set()
        self.extra_latency_s: dict[int, float] = {}
        self._hangs: dict[int, tuple[str | None, float]] = {}  # index -> (fn or None for all, until)
        self._unhang = threading.Event()
        self._failures: dict[tuple[int, str], int] = {}  # (index, fn or key) -> NVML code
        self._growth: list[_Growth] = []
        self._timed: list[tuple[float, Callable[[], None]]] = []
        self._event_sets: list[_EventSet] = []
        self._event_cv = threading.Condition(self._state)
        self._t0 = time.monotonic()
        self._manual_t: float | None = None
        self.calls_made = 0
        # GPM: per GPU, each metric's integral of its level and when it was last brought up to date
        self._gpm_integrals: list[dict[int, float]] = [{} for _ in self.devices]
        self._gpm_t = [0.0 for _ in self.devices]

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, latencies: bool = False) -> FakeBackend:
        return cls(load_capture(path), latencies=latencies)

    # --- time and scripts -----------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the fake was created (or the time set by `advance_to`)."""
        if self._manual_t is not None:
            return self._manual_t
        return time.monotonic() - self._t0

    def advance_to(self, t: float) -> None:
        """Freeze the fake's clock at `t` seconds (tests), applying what is due."""
        self._manual_t = t
        self._tick()

    def at(self, t: float, action: Callable[[], None]) -> None:
        """Run `action` once the fake's clock reaches `t` seconds."""
        with self._state:
            self._timed.append((t, action))
            self._timed.sort(key=lambda x: x[0])
            self._event_cv.notify_all()  # an event wait sleeping past `t` recomputes its wake-up
        self._tick()

    def _tick(self) -> None:
        if not self._timed and not self._growth:
            return
        with self._state:
            now = self.now()
            while self._timed and self._timed[0][0] <= now:
                _, action = self._timed.pop(0)
                action()
            for g in self._growth:
                dt = max(0.0, now - g.start)
                v = g.base + g.rate * dt + 0.5 * g.accel * dt * dt
                self._set(g.index, g.key, int(v // g.step * g.step) if g.step >= 1 else v)

    def _set(self, index: int, key: str, value: Any) -> None:
        if key.startswith("NVML_FI_DEV_"):
            fid = self._ids[key]
            item = self.fields[index].setdefault(fid, {"ret": 0, "type": 3})
            item["ret"], item["value"] = 0, value
            link = LINKS.get(key)
            if link is None:
                return
            key, pos = link
            if pos is not None:
                entry = self.devices[index].setdefault(key, {"ok": [0, 0, 0, 0], "us_median": 2.2})
                lst = list(entry.get("ok") or [0, 0, 0, 0])
                lst[pos] = value
                entry["ok"] = lst
                entry.pop("error", None)
                entry.pop("code", None)
                return
        entry = self.devices[index].setdefault(key, {"us_median": 2.0})
        entry["ok"] = value
        entry.pop("error", None)
        entry.pop("code", None)

    def get(self, index: int, key: str) -> Any:
        """The current value of a field (by name) or a call (by capture key)."""
        self._tick()
        if key.startswith("NVML_FI_DEV_"):
            return self.fields[index][self._ids[key]].get("value")
        return self.devices[index][key].get("ok")

    def set_value(self, index: int, key: str, value: Any, at_s: float | None = None) -> None:
        """Set a field (NVML_FI_DEV_* name, linked calls follow) or a call's result (capture key)."""
        if at_s is None:
            with self._state:
                self._set(index, key, value)
        else:
            self.at(at_s, lambda: self._set(index, key, value))

    def set_error(self, index: int, key: str, code: int) -> None:
        """Make a call (capture key) or a field (name) answer NVML error `code` from now on."""
        with self._state:
            if key.startswith("NVML_FI_DEV_"):
                self.fields[index][self._ids[key]] = {"ret": code, "type": 0}
            else:
                self.devices[index][key] = {"error": f"NVML error {code}", "code": code, "us_median": 2.0}

    def gpm_levels(self, index: int) -> dict[int, float]:
        """GPU `index`'s current GPM levels (metric id -> percent or MiB/s) that read successfully."""
        entry = self.devices[index].get("nvmlGpmMetricsGet", {}).get("ok") or {}
        return {int(k): float(v.get("value", 0.0)) for k, v in entry.items() if not v.get("ret")}

    def _gpm_integrate(self, index: int) -> dict[int, float]:
        """Bring GPU `index`'s GPM integrals up to now (holding self._state)."""
        now = self.now()
        dt = max(0.0, now - self._gpm_t[index])
        integrals = self._gpm_integrals[index]
        for mid, level in self.gpm_levels(index).items():
            integrals[mid] = integrals.get(mid, 0.0) + level * dt
        self._gpm_t[index] = now
        return integrals

    def set_gpm_levels(self, index: int, levels: dict[int, float], at_s: float | None = None) -> None:
        """From now (or `at_s`), GPU `index`'s GPM metrics read `levels` (metric id -> percent or
        MiB/s); metrics not named keep their level."""
        def do() -> None:
            with self._state:
                self._gpm_integrate(index)
                entry = self.devices[index].setdefault("nvmlGpmMetricsGet", {"ok": {}, "us_median": 20.0})
                ok = entry.setdefault("ok", {})
                for mid, v in levels.items():
                    ok[str(mid)] = {"ret": 0, "value": float(v)}
        if at_s is None:
            do()
        else:
            self.at(at_s, do)

    def fail(self, index: int, fn: str, code: int) -> None:
        """Make every call of `fn` (a name, or a full capture key) on GPU `index` raise `code` (0:
        answer again); fn "nvmlDeviceGetFieldValues" fails whole field batches, the nvmlGpm*
        names fail those GPM calls."""
        self._failures[(index, fn)] = code

    def grow(self, index: int, key: str, rate: float, accel: float = 0.0, start_s: float = 0.0,
             step: float = 1.0) -> None:
        """From `start_s`, the counter `key` grows by rate*t + accel*t^2/2 from its current value."""
        with self._state:
            base = self.get(index, key) or 0
            self._growth.append(_Growth(index, key, float(base), rate, accel, start_s, step))
        self._tick()

    def lose(self, index: int, at_s: float | None = None) -> None:
        """GPU `index` falls off the bus: every call on it raises GPU_IS_LOST from then on."""
        def do() -> None:
            self.lost.add(index)
            with self._event_cv:
                self._event_cv.notify_all()
        if at_s is None:
            do()
        else:
            self.at(at_s, do)

    def restore(self, index: int) -> None:
        self.lost.discard(index)

    def slow_down(self, index: int, extra_s: float, at_s: float | None = None) -> None:
        """Every call on GPU `index` takes `extra_s` longer (from `at_s`)."""
        if at_s is None:
            self.extra_latency_s[index] = extra_s
        else:
            self.at(at_s, lambda: self.extra_latency_s.__setitem__(index, extra_s))

    def hang(self, index: int, fn: str | None = None, seconds: float = 3600.0,
             at_s: float | None = None) -> None:
        """Calls on GPU `index` (only `fn` when given) block for `seconds` or until `release()`.
        With `at_s`, the hang lasts from `at_s` to `at_s + seconds` on the fake's clock: a clock
        advanced past its end (a one-shot command playing the node a minute in) sees it over."""
        def do() -> None:
            left = seconds - (max(0.0, self.now() - at_s) if at_s is not None else 0.0)
            if left <= 0:
                return
            self._unhang.clear()
            self._hangs[index] = (fn, time.monotonic() + left)
        if at_s is None:
            do()
        else:
            self.at(at_s, do)

    def release(self) -> None:
        """End every hang; blocked calls return."""
        self._hangs.clear()
        self._unhang.set()

    def queue_event(self, index: int, data: int, event_type: int = EVENT_XID,
                    at_s: float | None = None) -> None:
        """Deliver an NVML event (default: XID `data`) to every event set registered for it then."""
        def do() -> None:
            uuid = self.devices[index].get("nvmlDeviceGetUUID", {}).get("ok", "")
            ev = Event(index=index, uuid=uuid, event_type=event_type, data=data)
            with self._event_cv:
                for es in self._event_sets:
                    if es.registered.get(index, 0) & event_type:
                        es.queue.append(ev)
                self._event_cv.notify_all()
        if at_s is None:
            do()
        else:
            self.at(at_s, do)

    # --- the NVML surface -----------------------------------------------------------------
    def init(self) -> None:
        if self._init_error is not None:
            raise self._init_error
        self._initialised = True

    def fail_init(self, code: int, message: str | None = None) -> None:
        """Make init() raise (NVML missing, driver not loaded)."""
        self._init_error = NvmlError(code, message)

    def shutdown(self) -> None:
        self._initialised = False

    def _check_init(self) -> None:
        if not self._initialised:
            raise NvmlError(NVML_ERROR_UNINITIALIZED)

    def system(self, fn: str) -> Any:
        self._check_init()
        entry = self.system_calls.get(fn)
        return _result(entry, fn)

    def device_count(self) -> int:
        self._check_init()
        return len(self.devices)

    def _cost(self, index: int, us: float, fn: str) -> None:
        """Spend the call's time on GPU `index` (holding its lock): latency, slowdown, hang."""
        extra = self.extra_latency_s.get(index, 0.0)
        hang = self._hangs.get(index)
        if hang is not None and hang[0] not in (None, fn):
            hang = None
        if not (self.latencies or extra or hang):
            return
        with self._locks[index]:
            if hang is not None:
                remaining = hang[1] - time.monotonic()
                if remaining > 0:
                    self._unhang.wait(remaining)
            # A call that costs a sleep's worth or more is spent whole, on its own: a real call
            # takes its time however slow the calls before it were, and its overshoot (the host
            # was slow) is nobody's credit. The cheaper calls and scripted slowdowns are paid
            # through a per-thread balance: time.sleep overshoots by ~70 us, so each sleep's real
            # length is booked and the overshoot credited to later calls.
            cost = us * 1e-6 if self.latencies else 0.0
            if cost >= SPEND_WHOLE_S:
                time.sleep(cost)
                cost = 0.0
            tls = self._tls
            owed = getattr(tls, "owed", 0.0) + cost + extra
            if owed > 0:
                t = time.perf_counter()
                time.sleep(owed)
                owed -= time.perf_counter() - t
            tls.owed = owed

    def _device(self, index: int) -> dict[str, dict[str, Any]]:
        self._check_init()
        if not 0 <= index < len(self.devices):
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT, f"no GPU {index}")
        self._tick()
        if index in self.lost:
            raise NvmlError(NVML_ERROR_GPU_IS_LOST)
        return self.devices[index]

    def call(self, index: int, fn: str, *args: int) -> Any:
        self.calls_made += 1
        calls = self._device(index)
        key = call_key(fn, args)
        entry = calls.get(key)
        if entry is None and args:
            # A call the capture made with other arguments: NVML would reject the argument.
            entry = ({"error": "Invalid Argument", "code": NVML_ERROR_INVALID_ARGUMENT, "us_median": 2.0}
                     if any(k.startswith(fn + "/") for k in calls) else None)
        self._cost(index, (entry or {}).get("us_median", 2.0), fn)
        if index in self.lost:  # lost while the call was running
            raise NvmlError(NVML_ERROR_GPU_IS_LOST)
        code = self._failures.get((index, key)) or self._failures.get((index, fn))
        if code:
            raise NvmlError(code)
        return _result(entry, key)

    def field_values(self, index: int, field_ids: Sequence[int]) -> list[FieldValue]:
        self.calls_made += 1
        self._device(index)
        us = sum(self._field_cost.get(f, DEFAULT_FIELD_US) for f in field_ids) if self.latencies else 0.0
        self._cost(index, us, "nvmlDeviceGetFieldValues")
        if index in self.lost:
            raise NvmlError(NVML_ERROR_GPU_IS_LOST)
        code = self._failures.get((index, "nvmlDeviceGetFieldValues"))
        if code:
            raise NvmlError(code)
        fv = self.fields[index]
        out = []
        for fid in field_ids:
            item = fv.get(fid)
            if item is None:
                out.append(FieldValue(fid, NVML_ERROR_NOT_SUPPORTED, None))
            else:
                ret = item["ret"]
                out.append(FieldValue(fid, ret, item.get("value") if ret == 0 else None))
        return out

    # --- GPM ------------------------------------------------------------------------------
    def _gpm_call(self, index: int, fn: str) -> dict[str, Any] | None:
        """A GPM call on GPU `index`: its captured entry, after its cost and scripted failures."""
        self.calls_made += 1
        entry = self._device(index).get(fn)
        self._cost(index, (entry or {}).get("us_median", 2.0), fn)
        if index in self.lost:
            raise NvmlError(NVML_ERROR_GPU_IS_LOST)
        code = self._failures.get((index, fn))
        if code:
            raise NvmlError(code)
        return entry

    def gpm_query_device_support(self, index: int) -> bool:
        entry = self._gpm_call(index, "nvmlGpmQueryDeviceSupport")
        return bool(_result(entry, "nvmlGpmQueryDeviceSupport").get("isSupportedDevice"))

    def gpm_sample_alloc(self) -> _GpmSample:
        self._check_init()
        return _GpmSample()

    def gpm_sample_get(self, index: int, sample: _GpmSample) -> float:
        entry = self._gpm_call(index, "nvmlGpmSampleGet")
        _result(entry, "nvmlGpmSampleGet")  # its captured error, if any
        with self._state:
            sample.index, sample.t = index, self.now()
            sample.integrals = dict(self._gpm_integrate(index))
        return sample.t

    def gpm_metrics_get(self, sample1: _GpmSample, sample2: _GpmSample,
                        metric_ids: Sequence[int]) -> list[GpmValue]:
        if sample1.index < 0 or sample1.index != sample2.index:
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT, "GPM samples not taken, or of two GPUs")
        entry = self._gpm_call(sample2.index, "nvmlGpmMetricsGet")
        captured = _result(entry, "nvmlGpmMetricsGet")
        dt = sample2.t - sample1.t
        out = []
        for mid in metric_ids:
            item = captured.get(str(mid))
            if item is None:
                out.append(GpmValue(mid, NVML_ERROR_NOT_SUPPORTED, None))
            elif item.get("ret"):
                out.append(GpmValue(mid, int(item["ret"]), None))
            else:
                delta = sample2.integrals.get(mid, 0.0) - sample1.integrals.get(mid, 0.0)
                # no time between the samples (a frozen clock): the level itself, the limit
                out.append(GpmValue(mid, 0, delta / dt if dt > 0 else float(item.get("value", 0.0))))
        return out

    def gpm_sample_free(self, sample: _GpmSample) -> None:
        sample.index = -1

    # --- events ---------------------------------------------------------------------------
    def event_set_create(self) -> _EventSet:
        self._check_init()
        es = _EventSet()
        with self._state:
            self._event_sets.append(es)
        return es

    def register_events(self, index: int, event_types: int, event_set: _EventSet) -> None:
        calls = self._device(index)
        supported = calls.get("nvmlDeviceGetSupportedEventTypes", {}).get("ok", 0)
        if event_types & ~supported:
            raise NvmlError(NVML_ERROR_NOT_SUPPORTED)
        with self._state:
            event_set.registered[index] = event_set.registered.get(index, 0) | event_types

    def event_wait(self, event_set: _EventSet, timeout_ms: int) -> Event:
        self._check_init()
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._event_cv:
            while True:
                self._tick()
                if any(i in self.lost for i in event_set.registered):
                    raise NvmlError(NVML_ERROR_GPU_IS_LOST)
                if event_set.queue:
                    return event_set.queue.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NvmlError(NVML_ERROR_TIMEOUT)
                # sleep until the next scripted action is due (at() notifies when it adds one;
                # actions that deliver an event or lose a GPU notify), not in fixed steps: an
                # idle simulated exporter woke 20 times a second here
                if self._timed and self._manual_t is None:
                    remaining = min(remaining, max(0.0, self._timed[0][0] - self.now()))
                self._event_cv.wait(remaining)

    def mig_device_uuids(self, index: int) -> list[str]:
        """The capture's `mig_device_uuids` entry (set_value(index, MIG_DEVICE_UUIDS, [...]));
        [] when it has none (MIG off)."""
        try:
            return list(self.call(index, MIG_DEVICE_UUIDS))
        except NvmlError as e:
            if e.code == NVML_ERROR_FUNCTION_NOT_FOUND:
                return []
            raise

    def event_set_free(self, event_set: _EventSet) -> None:
        with self._state:
            event_set.freed = True
            if event_set in self._event_sets:
                self._event_sets.remove(event_set)


def _result(entry: dict[str, Any] | None, what: str) -> Any:
    """A captured entry as the call's outcome: its value (copied) or its NVML error."""
    if entry is None:
        raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, f"Function Not Found ({what} is not in the capture)")
    if "ok" in entry:
        v = entry["ok"]
        if isinstance(v, dict):
            return dict(v)
        if isinstance(v, list):
            return list(v)
        return v
    if "code" in entry:
        raise NvmlError(int(entry["code"]), entry.get("error"))
    # "missing_in_binding" or a binding exception: the call is not usable from Python.
    raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND,
                    f"Function Not Found ({what}: {entry.get('exception', 'not in the binding')})")


def new_uuid(seed: str) -> str:
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, seed))
