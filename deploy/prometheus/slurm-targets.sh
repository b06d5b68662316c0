#!/bin/bash
# Write the Slurm cluster's nodes as a Prometheus file_sd target file for scrape.yml, `instance` set to
# the Slurm node name. Run on the Prometheus host from cron or a systemd timer (every few minutes):
#   slurm-targets.sh /etc/prometheus/targets/gpu-health-exporter/slurm.json [PARTITION]
# Writes atomically (Prometheus never reads half a file); the port is GPU_HEALTH_PORT (9858).
set -euo pipefail
out=${1:?usage: slurm-targets.sh OUTPUT.json [PARTITION]}
port=${GPU_HEALTH_PORT:-9858}
args=(-N -h -o '%N %o')
[ -n "${2:-}" ] && args+=(-p "$2")
tmp=$(mktemp "$(dirname "$out")/.slurm-targets.XXXXXX")
trap 'rm -f "$tmp"' EXIT
sinfo ${args[@]+"${args[@]}"} | sort -u | awk -v port="$port" '
  BEGIN { printf "[" }
  NF == 2 { printf "%s\n  {\"targets\": [\"%s:%s\"], \"labels\": {\"instance\": \"%s\"}}", sep, $2, port, $1; sep = "," }
  END { print "\n]" }' >"$tmp"
chmod 0644 "$tmp"
mv "$tmp" "$out"
trap - EXIT
