"""docs/xid.md's tier and catalog tables are the code's (exporter/tools/xid_catalog.py writes them),
and every catalog entry names its source."""

from exporter.tools.xid_catalog import DOC, render
from exporter.xid.catalog import CATALOG, SOURCES
from exporter.xid.policy import DEFAULT_POLICY


def test_docs_tables_are_the_codes():
    text = DOC.read_text()
    assert render(text) == text, "run: python -m exporter.tools.generate"


def test_every_entry_has_a_source_and_a_tier():
    tiers = {x for xs in DEFAULT_POLICY.values() for x in xs}
    for x, e in CATALOG.items():
        assert e.source and set(e.source.split("+")) <= set(SOURCES), x
        assert x in tiers or x == 154, f"XID {x} has no default tier"
    # the Blackwell NVLink5 codes, decoded by their sheet, and the codes newer than the older table
    assert all("DECODE" in CATALOG[x].source for x in range(144, 151))
    assert {152, 153, 159, 162, 163, 164, 165, 167, 168, 169, 173} <= set(CATALOG)
