"""Counting evictions from `state` history rings, each entry once across scrapes.

The ring holds the last 16 transitions and is printed whole on every read, so the same EVICTED
entry shows up scrape after scrape. The tracker remembers the last history seen per import and
counts only the entries appended since (the longest suffix of the old ring that starts the new
one is the overlap). On the first sight of an import, the EVICTED entries already in its ring
are counted: they are evictions this client had, just before the exporter looked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EVICTED = "EVICTED"
MAX_HISTORY = 64  # the kernel keeps 16; more is never needed, whatever a file says


@dataclass
class _Seen:
    history: list[tuple[int, str]] = field(default_factory=list)
    evictions: int = 0
    last_eviction: int = 0


def appended(prev: list[tuple[int, str]], cur: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Entries of `cur` that were not in `prev`, given that `cur` is `prev` with entries
    dropped from the front and added at the back."""
    for k in range(len(prev) + 1):
        tail = prev[k:]
        if cur[: len(tail)] == tail:
            return cur[len(tail):]
    return cur  # pragma: no cover - k == len(prev) always matches


class EvictionTracker:
    """Per-import eviction counts. State is bounded: one ring (at most MAX_HISTORY entries)
    per import present in the last scrape; `retain` drops the rest."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def update(self, key: str, history: list[tuple[int, str]]) -> tuple[int, int, int]:
        """(new evictions, evictions so far, epoch s of the newest eviction or 0) for `key`."""
        history = history[-MAX_HISTORY:]
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = _Seen()
        new = [ts for ts, state in appended(seen.history, history) if state == EVICTED]
        seen.history = history
        seen.evictions += len(new)
        if new:
            seen.last_eviction = max(seen.last_eviction, *new)
        return len(new), seen.evictions, seen.last_eviction

    def retain(self, keys: set[str]) -> None:
        for k in [k for k in self._seen if k not in keys]:
            del self._seen[k]

    def __len__(self) -> int:
        return len(self._seen)
