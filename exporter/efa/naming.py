"""Driver counter file -> catalog metric. Pure data plus one lookup function.

Names follow base units and `_total` suffixes; the file name each metric comes from is in its
help text. Sources: drivers/infiniband/hw/efa/efa_verbs.c (EFA_DEFINE_PORT_STATS,
EFA_DEFINE_DEVICE_STATS) and the out-of-tree amzn-drivers copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.catalog import MetricSpec, define

C = "efa"
PORT_LABELS = ("device", "port")
DEVICE_LABELS = ("device",)

PORT = "port"
DEVICE = "device"


# efa.counters: default. What the shipped rules, dashboards and runbooks use, plus what locates a
# fault on one device: traffic (bytes, packets), SRD retransmits and their timeouts, unresponsive
# and impaired remotes, receive drops, RDMA work-request errors, admin commands lost. The rest
# (received packets, work-request and send/recv volumes, RDMA byte counts, admin command and
# keep-alive counts, verbs errors, port rate, stats lifespan, efa_info, unknown driver stats) is
# `all` or a list (docs/efa.md says why).
DEFAULT_COUNTERS = frozenset({
    "tx_bytes", "rx_bytes", "tx_pkts", "rx_drops",
    "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events", "impaired_remote_conn_events",
    "rdma_read_wr_err", "rdma_write_wr_err", "no_completion_cmds",
})
OPT_IN = "`efa.counters`: all or listed"


def exported_by(file: str) -> str:
    """Which efa.counters setting exports the metric of `file` (for docs/metrics.md)."""
    return "default" if file in DEFAULT_COUNTERS else OPT_IN


@dataclass(frozen=True)
class Mapping:
    spec: MetricSpec
    scope: str  # PORT (labels device, port) or DEVICE (label device)
    extra: tuple[tuple[str, str], ...] = ()  # fixed extra labels, e.g. (("op", "create_qp"),)


def _port(file: str, name: str, unit: str, help: str, since: str) -> tuple[str, Mapping]:
    spec = define(name, "counter", f"{help} (port hw_counters/{file}; Linux {since}+).",
                  PORT_LABELS, unit=unit, collector=C, detail=exported_by(file))
    return file, Mapping(spec, PORT)


def _dev(file: str, name: str, help: str, since: str) -> tuple[str, Mapping]:
    spec = define(name, "counter", f"{help} (device hw_counters/{file}; Linux {since}+).",
                  DEVICE_LABELS, collector=C, detail=exported_by(file))
    return file, Mapping(spec, DEVICE)


# Port-level counters: hardware statistics of the whole device (EFA has one port), fetched from
# the device with GET_STATS admin commands.
PORT_COUNTERS: dict[str, Mapping] = dict([
    _port("tx_bytes", "efa_tx_bytes_total", "bytes", "Bytes transmitted", "5.4"),
    _port("tx_pkts", "efa_tx_packets_total", "packets", "Packets transmitted", "5.4"),
    _port("rx_bytes", "efa_rx_bytes_total", "bytes", "Bytes received", "5.4"),
    _port("rx_pkts", "efa_rx_packets_total", "packets", "Packets received", "5.4"),
    _port("rx_drops", "efa_rx_drops_total", "", "Received packets dropped", "5.4"),
    _port("send_bytes", "efa_send_bytes_total", "bytes", "Bytes sent by send work requests", "5.10"),
    _port("send_wrs", "efa_send_work_requests_total", "", "Send work requests", "5.10"),
    _port("recv_bytes", "efa_recv_bytes_total", "bytes", "Bytes received by receive work requests", "5.10"),
    _port("recv_wrs", "efa_recv_work_requests_total", "", "Receive work requests", "5.10"),
    _port("rdma_read_wrs", "efa_rdma_read_work_requests_total", "", "RDMA read work requests", "5.10"),
    _port("rdma_read_bytes", "efa_rdma_read_bytes_total", "bytes", "Bytes read by RDMA read", "5.10"),
    _port("rdma_read_wr_err", "efa_rdma_read_errors_total", "",
          "RDMA read work requests completed with an error", "5.10"),
    _port("rdma_read_resp_bytes", "efa_rdma_read_response_bytes_total", "bytes",
          "Bytes sent in responses to remote RDMA reads", "5.10"),
    _port("rdma_write_wrs", "efa_rdma_write_work_requests_total", "",
          "RDMA write work requests (0 on hardware without RDMA write, e.g. p4d)", "6.6"),
    _port("rdma_write_bytes", "efa_rdma_write_bytes_total", "bytes", "Bytes written by RDMA write", "6.6"),
    _port("rdma_write_wr_err", "efa_rdma_write_errors_total", "",
          "RDMA write work requests completed with an error", "6.6"),
    _port("rdma_write_recv_bytes", "efa_rdma_write_recv_bytes_total", "bytes",
          "Bytes received from remote RDMA writes", "6.6"),
    _port("retrans_bytes", "efa_retrans_bytes_total", "bytes",
          "SRD bytes retransmitted (Nitro v4 and later)", "6.17"),
    _port("retrans_pkts", "efa_retrans_packets_total", "packets",
          "SRD packets retransmitted (Nitro v4 and later)", "6.17"),
    _port("retrans_timeout_events", "efa_retrans_timeout_events_total", "",
          "SRD traffic timeouts that changed the network path (Nitro v4 and later)", "6.17"),
    _port("unresponsive_remote_events", "efa_unresponsive_remote_events_total", "",
          "SRD remote connections found unresponsive (Nitro v4 and later)", "6.17"),
    _port("impaired_remote_conn_events", "efa_impaired_remote_conn_events_total", "",
          "SRD remote connections that entered an impaired, rate-limited state (Nitro v4 and later)",
          "6.17"),
])

VERBS_ERRORS = define(
    "efa_verbs_errors_total", "counter",
    "Failed verbs operations by operation (device hw_counters/<op>_err: alloc_pd, create_qp, create_cq, "
    "reg_mr, alloc_ucontext, create_ah, mmap; alloc_mr and get_dma_mr from the out-of-tree driver).",
    ("device", "op"), collector=C, detail=OPT_IN)

# Device-level counters: software counters kept by the driver (reading them sends no command).
DEVICE_COUNTERS: dict[str, Mapping] = dict([
    _dev("submitted_cmds", "efa_admin_commands_submitted_total",
         "Admin commands submitted to the device (each stats refresh sends 4-5, so scraping moves it)",
         "5.4"),
    _dev("completed_cmds", "efa_admin_commands_completed_total", "Admin commands completed", "5.4"),
    _dev("cmds_err", "efa_admin_command_errors_total", "Admin commands that completed with an error",
         "5.8"),
    _dev("no_completion_cmds", "efa_admin_commands_no_completion_total",
         "Admin commands that timed out without completion (in polling mode the device stops "
         "accepting commands until reset)", "5.4"),
    _dev("keep_alive_rcvd", "efa_keep_alive_received_total",
         "Keep-alive events received from the device", "5.4"),
])

OTHER_PORT = define(
    "efa_port_driver_stat_total", "counter",
    "A port hw_counters file this exporter has no name for (a newer driver); stat = the file name, "
    "value as the driver reports it.", ("device", "port", "stat"), collector=C, detail=OPT_IN)
OTHER_DEVICE = define(
    "efa_device_driver_stat_total", "counter",
    "A device hw_counters file this exporter has no name for (a newer driver); stat = the file name, "
    "value as the driver reports it.", ("device", "stat"), collector=C, detail=OPT_IN)

VERBS_OPS = frozenset({"alloc_pd", "create_qp", "create_cq", "reg_mr", "alloc_ucontext", "create_ah", "mmap",
                       "alloc_mr", "get_dma_mr"})

LIFESPAN_FILE = "lifespan"  # a setting of the ib core's stats cache (ms), not a counter
RATE_FILE = "rate"  # ports/<p>/rate, beside hw_counters
INFO = "info"  # not a file: efa_info (PCI address, driver version), in `all` or when listed

KNOWN_FILES = frozenset({*PORT_COUNTERS, *DEVICE_COUNTERS, *(f"{op}_err" for op in VERBS_OPS), LIFESPAN_FILE,
                         RATE_FILE, INFO})


def counter_set(setting: str | list[str]) -> frozenset[str] | None:
    """The files efa.counters selects; None for `all` (every file, names we do not know too)."""
    if setting == "all":
        return None
    if setting == "default":
        return DEFAULT_COUNTERS
    return frozenset(setting)


def check_counters(v: object) -> str | None:
    """efa.counters: default, all, or a list of counter file names."""
    if v in ("default", "all"):
        return None
    if isinstance(v, list) and v and all(isinstance(f, str) for f in v):
        unknown = sorted(set(v) - KNOWN_FILES)
        if not unknown:
            return None
        return f"known counter file names (not {', '.join(unknown)}): " + ", ".join(sorted(KNOWN_FILES))
    return "default, all, or a list of counter file names"




def lookup(file: str, where: str) -> Mapping:
    """The metric for counter file `file` found in a hw_counters directory at `where` (PORT or
    DEVICE). Known names keep their own scope wherever they sit (kernels before 5.15 list the
    device counters in the port directory too); unknown names keep the scope of their directory."""
    m = PORT_COUNTERS.get(file) or DEVICE_COUNTERS.get(file)
    if m is not None:
        return m
    op = file.removesuffix("_err")
    if op in VERBS_OPS or (where == DEVICE and op != file):
        return Mapping(VERBS_ERRORS, DEVICE, (("op", op),))
    if where == PORT:
        return Mapping(OTHER_PORT, PORT, (("stat", file),))
    return Mapping(OTHER_DEVICE, DEVICE, (("stat", file),))
