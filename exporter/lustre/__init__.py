"""FSx for Lustre client sources: mount discovery, per-version file locations and pure parsers.

The collector (exporter.collectors.lustre) ties them together; nothing here keeps state except
the eviction tracker, which is owned by the collector.
"""
