"""Layers of the package. The NVML seam is a leaf: exporter/nvml/ imports no other package of the exporter but
the deadline primitive, so nothing that reads NVML can close a package cycle through it. Recording
a capture, which reads NVML, GPM and the kernel log, is exporter/capture.py, above all three."""

from __future__ import annotations

from tests.test_imports import import_graph


def test_nvml_imports_only_the_deadline_primitive():
    graph = import_graph()
    outside = {d for m, deps in graph.items() if m.startswith("exporter.nvml") for d in deps
               if not d.startswith("exporter.nvml")}
    assert outside <= {"exporter.deadline"}, outside


def test_nothing_below_the_commands_imports_the_capture_recorder():
    graph = import_graph()
    users = {m for m, deps in graph.items() if "exporter.capture" in deps}
    assert users <= {"exporter.cli", "exporter.arguments", "exporter.commands.capture"}, users


def test_the_runtime_package_imports_the_tools_only_where_the_simulation_starts():
    """exporter/tools (the simulation, the generators, the release builder) is above the runtime:
    a runtime module imports from it only where `--simulate` and `--list-scenarios` start the
    simulated node (function-level imports: tests/test_runtime_imports.py checks that a node's
    served process loads none of it)."""
    graph = import_graph()
    users = {m for m, deps in graph.items() if not m.startswith("exporter.tools")
             and any(d == "exporter.tools" or d.startswith("exporter.tools.") for d in deps)}
    assert users <= {"exporter.cli", "exporter.startup"}, users
    simulation = {d for m in users for d in graph[m] if d.startswith("exporter.tools")}
    assert all(d.startswith("exporter.tools.simulate") for d in simulation), simulation
