"""Render a copy of the alert rules (rules/*.yml) for a runbook base URL.

    python -m exporter.rules --runbook-base https://wiki.example.com/gpu/runbooks.html \
        --out /etc/prometheus/rules/gpu-health-exporter

Every alert's `runbook_url` in rules/ is DEFAULT_RUNBOOK_BASE + "#<alert name in lower case>": the
rendered runbooks every release installs there (docs/deploy.md, "Runbook links"). The rendered
copy has the same anchors on the given base. Nothing else changes, so the copy is what `promtool
check rules` and the promtool suites check. `python -m exporter.tools.deploygen --runbook-base URL --out
DIR` moves the same base in every other shipped file too (dashboards, PrometheusRule, systemd unit).
Works from a checkout and from an installed wheel alike (exporter.share).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from exporter import share

# Where every release puts the rendered runbooks (the manual install, the container image and
# `python -m exporter.tools.deploygen --out DIR` as DIR/docs/runbooks.html): a page a user really has.
DEFAULT_RUNBOOK_BASE = "file:///usr/share/doc/gpu-health-exporter/runbooks.html"
RULES_DIR = share.root() / "rules"
_URL = re.compile(r"^([ \t]*runbook_url:[ \t]*)(\S+)#([a-z0-9-]+)[ \t]*$", re.M)


def render(text: str, base: str, source: str = "rules") -> str:
    """`text` (one rule file) with every runbook_url moved from the default base to `base`."""
    def swap(m: re.Match[str]) -> str:
        if m.group(2) != DEFAULT_RUNBOOK_BASE:
            raise ValueError(f"{source}: runbook_url {m.group(2)}#{m.group(3)} does not start with the "
                             f"default base {DEFAULT_RUNBOOK_BASE}")
        return f"{m.group(1)}{base}#{m.group(3)}"
    return _URL.sub(swap, text)


def rebase(text: str, base: str) -> str:
    """Any shipped text (a dashboard, a manifest, the unit) with the default base moved to `base`."""
    return text.replace(DEFAULT_RUNBOOK_BASE, base)


def check_base(base: str) -> str:
    # No quote, backslash, brace or space: the base lands unquoted in YAML, in JSON strings and in
    # Prometheus templates.
    if not re.match(r"^(https?://|file:///)[^\s#\"'\\{}<>]+$", base):
        raise ValueError(f"--runbook-base: {base!r} is not an http(s) or file:/// URL without a fragment, "
                         "quotes or spaces")
    return base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.rules", description=__doc__.splitlines()[0])
    p.add_argument("--runbook-base", default=DEFAULT_RUNBOOK_BASE, metavar="URL",
                   help="URL of the runbooks page; each alert links to URL#<alert name in lower case> "
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
