"""The size of the XID path, measured one way for this tree (at any commit) and for gpud's XID
component: files, lines (non-blank, not a comment nor a docstring), classes (Python `class`
statements; Go named struct and interface types), and the objects composed for it.

    python bench/xid_component_size.py [--tree ROOT] [--gpud GPUD_CHECKOUT]

What is counted (the same job on both sides: read the kernel log, parse, store the events, count,
judge the GPU; tests and generated files excluded):
- this tree: exporter/xid/, exporter/state/, exporter/collectors/xid.py; objects composed: the
  constructor calls (a called name in CamelCase) in exporter/compose.py's `xid_service`;
- gpud: components/accelerator/nvidia/{xid,sxid}/, its event store pkg/eventstore/ and its
  kernel-log reader pkg/kmsg/ (writer/ excluded: a test tool); objects composed: in each
  component's `New`, the composite literals (`&T{`), `New...(` calls, `Bucket(` and `make(`.
A checkout of gpud: the `fetch` tool's mirror, exported with
`git -C MIRROR archive HEAD components/accelerator/nvidia pkg/eventstore pkg/kmsg | tar -x -C DIR`.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = ("exporter/xid", "exporter/state", "exporter/collectors/xid.py")
GPUD = ("components/accelerator/nvidia/xid", "components/accelerator/nvidia/sxid",
        "pkg/eventstore", "pkg/kmsg")
GO_TYPE = re.compile(r"^type\s+\w+(?:\[[^\]]*\])?\s+(?:struct|interface)\b", re.MULTILINE)
GENERATED = re.compile(r"^// Code generated .* DO NOT EDIT", re.MULTILINE)


@dataclass
class Size:
    files: int = 0
    lines: int = 0
    classes: int = 0
    generated_lines: int = 0  # not in `lines`


def python_lines(src: str) -> int:
    """Lines holding a token that is neither a comment nor a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in skip:
            code.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in docstrings)
    return len(code)


def go_lines(src: str) -> int:
    """Lines that are not blank, not a // comment, not inside a /* */ comment."""
    n, block = 0, False
    for line in src.splitlines():
        s = line.strip()
        if block:
            block = "*/" not in s
            continue
        if s.startswith("/*"):
            block = "*/" not in s
            continue
        if s and not s.startswith("//"):
            n += 1
    return n


def files(root: Path, parts: tuple[str, ...], suffix: str) -> list[Path]:
    out: list[Path] = []
    for p in parts:
        path = root / p
        out += [path] if path.is_file() else sorted(path.rglob(f"*{suffix}"))
    return [f for f in out if not f.name.endswith("_test.go") and "/writer/" not in f.as_posix()
            and "__pycache__" not in f.parts]


def measure(root: Path, part: str) -> Size:
    size = Size()
    python = not part.startswith(("components/", "pkg/"))
    for f in files(root, (part,), ".py" if python else ".go"):
        src = f.read_text()
        size.files += 1
        if python:
            size.lines += python_lines(src)
            size.classes += sum(isinstance(n, ast.ClassDef) for n in ast.walk(ast.parse(src)))
        elif GENERATED.search(src):
            size.generated_lines += go_lines(src)
        else:
            size.lines += go_lines(src)
            size.classes += len(GO_TYPE.findall(src))
    return size


def composed_python(root: Path) -> int:
    """Constructor calls in compose.xid_service (a CamelCase name called, or `(x or Class)(...)`)."""
    tree = ast.parse((root / "exporter/compose.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "xid_service")
    n = 0
    for call in (c for c in ast.walk(fn) if isinstance(c, ast.Call)):
        f = call.func
        names = [f.id] if isinstance(f, ast.Name) else \
            [v.id for v in f.values if isinstance(v, ast.Name)] if isinstance(f, ast.BoolOp) else []
        n += any(name[:1].isupper() for name in names)
    return n


def composed_go(root: Path) -> int:
    n = 0
    for comp in ("xid", "sxid"):
        src = (root / f"components/accelerator/nvidia/{comp}/component.go").read_text()
        body = src[src.index("\nfunc New("):]
        body = body[: body.index("\n}\n")]
        n += len(re.findall(r"&\w+{|\bNew\w*\(|\.Bucket\(|\bmake\(", body))
    return n


def row(name: str, s: Size, composed: int | str) -> str:
    gen = f" (+{s.generated_lines} generated)" if s.generated_lines else ""
    return f"| {name} | {s.files} | {s.lines}{gen} | {s.classes} | {composed} |"


def table(name: str, root: Path, parts: tuple[str, ...], composed: int) -> list[str]:
    sizes = [measure(root, p) for p in parts]
    fields = ("files", "lines", "classes", "generated_lines")
    total = Size(*(sum(getattr(s, f) for s in sizes) for f in fields))
    return [row(f"**{name}**", total, composed),
            *(row(f"  {p}", s, "") for p, s in zip(parts, sizes, strict=True))]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="this project's tree (any commit)")
    ap.add_argument("--gpud", type=Path, help="a checkout or export of leptonai/gpud")
    args = ap.parse_args()
    lines = table("this tree", args.tree, OURS, composed_python(args.tree))
    if args.gpud:
        lines += table("gpud", args.gpud, GPUD, composed_go(args.gpud))
    print("| | files | lines | classes | objects composed |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
