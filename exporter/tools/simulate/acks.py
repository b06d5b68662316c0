"""The simulated node's acknowledgements hold whatever its scenario flags.

Each set of `--scenario` flags is a kernel log of its own (exporter.tools.simulate.kmsg), so its XID
counts are kept apart from another set's (the state file records the log its counts came from).
It is still one node, with one boot id: an `ack` made with some flags must hold in a run with
others. So the simulated node's acks file (handed to the XidService by the composition root) is
keyed by the boot alone: every kernel log of the node reads and adds to the same one.
"""

from __future__ import annotations

from exporter.xid.store import AcksFile


class SharedAcksFile(AcksFile):
    def __init__(self, state_dir: str, boot_id: str, kmsg: str = "", read_only: bool = False) -> None:
        super().__init__(state_dir, boot_id, "", read_only)  # "": a file of any kernel log is this one
