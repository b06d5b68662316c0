"""The simulation stays at the edge: the composition root builds it and hands its backends to the
Context; no product module reads it; its shape can be set in the config file."""

from __future__ import annotations

import ast

import pytest

from exporter import collectors
from exporter.arguments import build_parser
from exporter.cli import main
from exporter.imds import InstanceSection
from exporter.runner import Runner
from exporter.startup import build_context
from tests.helpers import ROOT, START_HANG_GUARD_S, guarded_env, samples, scrape, test_pool, value

# the command line; exporter/tools/simulate/ is the simulation
EDGE = {"exporter/cli.py", "exporter/startup.py"}


def _modules():
    for path in sorted((ROOT / "exporter").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("exporter/tools/simulate/") or rel in EDGE:
            continue
        yield rel, ast.parse(path.read_text(), rel)


def test_no_product_module_reads_the_simulation():
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("exporter.tools.simulate"):
                found.append(f"{rel}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import):
                found += [f"{rel}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name.startswith("exporter.tools.simulate")]
            elif isinstance(node, ast.Attribute) and node.attr == "simulation":
                found.append(f"{rel}:{node.lineno} reads .simulation")
            elif isinstance(node, ast.Constant) and node.value == "simulation":
                found.append(f"{rel}:{node.lineno} looks up 'simulation'")
    assert found == []


def test_nvml_package_does_not_import_the_simulation():
    """nvml/fake, the scenarios and the synthesised node used to import each other; the scenarios
    and the synthesis are the simulation's now, and exporter.nvml imports none of it."""
    for path in sorted((ROOT / "exporter" / "nvml").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n.startswith("exporter.tools.simulate") for n in names), (path.name, node.lineno)
    assert not (ROOT / "exporter" / "nvml" / "scenarios.py").exists()
    assert not (ROOT / "exporter" / "nvml" / "synth.py").exists()


@pytest.fixture
def shaped():
    built = []

    def make(*flags: str):
        ctx, sim = build_context(build_parser().parse_args(["--simulate", "p5.48xlarge", *flags]))
        built.append(sim)
        return ctx, sim

    yield make
    for sim in built:
        sim.close()


def test_the_simulated_node_takes_its_shape_from_its_flags(shaped):
    ctx, sim = shaped("--simulate.gpus", "2", "--simulate.efa-devices", "4", "--simulate.lustre-osts", "16")
    assert ctx.nvml.ensure() and len(ctx.nvml.devices) == 2
    assert len(list((sim.root / "sys" / "class" / "infiniband").iterdir())) == 4
    osts = [p.name for p in (sim.root / "proc" / "fs" / "lustre" / "osc").iterdir()]
    assert len(osts) == 16 and any("OST000f" in n for n in osts)
    runner = Runner.from_config(collectors.build(ctx, ["gpu", "efa", "health"]), ctx.config, pool=test_pool())
    try:
        ss = samples(scrape(runner))
    finally:
        runner.close()
    # the expected counts follow the shape: a smaller benchmark node is not a broken p5
    assert value(ss, "gpu_devices") == value(ss, "gpu_devices_expected") == 2
    assert value(ss, "efa_devices") == value(ss, "efa_devices_expected") == 4
    assert value(ss, "gpu_node_health_verdict", verdict="healthy") == 1


def test_the_default_shape_is_the_profile_and_the_node_says_so_in_dmi(shaped):
    ctx, sim = shaped()
    assert (sim.root / "sys/devices/virtual/dmi/id/product_name").read_text().strip() == "p5.48xlarge"
    assert ctx.identity.instance_type_source() == "dmi" and ctx.config.node.instance_type is None
    assert ctx.nvml.ensure() and len(ctx.nvml.devices) == 8
    assert len(list((sim.root / "proc" / "fs" / "lustre" / "osc").iterdir())) == 8
    assert ctx.config.section(InstanceSection).imds is False and ctx.config.node.expected_gpus is None


def test_the_shape_is_the_simulation_s_not_the_config_schema_s(tmp_path, capsys):
    """The simulation's options are flags under --simulate: the product's config has no
    `simulate` section, and a shape flag without --simulate is a usage error."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("simulate:\n  gpus: 2\n")
    assert main(["check", "--simulate", "p5.48xlarge", "--config", str(cfg)]) == 3
    assert "unknown key 'simulate'" in capsys.readouterr().err
    assert main(["check", "--simulate.gpus", "2"]) == 3
    assert "--simulate.gpus needs --simulate PROFILE" in capsys.readouterr().err


def test_a_shape_the_layout_cannot_have_is_a_config_error(capsys):
    # a config error: check could not check (3), never "action required" (2)
    assert main(["check", "--simulate", "p5.48xlarge", "--simulate.efa-devices", "33"]) == 3
    assert "--simulate.efa-devices is 33; the p5.48xlarge layout has at most 32" in capsys.readouterr().err
    assert main(["check", "--simulate", "p5.48xlarge", "--simulate.gpus", "99"]) == 3
    assert "--simulate.gpus is 99; expected an integer from 0 to 16" in capsys.readouterr().err


def test_a_killed_simulation_root_is_removed_by_the_next_one(tmp_path, monkeypatch):
    """A SIGKILLed simulated exporter cannot remove its tree under the temporary directory: the next
    simulation removes roots whose owner process is gone, and leaves a live one's alone."""
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    from exporter.tools.simulate import Simulation

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # the module caches gettempdir()
    env = guarded_env(TMPDIR=str(tmp_path))  # with the suite's loopback guard
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge",
                             "--web.listen-address", "127.0.0.1:0"], env=env, cwd=str(ROOT),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_HANG_GUARD_S
    while not list(tmp_path.glob("ghe-sim-*/owner")):
        assert proc.poll() is None and time.monotonic() < deadline, "no simulated root appeared"
        time.sleep(0.05)
    (killed,) = tmp_path.glob("ghe-sim-*")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    live = Simulation("p5.48xlarge")
    try:
        assert not killed.exists()
        assert live.root.exists() and live.root.parent == tmp_path
        other = Simulation("p5.48xlarge")  # a live owner's root stays
        assert live.root.exists()
        other.close()
    finally:
        live.close()


def test_the_simulated_node_s_acks_hold_across_its_scenario_sets(tmp_path):
    """Each set of scenario flags is a kernel log of its own (counts apart), on one node: its acks
    file is the node's, read by every set (the product's is keyed by the kernel log too)."""
    from exporter.state.file import StateFile
    from exporter.tools.simulate.acks import SharedAcksFile
    from exporter.xid.persistence import STATE_DOC
    from exporter.xid.store import ACKS_DOC, XID_EVENTS, Ack, AcksFile, EventStore

    pci, state = "00000000:53:00", str(tmp_path / "state")
    ack = Ack(pci, 2, "", 63, 1700000100.0, {"63": 1})
    assert SharedAcksFile(state, "boot", "simulated:p5.48xlarge:xid-63").update(
        lambda disk: ACKS_DOC.dump([ack]))
    theirs = SharedAcksFile(state, "boot", "simulated:p5.48xlarge:gpu-lost,xid-63").read()
    assert theirs is not None and [a["xid"] for a in theirs["acks"]] == [63]
    mine = EventStore(XID_EVENTS)
    mine.report("kmsg", pci, 63, 2.0, 1700000200.0)
    assert [a.xid for a in ACKS_DOC.load(theirs, mine)] == [63] and mine.unacked(pci) == {}

    plain = AcksFile(state, "boot", "/dev/kmsg")  # a real node's log: the simulated one's acks are not its
    assert plain.read() is None and plain.status.problem == "other_source"
    assert StateFile(state, "boot", "/dev/kmsg", doc=STATE_DOC).read() is None
