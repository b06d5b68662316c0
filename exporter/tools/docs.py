"""Generate docs/metrics.md and docs/configuration.md from the catalog and the config schema.

`python -m exporter.tools.docs` rewrites both in a checkout (and refuses to run from an installed
package), `--check` names the stale ones; tests/test_docs.py fails when they drift from the code.
`python -m exporter.tools.generate` regenerates these with every other generated file.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from exporter import collectors, config, migration
from exporter.catalog import MetricSpec, all_specs
from exporter.web import webconfig

DOCS = Path(__file__).resolve().parents[2] / "docs"

OWN_PREFIX = "gpu_health_exporter_"


def _groups() -> list[tuple[str, list[MetricSpec]]]:
    """(heading, specs): the exporter's own metrics (whichever collector reports them) first, then
    each registered collector's under its docs group, then the process metrics."""
    specs = all_specs()
    own = [s for s in specs if s.name.startswith(OWN_PREFIX)]
    out = [("Exporter", own)]
    for name, cls in collectors.collector_classes().items():
        out.append((cls.docs_group, [s for s in specs if s.collector == name and s not in own]))
    out.append(("The exporter's process", [s for s in specs if s.name.startswith("process_")]))
    placed = {s.name for _, group in out for s in group}
    stray = [s.name for s in specs if s.name not in placed]
    if stray:  # a metric of no registered collector: the registry or its collector= is wrong
        raise ValueError(f"metrics of no registered collector: {stray}")
    return out


def _load_everything() -> None:
    import exporter.process  # noqa: F401 - declares the process_* metrics
    import exporter.runner  # noqa: F401 - declares the exporter's own metrics

    collectors.collector_classes()


def metrics_md() -> str:
    _load_everything()
    lines = [
        "# Metrics",
        "",
        "Generated from the metric catalog by `python -m exporter.tools.docs` (in a checkout); do not edit "
        "by hand.",
        "Every series of a GPU metric carries `gpu` (index), `uuid` and `pci_bus_id` unless said otherwise.",
        "\"exported by\" says which detail level exports the metric: `default` (the default config), or "
        "the setting that adds it (docs/configuration.md: `efa.counters`, `gpu.detail`).",
        "",
    ]
    for title, specs in _groups():
        if not specs:
            continue
        lines += [f"## {title}", "", "| name | type | labels | exported by | help |", "|---|---|---|---|---|"]
        for s in specs:
            labels = ", ".join(f"`{lbl}`" for lbl in s.labels) or "none"
            lines.append(f"| `{s.name}` | {s.type} | {labels} | {_cell(s.detail)} | {_cell(s.help)} |")
        lines.append("")
    return "\n".join(lines + _migration())


def _migration() -> list[str]:
    lines = ["## Coming from dcgm-exporter", "", migration.INTRO.strip(), "",
             "| dcgm-exporter field | here | notes |", "|---|---|---|"]
    lines += [f"| {_cell(field)} | {_cell(here)} | {_cell(note)} |" for field, here, note in migration.FIELDS]
    lines += ["", migration.ONLY_HERE.strip(), "", "## `sum()` pitfalls", "",
              "Some label sets overlap: summing across them counts the same error or second twice.", ""]
    lines += [f"- {p.strip()}" for p in migration.PITFALLS]
    return lines + [""]


def configuration_md() -> str:
    _load_everything()
    lines = [
        "# Configuration",
        "",
        "Generated from the config schema by `python -m exporter.tools.docs` (in a checkout); do not edit "
        "by hand.",
        "",
        "The exporter reads one YAML file (`--config FILE`). Every key is optional; the defaults below "
        "apply. Every key is validated at start-up: an unknown key, a wrong type or an impossible value "
        "stops the program (the daemon, `ack` and `capture` with exit status 2; `check` with 3, could not "
        "check, so that no wrapper drains a node for it) with one message listing every error, each with "
        "the file, the key, what was expected and the value (cut to about 60 characters). A relative path "
        "in the file is relative to the file's directory. A YAML syntax error names the file, line and "
        "column. The file must be a regular "
        "file of at most 1 MiB (a FIFO or a directory is refused without blocking), and a document whose "
        "aliases expand to more than 100,000 values is refused before it is built. Command-line flags "
        "override the file. On SIGHUP the file is read again: a valid configuration restarts the process "
        "in place (same pid) with exactly the bytes just validated, whatever their size: the config file, "
        "the web config file and the TLS certificate, key and CA files it names are handed to the "
        "restarted process in an inherited anonymous memory file (memfd, exporter/reload_snapshot.py), so "
        "an edit of any of them landing during the restart neither stops the exporter (exit 2) nor runs "
        "unvalidated; it waits for the next SIGHUP, which reads the files again. An invalid configuration "
        "is logged and the running one kept. An empty file is valid: every default.",
        "",
        "Each collector declares its own section (a typed dataclass on the collector class, found by the "
        "registry in exporter/collectors), so this page lists every collector's keys.",
        "",
        "## Top-level keys",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for k, key in config.TOP.items():
        lines.append(_row(k, key))
    for name, section in sorted(config.sections().items()):
        lines += ["", f"## `{name}`", "", section.doc(), "", "| key | type | default | meaning |",
                  "|---|---|---|---|"]
        for k, key in section.keys().items():
            lines.append(_row(f"{name}.{k}", key))
    lines += ["", "## The web config file (`web.config_file`, `--web.config.file`)", "",
              inspect.cleandoc(webconfig.__doc__.split("\n", 2)[2]), ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(k: str, key: config.Key) -> str:
    default = "unset" if key.default is None else f"`{json.dumps(key.default)}`"
    return f"| `{k}` | {key.describe()} | {default} | {_cell(key.doc)} |"


def expected() -> dict[Path, str]:
    """Each generated file's path and the text it must hold."""
    return {DOCS / "metrics.md": metrics_md(), DOCS / "configuration.md": configuration_md()}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from exporter import share

    p = argparse.ArgumentParser(prog="python -m exporter.tools.docs", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; name each stale file and exit 1 (tests/test_docs.py checks the same)")
    args = p.parse_args(argv)
    if not share.in_checkout():  # installed: DOCS would be site-packages/docs
        print(share.not_in_checkout("python -m exporter.tools.docs"), file=sys.stderr)
        return 2
    want = expected()
    stale = [path for path, text in want.items() if not path.exists() or path.read_text() != text]
    for path in stale:
        rel = path.relative_to(DOCS.parent)
        if args.check:
            print(f"stale: {rel}", file=sys.stderr)
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(want[path])
            print(f"wrote {rel}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
