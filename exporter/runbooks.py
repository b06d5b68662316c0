"""docs/runbooks.md as one self-contained HTML page: the runbooks a release ships and the
default runbook base of every alert links to (exporter.rules.DEFAULT_RUNBOOK_BASE).

Each heading gets the anchor GitHub gives it (lower case, punctuation dropped, spaces as
hyphens), so `runbooks.html#gpuxidreplacenow` opens the same section as `runbooks.md#...` does
on a forge. Only what docs/runbooks.md uses is rendered: headings, paragraphs, lists, fenced code,
inline code, bold and links. Standard library only: setup.py renders it while the wheel is built.

    python -m exporter.runbooks --out DIR   # write DIR/runbooks.html
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

_INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")
_ITEM = re.compile(r"^(\s*)(?:[-*]|\d+\.)\s+(.*)$")
STYLE = ("body{font:15px/1.5 system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
         "pre{background:#f4f4f4;padding:.6em;overflow-x:auto}code{background:#f4f4f4}"
         "h3{border-top:1px solid #ddd;padding-top:.8em}")


def anchor(heading: str) -> str:
    """The anchor GitHub generates for a heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def inline(text: str) -> str:
    out, at = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[at:m.start()]))
        code, bold, label, href = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{inline(bold)}</strong>")
        else:
            out.append(f'<a href="{html.escape(href)}">{inline(label)}</a>')
        at = m.end()
    return "".join(out) + html.escape(text[at:])


def render(markdown: str, title: str = "Runbooks") -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"]
    para: list[str] = []
    items: list[str] = []
    lines = markdown.splitlines()

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        heading = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        item = _ITEM.match(line)
        if line.lstrip().startswith("```"):  # a fence, also one indented under a list item
            flush()
            indent = len(line) - len(line.lstrip())
            body = []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i].lstrip())
                i += 1
            out.append(f"<pre><code>{html.escape(chr(10).join(body))}</code></pre>")
        elif heading:
            flush()
            n, text = len(heading.group(1)), heading.group(2)
            out.append(f'<h{n} id="{anchor(text)}">{inline(text)}</h{n}>')
        elif not line.strip():
            flush()
        elif item and not para:
            items.append(item.group(2))
        elif items and line.startswith(" "):
            items[-1] += " " + line.strip()  # an item's continuation line
        else:
            if items:
                flush()
            para.append(line.strip())
        i += 1
    flush()
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from exporter import share

    p = argparse.ArgumentParser(prog="python -m exporter.runbooks", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, metavar="DIR", help="Directory to write runbooks.html to.")
    args = p.parse_args(argv)
    source = share.root() / "docs" / "runbooks.md"
    out = Path(args.out) / "runbooks.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(source.read_text()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
