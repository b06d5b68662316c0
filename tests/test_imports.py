"""No import cycles in exporter/: the module import graph, read
from the source (every import statement: at module level, inside a function, under TYPE_CHECKING),
has no cycle, and neither has the graph of its packages (exporter.xid, exporter.workload, ...; a
module directly under exporter/ is a node of its own): two packages that import each other have
no one direction of dependency even when no two modules close a cycle.
An import moved into a function still runs when the function does, so it is an edge like any
other; a dependency that would close a cycle is inverted instead (docs/design.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.helpers import HANG_GUARD_S, ROOT


def _modules(package: Path) -> dict[str, Path]:
    out = {}
    for p in package.rglob("*.py"):
        parts = p.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def import_graph(package: Path = ROOT / "exporter") -> dict[str, set[str]]:
    """The package's modules -> the package's modules each imports. `from a import b` is an edge
    to the module a.b when there is one, else to a; relative imports are resolved."""
    mods = _modules(package)

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    deps.add(sub if sub in mods else known(base))
        graph[mod] = deps - {None, mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_graph(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The module graph folded onto packages: each module stands for its first `depth` name
    parts (exporter.xid.store -> exporter.xid; exporter.cli stays exporter.cli)."""
    def pkg(m: str) -> str:
        return ".".join(m.split(".")[:depth])

    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out.setdefault(pkg(mod), set()).update(pkg(d) for d in deps)
    return {p: deps - {p} for p, deps in out.items()}


def test_a_cycle_is_found_whatever_kind_of_import_closes_it(tmp_path):
    """Module-level, function-level, relative and TYPE_CHECKING imports are all edges."""
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from toy import b\n",
        "b.py": "def later():\n    from toy.sub import c\n",  # hidden in a function
        "sub/__init__.py": "",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..d import D\n",
        "d.py": "import toy.a as a\nimport os\n",  # closes a -> b -> sub.c -> d -> a
        "e.py": "from . import a\n",  # outside the cycle
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    g = import_graph(pkg)
    assert g["toy.sub.c"] == {"toy.d"} and g["toy.e"] == {"toy.a"} and g["toy.d"] == {"toy.a"}
    assert cycles(g) == [["toy.a", "toy.b", "toy.d", "toy.sub.c"]]
    (pkg / "b.py").write_text("")
    assert cycles(import_graph(pkg)) == []


def test_exporter_has_no_import_cycle():
    g = import_graph()
    found = cycles(g)
    assert not found, "import cycles in exporter/:\n" + "\n".join(
        f"  {c}: " + "; ".join(f"{m} -> {sorted(g[m] & set(c))}" for m in c) for c in found)


def test_a_package_cycle_is_found_where_no_two_modules_close_one(tmp_path):
    """toy.p.a -> toy.q.b and toy.q.c -> toy.p.d: no module cycle, but p and q need each other."""
    pkg = tmp_path / "toy"
    for sub_ in ("p", "q"):
        (pkg / sub_).mkdir(parents=True)
        (pkg / sub_ / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "p" / "a.py").write_text("from toy.q import b\n")
    (pkg / "q" / "b.py").write_text("")
    (pkg / "q" / "c.py").write_text("def f():\n    from toy.p import d\n")
    (pkg / "p" / "d.py").write_text("")
    g = import_graph(pkg)
    assert cycles(g) == []
    assert cycles(package_graph(g)) == [["toy.p", "toy.q"]]
    (pkg / "q" / "c.py").write_text("")
    assert cycles(package_graph(import_graph(pkg))) == []


def test_exporter_has_no_package_cycle():
    """exporter.workload and exporter.xid once imported each other (attribution), and
    exporter.nvml imported exporter.gpu and exporter.xid (capture) which import it."""
    g = import_graph()
    pg = package_graph(g)
    found = cycles(pg)
    assert not found, "package cycles in exporter/:\n" + "\n".join(
        f"  {c}: " + "; ".join(f"{m} ({a}) -> {b}" for a in sorted(g) for b in sorted(g[a])
                               for m in c if a.startswith(m + ".") and any(
                                   b == o or b.startswith(o + ".") for o in c if o != m)) for c in found)


def test_the_config_loader_does_not_import_the_collectors():
    """The schema is config's registry; the collectors register their sections into it when the
    composition root discovers them, so loading a config imports no collector."""
    code = "import sys, exporter.config; exporter.config.load(None); print(*sorted(sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    assert "exporter.config" in r.stdout.split()
    assert not [m for m in r.stdout.split() if m.startswith("exporter.collector")], r.stdout
