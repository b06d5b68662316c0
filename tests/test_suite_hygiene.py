"""The suite's own rules, checked on its source: no test or benchmark picks a port for another
process to bind later. Binding port 0, closing the socket and handing the number on leaves a window
in which any other process asking for a free port can be given the same one (two exporters of the
alert matrix were, and one received the other's pages). Servers bind port 0 themselves and report
the port they got (tests/helpers.py: served_base, port_of, start_listening)."""

from __future__ import annotations

import ast

from tests.helpers import ROOT

# Names of the helpers that hand such a port on (spelt in pieces so that this file, which the check
# reads too, names none of them).
_PICKER_NAMES = ("free" "_port", "unused" "_port")
SOURCES = sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])


def _port_pickers(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every place that hands a just-released port on: a function that returns
    the port of a socket it is about to close, or one named like the usual helper for that."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if any(name in fn.name for name in _PICKER_NAMES):
            found.append((fn.lineno, f"def {fn.name}"))
        for node in ast.walk(fn):
            if (isinstance(node, ast.Return) and isinstance(node.value, ast.Subscript)
                    and isinstance(node.value.value, ast.Call)
                    and isinstance(node.value.value.func, ast.Attribute)
                    and node.value.value.func.attr == "getsockname"):
                found.append((node.lineno, f"{fn.name} returns a port it no longer holds"))
    return found


def test_no_test_or_benchmark_picks_a_port_for_another_process():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in SOURCES
                 for line, what in _port_pickers(ast.parse(path.read_text(), str(path)))]
    assert not offenders, "\n".join(offenders)


_PICKER = "getsock" "name()[1]"  # test_the_check_finds_the_pattern's samples, only ever parsed


def test_the_check_finds_the_pattern():
    picker = ("def pick(s) -> int:\n"
              "    with s:\n"
              f"        return s.{_PICKER}\n")
    assert _port_pickers(ast.parse(picker)) == [(3, "pick returns a port it no longer holds")]
    holder = ("import contextlib\n"
              "@contextlib.contextmanager\n"
              "def hold(s):\n"
              "    with s:\n"
              f"        yield s.{_PICKER}\n")
    assert _port_pickers(ast.parse(holder)) == []  # held for as long as it is used
    assert _port_pickers(ast.parse(f"def {_PICKER_NAMES[0]}(): pass\n")) == [(1, f"def {_PICKER_NAMES[0]}")]
    assert len(SOURCES) > 50
