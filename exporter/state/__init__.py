"""The state the exporter keeps on disk across restarts within a boot, and its versions.

Two JSON documents in `paths.state_dir`, each written whole and atomically by its one writer
(exporter.state.file), each with one schema object (exporter.state.document) that validates,
dumps and loads it:

- `xid-state.json` (STATE_DOC, exporter.xid.persistence), the daemon's, of three sections each
  validated on its own (exporter.state.document.Sectioned): the XID counts, open events, GPU
  identities, the acks it folded in and the last kernel-log sequence number (XID_DOC,
  exporter.xid.store); `sxid`, the SXid counts per NVSwitch (SXID_DOC, exporter.xid.sxid_state);
  `workload`, which workloads each fault hit (WORKLOAD_DOC, exporter.xid.attribution_state);
- `xid-acks.json` (ACKS_DOC, exporter.xid.store), `ack`'s: this boot's acknowledgements, which
  the daemon folds in (so no file has two writers of its counts).

Up to version 1 the SXid and workload sections were files of their own (`sxid-state.json`,
`workload-state.json`; SXID_DOC and WORKLOAD_DOC as documents), migrated when read.

Every value read is checked by exporter.state.values; a document out of shape raises StateError.

Every document carries `version`. exporter.state.versions holds each document's schema version
and the migrations from every version this project has written to the current one: a file of an
older version is upgraded in memory when read (and written back in the current one), so an
upgrade keeps every count. A file of a newer version (a downgrade: the exporter rolled back) is
never read as corrupt nor silently dropped: it is set aside as `<name>.newer-v<N>-<time>` with a
log line that says so, and the state file's problem reads `newer_version` (metrics, `check`).
tests/fixtures/state/ keeps files written by earlier commits; tests/test_state_upgrade.py loads
each with its counts, acks and attribution.
"""
