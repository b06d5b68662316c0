"""The NVML seam is a leaf: exporter/nvml/ imports no other package of the exporter but
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
