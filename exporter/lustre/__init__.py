"""FSx for Lustre client sources: mount discovery, per-version file locations and pure parsers.

The collector (exporter.collectors.lustre) ties them together and owns every stateful object
here: the eviction tracker, the `Tree` (client version, this scrape's source problems) and the
the mount probes (exporter.deadline: calls still stuck on a hung mount).
"""
