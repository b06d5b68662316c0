#!/bin/bash
# Smoke test of a built image: the simulated node on a read-only root filesystem with only a tmpfs at
# /tmp writable, as non-root, served on 127.0.0.1; every collector must succeed.
#   deploy/container-smoke.sh <image>      (docker; DOCKER=podman for podman)
set -euo pipefail
image=${1:?usage: container-smoke.sh IMAGE}
docker=${DOCKER:-docker}
port=${PORT:-19858}
id=$("$docker" run -d --rm --read-only --tmpfs /tmp:rw,size=16m --cap-drop ALL \
      --security-opt no-new-privileges -p "127.0.0.1:$port:9858" "$image" --simulate p5.48xlarge)
trap '"$docker" stop "$id" >/dev/null' EXIT
for _ in $(seq 60); do
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 1
done
metrics=$(curl -fsS "http://127.0.0.1:$port/metrics")
failed=$(printf '%s\n' "$metrics" | grep '^gpu_health_exporter_collector_success' | grep -v ' 1.0$' || true)
[ -z "$failed" ] || { echo "collectors failing:"; echo "$failed"; exit 1; }
[ "$("$docker" inspect -f '{{.Config.User}}' "$image")" != "" ] || { echo "image runs as root"; exit 1; }
# The files a release carries: the runbooks every alert links to, and the rest rendered from the wheel.
"$docker" run --rm --read-only --tmpfs /tmp:rw,size=16m --entrypoint sh "$image" -c \
  'test -s /usr/share/doc/gpu-health-exporter/runbooks.html && cd /tmp && python3 -m exporter.tools.deploygen --out r >/dev/null && test -s r/deploy/kubernetes/components/prometheus-operator/prometheusrules.yaml' \
  || { echo "the image lacks the release's files"; exit 1; }
echo "ok: $(printf '%s\n' "$metrics" | grep -c '^[a-z]') samples, every collector succeeded"
