"""Each state document's schema version and the migrations up to it (see exporter.state).

Changing a document's shape: bump its `version` here, add the migration from the old version
(a function of the old document returning one of the next version; never drops a count), keep
the validator in step, and add a fixture written by the last commit with the old shape to
tests/fixtures/state/. A document read is upgraded step by step before it is validated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Migration = Callable[[dict[str, Any]], dict[str, Any]]


class StateError(ValueError):
    """A state file field out of shape or range; the message names the field."""


class NewerVersion(StateError):
    """A document of a version newer than this exporter reads (a downgrade)."""

    def __init__(self, what: str, found: int, reads: int) -> None:
        super().__init__(f"{what} state version {found} was written by a newer exporter; this one reads "
                         f"versions up to {reads}")
        self.found = found
        self.reads = reads


@dataclass(frozen=True)
class Schema:
    """One document's versions: `version` is what this exporter writes; `migrations[v]` turns a
    version-v document into a version-(v + 1) one."""

    what: str  # as log lines name the document: "XID", "SXid", "workload"
    version: int
    migrations: Mapping[int, Migration] = field(default_factory=dict)

    def upgrade(self, doc: Any) -> Any:
        """`doc` at this exporter's version: migrated when older, NewerVersion when newer,
        StateError when its version is missing or has no path here. Anything not a JSON object
        is returned as it is, for the validator to name."""
        if not isinstance(doc, dict):
            return doc
        v = doc.get("version")
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise StateError(f"version is {v!r}; expected a positive integer")
        if v > self.version:
            raise NewerVersion(self.what, v, self.version)
        while v < self.version:
            step = self.migrations.get(v)
            if step is None:
                raise StateError(f"{self.what} state version {v} has no migration to {self.version}")
            doc = {**step(doc), "version": v + 1}
            v += 1
        return doc


# Version 1 is every format written up to issue 48 (commits c475e11, c88ad74 and 43ffce6
# included: fixtures in tests/fixtures/state/); their optional fields (`written`, an ack's
# `logged`, `recoveries`) are optional in the validators. Version 2 of the XID document adds the
# `sxid` and `workload` sections, which were files of their own (SXID and WORKLOAD, version 1:
# read once, migrated into it by exporter.xid.persistence); a version-1 XID document is a
# version-2 one without them.
XID = Schema("XID", 2, {1: dict})
ACKS = Schema("acks", 1)  # xid-acks.json, which `ack` writes (first written after c88ad74)
SXID = Schema("SXid", 1)  # sxid-state.json, up to version 1 of the XID document
WORKLOAD = Schema("workload", 1)  # workload-state.json, likewise
