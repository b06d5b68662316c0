"""Pure EFA functions: file parsing, EFA identification, the read plan, counter naming."""

from __future__ import annotations

import pytest

from exporter.efa import naming
from exporter.efa.parse import (
    FileRead,
    is_efa,
    parse_counter,
    parse_hex_id,
    parse_lifespan_seconds,
    parse_rate_bytes_per_second,
    plan_reads,
)
from exporter.tools.simulate.efa import kernel_files


def test_parse_counter():
    assert parse_counter("18446744073709551615\n") == 2**64 - 1
    assert parse_counter("0\n") == 0
    for bad in ("", "\n", "-1\n", "12 34\n", "0x10\n"):
        with pytest.raises(ValueError):
            parse_counter(bad)


def test_parse_lifespan_and_rate():
    assert parse_lifespan_seconds("12\n") == pytest.approx(0.012)
    assert parse_lifespan_seconds("10000\n") == 10.0
    with pytest.raises(ValueError):
        parse_lifespan_seconds("soon\n")
    assert parse_rate_bytes_per_second("100 Gb/sec (4X EDR)\n") == 12.5e9
    assert parse_rate_bytes_per_second("400 Gb/sec (8X HDR)\n") == 50e9
    assert parse_rate_bytes_per_second("2.5 Gb/sec (1X SDR)\n") == 2.5e9 / 8
    with pytest.raises(ValueError):
        parse_rate_bytes_per_second("fast\n")


def test_is_efa_by_pci_id_or_driver():
    assert parse_hex_id("0x1d0f\n") == 0x1D0F
    for dev in (0xEFA0, 0xEFA1, 0xEFA2, 0xEFA3):
        assert is_efa(0x1D0F, dev, None)
    assert not is_efa(0x15B3, 0x101B, "mlx5_core")
    assert not is_efa(0x1D0F, 0xEC20, "ena")
    assert is_efa(0x1D0F, 0xEFA4, "efa")  # newer id: the driver link decides
    assert is_efa(None, None, "efa")
    assert not is_efa(None, None, None)


def test_plan_split_layout_reads_both_directories():
    port, device, combined = kernel_files((6, 17))
    assert not combined
    plan = plan_reads({"1": port + ["lifespan"]}, device + ["lifespan"])
    assert {r.file for r in plan if r.where == naming.PORT} == set(port) | {"lifespan"}
    assert {r.file for r in plan if r.where == naming.DEVICE} == set(device)  # device lifespan skipped
    assert len(plan) == len({(r.file) for r in plan})


def test_plan_combined_layout_reads_each_name_once():
    port, device, combined = kernel_files((5, 10))
    assert combined
    both = port + device + ["lifespan"]
    plan = plan_reads({"1": both}, both)
    assert sorted(r.file for r in plan) == sorted(both)
    assert all(r.where == naming.PORT and r.port == "1" for r in plan)


def test_plan_reads_device_scoped_names_once_across_ports():
    plan = plan_reads({"1": ["tx_bytes", "submitted_cmds"], "2": ["tx_bytes", "submitted_cmds"]}, [])
    assert plan == [FileRead("port", "1", "submitted_cmds"), FileRead("port", "1", "tx_bytes"),
                    FileRead("port", "2", "tx_bytes")]


def test_naming_covers_every_upstream_counter_with_units_in_names():
    port, device, _ = kernel_files((6, 17))
    for f in port:
        m = naming.lookup(f, naming.PORT)
        assert m.scope == naming.PORT and m.spec.type == "counter" and f in m.spec.help
        if f.endswith("bytes"):
            assert m.spec.name.endswith("_bytes_total")
        if f.endswith("pkts"):
            assert m.spec.name.endswith("_packets_total")
    for f in device:
        m = naming.lookup(f, naming.PORT)  # scope follows the name, not the directory
        assert m.scope == naming.DEVICE
    assert naming.lookup("create_qp_err", naming.DEVICE).extra == (("op", "create_qp"),)
    assert naming.lookup("get_dma_mr_err", naming.PORT).spec is naming.VERBS_ERRORS
    assert naming.lookup("new_err", naming.PORT).spec is naming.OTHER_PORT
    assert naming.lookup("new_err", naming.DEVICE).spec is naming.VERBS_ERRORS
    assert naming.lookup("shiny", naming.DEVICE).extra == (("stat", "shiny"),)
