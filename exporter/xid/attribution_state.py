"""The attributions across restarts: the `workload` section of the state document
(exporter.xid.persistence), which the daemon writes with the XID and SXid counts when the ledger
changed and `check` reads. Every field is validated before use: a bad section is set aside with
the file and ignored (attribution starts over; the counts are untouched).

Up to version 1 it was a file of its own, `workload-state.json` (WORKLOAD_DOC as a document),
which is migrated when read.
"""

from __future__ import annotations

from typing import Any

from exporter.attribution.history import MAX_GPUS
from exporter.attribution.ledger import MAX_PER_GPU, SXID, XID, Attribution, AttributionLedger
from exporter.state import versions
from exporter.state.values import StateError, bounded, envelope, integer, mapping, pci_key, seconds, show
from exporter.workload.model import MAX_WORKLOADS, Workload, valid_label, valid_workload
from exporter.xid.catalog import XID_MAX, XID_MIN
from exporter.xid.sxid_state import SXID_MAX, SXID_MIN

STATE_NAME = "workload-state.json"
MAX_RECORDS = MAX_GPUS * MAX_PER_GPU
_CODES = {XID: (XID_MIN, XID_MAX), SXID: (SXID_MIN, SXID_MAX)}


def _dump(ledger: AttributionLedger) -> dict[str, Any]:
    return {"records": [
        [r.pci, r.kind, r.code, r.switch, round(r.time, 3),
         None if r.workloads is None else [[w.hpc_job, w.namespace, w.pod, w.container] for w in r.workloads],
         None if r.mono is None else round(r.mono, 6)]
        for r in ledger.records()]}


def validate_state(st: Any) -> list[Attribution]:
    """The records of an old `workload-state.json`; StateError naming the first field out of shape."""
    envelope(st, versions.WORKLOAD)
    return validate_section(st)


def validate_section(st: Any) -> list[Attribution]:
    """The records of a workload section (or an old file's body); StateError naming the first
    field out of shape (the state files' one style, exporter.state.values)."""
    return [_record(row, f"records[{i}]")
            for i, row in enumerate(bounded(mapping(st, "workload").get("records"), "records", MAX_RECORDS))]


def _record(row: Any, where: str) -> Attribution:
    # a record holds 6 fields as written before the event's monotonic time was kept, 7 since
    if not isinstance(row, list) or len(row) not in (6, 7):
        raise StateError(f"{where} is {show(row)}; expected [pci, kind, code, switch, unix time, "
                         "workloads or null, monotonic time or null]")
    pci, kind, code, switch, t, ws, mono = row if len(row) == 7 else (*row, None)
    pci_key(pci, f"{where} pci")
    if kind not in _CODES:
        raise StateError(f"{where} kind is {show(kind)}; expected xid or sxid")
    integer(code, f"{where} {kind}", *_CODES[kind])
    if kind == SXID:
        pci_key(switch, f"{where} switch")  # an SXid names its NVSwitch's PCI key
    elif switch != "":
        raise StateError(f"{where} switch is {show(switch)}; an XID names no NVSwitch")
    t = seconds(t, f"{where} unix time")
    mono = None if mono is None else seconds(mono, f"{where} monotonic time")
    if ws is None:
        return Attribution(pci, kind, code, switch, t, None, mono)
    workloads = []
    for j, w in enumerate(bounded(ws, f"{where} workloads", MAX_WORKLOADS)):
        if not isinstance(w, list) or len(w) != 4 or not all(valid_label(f) for f in w):
            raise StateError(f"{where} workloads[{j}] is {show(w)}; expected [hpc_job, namespace, pod, "
                             "container], printable single-line strings")
        wl = Workload(*w)
        if not valid_workload(wl):
            raise StateError(f"{where} workloads[{j}] is {show(w)}; neither a Slurm job (hpc_job alone) "
                             "nor a pod")
        workloads.append(wl)
    return Attribution(pci, kind, code, switch, t, tuple(sorted(set(workloads))), mono)


class WorkloadDocument:
    """The workload section: which workloads each fault hit (as a document of its own, the old
    `workload-state.json`)."""

    name = STATE_NAME
    schema = versions.WORKLOAD
    validate = staticmethod(validate_state)
    section = staticmethod(validate_section)

    def dump(self, ledger: AttributionLedger) -> dict[str, Any]:
        """The body as of now (the ledger's records; changes nothing)."""
        return _dump(ledger)

    def load(self, doc: dict[str, Any], ledger: AttributionLedger) -> None:
        """Add a validated section's records to `ledger` (what it holds stays)."""
        for rec in validate_section(doc):
            ledger.add(rec)


WORKLOAD_DOC = WorkloadDocument()
