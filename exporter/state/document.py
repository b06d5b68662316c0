"""What every state document is: one schema object per file, in one style.

Each document (exporter.xid.persistence's state document, exporter.xid.store's acks document;
the version-1 SXid and workload files, exporter.xid.sxid_state's and
exporter.xid.attribution_state's) is an object with:

- `name`: its file in `state_dir`; `schema`: its versions and migrations (exporter.state.versions);
- `validate(doc)`: raises StateError naming the first field out of shape or range (nothing else);
- `dump(...)`: the body written from what its one writer holds, as a snapshot (the state file
  adds the envelope: version, boot_id, kmsg, recoveries);
- `load(doc, ...)`: a validated document merged into what is held, by the one rule of that
  document (what is known stays; a count takes the larger value).

A document of sections (Sectioned: the state document) checks its envelope in `validate` and each
section in `keep_valid_sections`; its sections' objects (XID_DOC, SXID_DOC, WORKLOAD_DOC) dump
and load them.

They sit beside the stores they dump and load (exporter.xid), which import this package: the
package imports none of theirs, so the import graph of packages stays without a cycle.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from exporter.state.versions import Schema


class Document(Protocol):
    name: str
    schema: Schema

    def validate(self, doc: Any) -> object: ...  # raises StateError; what it returns is not used


@runtime_checkable
class Sectioned(Protocol):
    """A document of sections, each validated on its own (exporter.xid.persistence's): one out of
    shape costs that section, not the others."""

    def keep_valid_sections(self, doc: dict[str, Any]) -> list[str]:
        """Remove from `doc` (validated as a whole) each section out of shape; what was wrong
        with each removed, naming its key."""
        ...
