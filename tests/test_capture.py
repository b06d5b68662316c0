"""`gpu-health-exporter capture`: record a node (here a replayed real capture, and a simulated
p5 with a fault), replay the one file with --nvml-capture and --kmsg-file, get the same metrics."""

from __future__ import annotations

import json

from exporter.arguments import build_parser
from exporter.cli import main
from exporter.collectors.gpu import GpuCollector
from exporter.collectors.xid import XidCollector
from exporter.runner import Runner
from exporter.startup import build_context
from exporter.xid.service import one_shot
from tests.helpers import FIXTURES, samples, scrape, test_pool

CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_capture.json"
KMSG = FIXTURES / "kmsg" / "kmsg_nvidia.txt"
# Series that differ from run to run whatever the source: wall-clock times and our own durations.
VOLATILE = ("duration", "timestamp", "scrapes_total", "collections_total")


def node_metrics(tmp_path, *flags: str) -> dict:
    """GPU and XID metrics of one collection with these source flags (state in its own dir)."""
    args = build_parser().parse_args([*flags, "--path.state-dir", str(tmp_path / "state" / str(len(flags)))])
    ctx, simulation = build_context(args)
    try:
        one_shot(ctx)
        runner = Runner([GpuCollector(ctx), XidCollector(ctx)], deadline_s=10, pool=test_pool())
        ss = samples(scrape(runner))
        runner.close()
    finally:
        if simulation is not None:
            simulation.close()
    return {k: v for k, v in ss.items() if not any(w in k[0] for w in VOLATILE)}


def test_capture_of_a_replayed_real_node_replays_to_the_same_metrics(tmp_path, capsys):
    out = tmp_path / "node.json"
    source = ["--nvml-capture", str(CAPTURE), "--kmsg-file", str(KMSG)]
    assert main(["capture", *source, "--out", str(out)]) == 0
    assert "captured 1 GPU(s) and 8 NVIDIA kernel-log record(s)" in capsys.readouterr().out
    cap = json.loads(out.read_text())
    assert cap["format"] == "gpu-health-exporter capture 1" and len(cap["devices"]) == 1
    original = node_metrics(tmp_path, *source)
    replayed = node_metrics(tmp_path, "--nvml-capture", str(out), "--kmsg-file", str(out))
    assert original == replayed
    assert any(n == "gpu_xid_errors_total" for n, _ in replayed)  # the real XID 31 came along


def test_capture_of_a_simulated_node_with_a_fault(tmp_path, capsys):
    out = tmp_path / "p5.json"
    assert main(["capture", "--simulate", "p5.48xlarge", "--scenario", "gpu-row-remap-pending",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    replayed = node_metrics(tmp_path, "--nvml-capture", str(out), "--kmsg-file", str(out))
    by_name: dict[str, list] = {}
    for (n, ls), v in replayed.items():
        by_name.setdefault(n, []).append((dict(ls), v))
    assert [v for _, v in by_name["gpu_devices"]] == [8]
    pending = [ls["gpu"] for ls, v in by_name["gpu_row_remap_pending"] if v == 1]
    xid63 = [ls["gpu"] for ls, v in by_name["gpu_xid_errors_total"] if ls["xid"] == "63"]
    assert pending == xid63 and len(xid63) == 1  # the faulty GPU's NVML state and its kernel line


def test_capture_without_nvml_fails_clearly(tmp_path, capsys):
    missing = str(tmp_path / "missing.json")
    assert main(["capture", "--nvml-capture", missing, "--out", str(tmp_path / "x")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_capture_records_gpm_and_the_replay_measures_it(tmp_path, capsys):
    """GPM: support, a sample's cost and the metrics over an interval, per GPU; on an A100 the
    support query says no and a sample answers Not Supported. The replay serves the recorded
    levels as the GPU's activity."""
    from exporter.nvml import backend as nv
    from exporter.nvml.fake import FakeBackend
    from exporter.tools.simulate.nvml_synth import TRAINING_LEVELS

    out = tmp_path / "p5.json"
    assert main(["capture", "--simulate", "p5.48xlarge", "--out", str(out)]) == 0
    dev = json.loads(out.read_text())["devices"][0]
    assert dev["nvmlGpmQueryDeviceSupport"]["ok"]["isSupportedDevice"] == 1
    assert dev["nvmlGpmSampleGet"]["us_median"] >= 0 and "ok" in dev["nvmlGpmSampleGet"]
    sm = dev["nvmlGpmMetricsGet"]["ok"][str(nv.GPM_SM_UTIL)]
    assert sm["ret"] == 0 and abs(sm["value"] - TRAINING_LEVELS[nv.GPM_SM_UTIL]) < 1.0
    fake = FakeBackend.from_file(out)
    fake.init()
    fake.advance_to(0.0)
    s1, s2 = fake.gpm_sample_alloc(), fake.gpm_sample_alloc()
    fake.gpm_sample_get(0, s1)
    fake.advance_to(10.0)
    fake.gpm_sample_get(0, s2)
    (v,) = fake.gpm_metrics_get(s1, s2, [nv.GPM_SM_UTIL])
    assert v.ret == 0 and abs(v.value - sm["value"]) < 1e-6

    out = tmp_path / "p4d.json"
    assert main(["capture", "--simulate", "p4d.24xlarge", "--out", str(out)]) == 0
    capsys.readouterr()
    dev = json.loads(out.read_text())["devices"][0]
    assert dev["nvmlGpmQueryDeviceSupport"]["ok"]["isSupportedDevice"] == 0
    assert dev["nvmlGpmSampleGet"]["code"] == nv.NVML_ERROR_NOT_SUPPORTED
