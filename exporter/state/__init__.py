"""The state the exporter keeps on disk across restarts within a boot, and its versions.

Three JSON documents in `paths.state_dir`, each written whole and atomically:

- `xid-state.json` (exporter.xid.store): XID counts, open events, GPU identities, acks, the last
  kernel-log sequence number;
- `sxid-state.json` (exporter.xid.sxid_store): SXid counts per NVSwitch;
- `workload-state.json` (exporter.workload.attribution_state): which workloads each fault hit.

Every document carries `version`. exporter.state.versions holds each document's schema version
and the migrations from every version this project has written to the current one: a file of an
older version is upgraded in memory when read (and written back in the current one), so an
upgrade keeps every count. A file of a newer version (a downgrade: the exporter rolled back) is
never read as corrupt nor silently dropped: it is set aside as `<name>.newer-v<N>-<time>` with a
log line that says so, and the state file's problem reads `newer_version` (metrics, `check`).
tests/fixtures/state/ keeps files written by earlier commits; tests/test_state_upgrade.py loads
each with its counts, acks and attribution.
"""
