"""The fenced code blocks of README.md and docs/*.md, with the tags of their info string.

The convention (docs/design.md, "Docs that stay true"): the info string is the language, then
tags. ```` ```sh runnable ```` is run by tests/test_doc_commands.py against the simulated node,
each line a command, from the checkout; ```` ```sh runnable installed ```` from a wheel installed
in a fresh virtual environment, in a directory outside the checkout. ```` ```sh wrapper ```` is a
`check` wrapper, run by tests/test_wrappers.py against tool errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^[ \t]*```(\S*)[ \t]*(.*)$")  # indented too (a block under a list item)


@dataclass(frozen=True)
class Block:
    file: str  # relative to the checkout
    line: int  # of the opening fence
    lang: str
    tags: tuple[str, ...]
    text: str


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_blocks() -> list[Block]:
    out = []
    for path in doc_files():
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                body.append(lines[i])
                i += 1
            out.append(Block(str(path.relative_to(ROOT)), start + 1, m.group(1), tuple(m.group(2).split()),
                             "\n".join(body) + "\n"))
            i += 1
    return out
