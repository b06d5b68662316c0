"""The simulated node's acknowledgements hold whatever its scenario flags.

Each set of `--scenario` flags is a kernel log of its own (exporter.simulate.kmsg), so its XID
counts are kept apart from another set's (the state file records the log its counts came from).
It is still one node, with one boot id: an `ack` made with some flags must hold in a run with
others. The simulated node's XID state file (handed to the XidService by the composition root)
keeps a state file of another of its kernel logs for its acknowledgements: the store takes them
(never its counts), and the next write keeps them.
"""

from __future__ import annotations

from exporter.xid.store import StateFile, merge_docs


class SharedAcksStateFile(StateFile):
    def __init__(self, state_dir: str, boot_id: str, kmsg: str = "", read_only: bool = False) -> None:
        super().__init__(state_dir, boot_id, kmsg, read_only)
        self.merge = self._merge_with_other
        self._other: dict | None = None  # the last state of another kernel log read, until taken

    def other_source(self, data: dict) -> None:
        self._other = data

    def other_acks(self) -> dict | None:
        other, self._other = self._other, None
        return other

    def _merge_with_other(self, ours: dict, disk: dict | None, counts: bool) -> tuple[dict, bool]:
        """What is written: ours merged with the file on disk, then with the acks of another
        log's file read and not yet taken (the file on disk when it is that one)."""
        data, extra = merge_docs(ours, disk, counts)
        if self._other is not None:
            data, more = merge_docs(data, self._other, False)
            extra = extra or more
        return data, extra
