"""Render a copy of the alert rules (rules/*.yml) for a runbook base URL.

    python -m exporter.rules --runbook-base https://wiki.example.com/gpu/runbooks.md \
        --out /etc/prometheus/rules/gpu-health-exporter

Every alert's `runbook_url` in rules/ is DEFAULT_RUNBOOK_BASE + "#<alert name in lower case>" (the
runbooks in this repository); the rendered copy has the same anchors on the given base. Nothing
else changes, so the copy is what `promtool check rules` and the promtool suites check.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DEFAULT_RUNBOOK_BASE = "https://github.com/gpu-health-exporter/gpu-health-exporter/blob/main/docs/runbooks.md"
RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
_URL = re.compile(r"^([ \t]*runbook_url:[ \t]*)(\S+)#([a-z0-9-]+)[ \t]*$", re.M)


def render(text: str, base: str, source: str = "rules") -> str:
    """`text` (one rule file) with every runbook_url moved from the default base to `base`."""
    def swap(m: re.Match) -> str:
        if m.group(2) != DEFAULT_RUNBOOK_BASE:
            raise ValueError(f"{source}: runbook_url {m.group(2)}#{m.group(3)} does not start with the "
                             f"default base {DEFAULT_RUNBOOK_BASE}")
        return f"{m.group(1)}{base}#{m.group(3)}"
    return _URL.sub(swap, text)


def check_base(base: str) -> str:
    if not re.match(r"^https?://[^\s#]+$", base):
        raise ValueError(f"--runbook-base: {base!r} is not an http(s) URL without a fragment")
    return base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.rules", description=__doc__.splitlines()[0])
    p.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE, metavar="URL",
                   help="URL of the runbooks document; each alert links to URL#<alert name in lower case> "
                        f"(default: {DEFAULT_RUNBOOK_BASE}).")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="Directory to write the rendered rule files to.")
    p.add_argument("--rules", default=str(RULES_DIR), metavar="DIR",
                   help="Rule files to render (default: %(default)s).")
    args = p.parse_args(argv)
    try:
        base = check_base(args.runbook_base)
        sources = sorted(Path(args.rules).glob("*.yml"))
        if not sources:
            raise ValueError(f"--rules: no *.yml in {args.rules}")
        rendered = {src.name: render(src.read_text(), base, str(src)) for src in sources}
    except (OSError, ValueError) as e:
        print(f"python -m exporter.rules: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (out / name).write_text(text)
    print(f"wrote {len(rendered)} rule files to {out} with runbooks at {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
