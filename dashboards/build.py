"""Render the dashboards to dashboards/<name>.json (the committed files Grafana imports and the
deployment's ConfigMaps carry).

    python -m dashboards.build          # write the JSON files
    python -m dashboards.build --check  # exit 1 if a committed file differs from the code

`dashboards()` is the one entry point for other generators (one ConfigMap per dashboard).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import efa, fleet, fsx, node

OUT = Path(__file__).resolve().parent
# File stem -> builder. Add a dashboard here; add a panel in its module.
BUILDERS: dict[str, Callable[[], db.Dashboard]] = {
    "gpu-health-fleet": fleet.build,
    "gpu-health-node": node.build,
    "gpu-health-efa": efa.build,
    "gpu-health-fsx": fsx.build,
}


def _finish(model: dict) -> dict:
    """What the SDK leaves to us: `id` null (Grafana assigns it) and unique panel ids in order."""
    ids = iter(range(1, 10_000))
    for panel in model.get("panels", []):
        panel["id"] = next(ids)
        for inner in panel.get("panels", []):
            inner["id"] = next(ids)
    return {"id": None, **model}


def dashboards() -> dict[str, dict]:
    """Every dashboard's JSON model, by file stem."""
    return {name: _finish(json.loads(JSONEncoder(sort_keys=True).encode(build().build())))
            for name, build in BUILDERS.items()}


def render(model: dict) -> str:
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, model in dashboards().items():
        path = OUT / f"{name}.json"
        text = render(model)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run python -m dashboards.build): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
