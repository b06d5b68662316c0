"""What every state document is: one schema object per file, in one style.

Each document (exporter.xid.store's XID and acks documents, exporter.xid.sxid_store's SXid
document, exporter.xid.attribution_state's workload document) is an object with:

- `name`: its file in `state_dir`; `schema`: its versions and migrations (exporter.state.versions);
- `validate(doc)`: raises StateError naming the first field out of shape or range (nothing else);
- `dump(...)`: the body written from what its one writer holds, as a snapshot (the state file
  adds the envelope: version, boot_id, kmsg, recoveries);
- `load(doc, ...)`: a validated document merged into what is held, by the one rule of that
  document (what is known stays; a count takes the larger value).

They sit beside the stores they dump and load (exporter.xid), which import this package: the
package imports none of theirs, so the import graph of packages stays without a cycle.
"""

from __future__ import annotations

from typing import Any, Protocol

from exporter.state.versions import Schema


class Document(Protocol):
    name: str
    schema: Schema

    def validate(self, doc: Any) -> object: ...  # raises StateError; what it returns is not used
