#!/usr/bin/env bash
# Quick start: set up a virtual environment with the exporter and serve a simulated
# p5.48xlarge node (8 H100s, 32 EFA devices, one FSx for Lustre mount) on
# http://localhost:9858/metrics (or where --web.listen-address says). Extra arguments go to the
# exporter, e.g. --scenario gpu-lost.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# Install once (editable: later code changes need no reinstall); again only when pyproject.toml changes.
if [ ! -x .venv/bin/gpu-health-exporter ] || [ pyproject.toml -nt .venv/.quickstart-installed ]; then
  # The build backend pyproject.toml pins ([build-system]): `python -m exporter.tools.release` builds the
  # wheel with this venv's setuptools (no build isolation), and a venv's own may be older.
  .venv/bin/python -m pip install -q 'setuptools>=77'
  .venv/bin/python -m pip install -q -e '.[simulate]'  # the simulated node's kubelet (protobuf)
  touch .venv/.quickstart-installed
fi
# The exporter's first log line gives the address it actually serves (--web.listen-address moves it).
echo "starting a simulated p5.48xlarge; its 'serving http://...' line below is the address (Ctrl-C stops it)" >&2
exec .venv/bin/gpu-health-exporter --simulate p5.48xlarge "$@"
